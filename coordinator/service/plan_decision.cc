#include "coordinator/service/plan_decision.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_format.h"

namespace tandem {
namespace {

constexpr std::array<std::pair<PlanReason, absl::string_view>, 10> kReasons = {{
    {PlanReason::kInitial, "initial"},
    {PlanReason::kDrift, "drift"},
    {PlanReason::kMemory, "memory"},
    {PlanReason::kReoptimize, "reoptimize"},
    {PlanReason::kRollback, "rollback"},
    {PlanReason::kCached, "cached"},
    {PlanReason::kTrial, "trial"},
    {PlanReason::kKept, "kept"},
    {PlanReason::kMemoryGuard, "memory-guard"},
    {PlanReason::kBaselineCheck, "baseline-check"},
}};

constexpr double kPi = 3.14159265358979323846;

// The median of `v` (reordered).
double Median(std::vector<double>& v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double upper = v[mid];
  return (*std::max_element(v.begin(), v.begin() + mid) + upper) / 2;
}

// A block's counted steps: all but the first (it paid for the switch), and
// only finite, positive times.
std::vector<double> Counted(const StepBlock& block) {
  std::vector<double> out;
  for (size_t i = 1; i < block.step_s.size(); ++i) {
    const double s = block.step_s[i];
    if (s > 0 && std::isfinite(s)) out.push_back(s);
  }
  return out;
}

// The density of Student's t with `df` degrees of freedom, integrated from 0
// to `t` (Simpson's rule; the density is smooth and `t` bounded).
double StudentTMassFromZero(double t, int df) {
  const double nu = df;
  const double norm =
      std::exp(std::lgamma((nu + 1) / 2) - std::lgamma(nu / 2)) /
      std::sqrt(nu * kPi);
  auto density = [&](double x) {
    return norm * std::pow(1 + x * x / nu, -(nu + 1) / 2);
  };
  // Even. The density is smooth on [0, 16]: 200 intervals put the
  // quantiles within 1e-4 of the tables (StudentTQuantile_MatchesTheTables)
  // at a cost the comparisons, recomputed as each block closes, do not feel.
  constexpr int kIntervals = 200;
  const double h = t / kIntervals;
  double sum = density(0) + density(t);
  for (int i = 1; i < kIntervals; ++i) {
    sum += (i % 2 == 1 ? 4 : 2) * density(i * h);
  }
  return sum * h / 3;
}

struct Pair {
  std::vector<double> incumbent;
  std::vector<double> candidate;
  // A block of the pair ran on a busy host (BlockBusy).
  bool busy = false;
};

// The median of a block's measured cpu_wait_share over its counted steps
// (all but the first); negative when none was measured.
double BlockWaitShare(const StepBlock& block) {
  if (block.step_s.size() < 2) return -1;
  std::vector<double> shares;
  for (size_t i = 1; i < block.cpu_wait_share.size() && i < block.step_s.size();
       ++i) {
    const double w = block.cpu_wait_share[i];
    if (w >= 0 && std::isfinite(w)) shares.push_back(w);
  }
  // Half the counted steps or more unmeasured: the block is not judged.
  if (shares.empty() || 2 * shares.size() < block.step_s.size() - 1) return -1;
  return Median(shares);
}

bool BlockBusy(const StepBlock& block, const CompareOptions& options) {
  auto it = options.busy_wait_share.find(block.version);
  if (it == options.busy_wait_share.end()) return false;
  double counted_s = 0;
  for (size_t i = 1; i < block.step_s.size(); ++i) {
    if (block.step_s[i] > 0 && std::isfinite(block.step_s[i])) {
      counted_s += block.step_s[i];
    }
  }
  if (counted_s < options.min_judged_s) return false;
  const double share = BlockWaitShare(block);
  return share >= 0 && share > it->second;
}

// Each block of one version with the next block of the other, in order.
std::vector<Pair> PairUp(const std::vector<StepBlock>& blocks,
                         int64_t incumbent, int64_t candidate,
                         const CompareOptions& options) {
  std::vector<Pair> pairs;
  struct Pending {
    int64_t version;
    std::vector<double> steps;
    bool busy;
  };
  std::optional<Pending> pending;
  for (const StepBlock& b : blocks) {
    if (b.version != incumbent && b.version != candidate) continue;
    std::vector<double> steps = Counted(b);
    if (static_cast<int>(steps.size()) < std::max(options.min_block_steps, 1)) {
      continue;
    }
    const bool busy = BlockBusy(b, options);
    if (pending.has_value() && pending->version != b.version) {
      Pair p;
      if (b.version == candidate) {
        p.incumbent = std::move(pending->steps);
        p.candidate = std::move(steps);
      } else {
        p.incumbent = std::move(steps);
        p.candidate = std::move(pending->steps);
      }
      p.busy = busy || pending->busy;
      pairs.push_back(std::move(p));
      pending.reset();
    } else {
      pending.emplace(Pending{b.version, std::move(steps), busy});  // newer
    }
  }
  return pairs;
}

}  // namespace

absl::string_view PlanReasonName(PlanReason reason) {
  for (const auto& [r, name] : kReasons) {
    if (r == reason) return name;
  }
  return "unknown";
}

std::optional<PlanReason> PlanReasonFromName(absl::string_view name) {
  for (const auto& [r, n] : kReasons) {
    if (n == name) return r;
  }
  return std::nullopt;
}

absl::string_view VerdictName(Verdict verdict) {
  switch (verdict) {
    case Verdict::kMeasureMore:
      return "measure-more";
    case Verdict::kCandidateFaster:
      return "faster";
    case Verdict::kCandidateSlower:
      return "slower";
    case Verdict::kEquivalent:
      return "equivalent";
    case Verdict::kInconclusive:
      return "inconclusive";
  }
  return "unknown";
}

double StudentTQuantile(double p, int df) {
  p = std::clamp(p, 0.5, 0.9995);
  if (df <= 0) return std::numeric_limits<double>::infinity();
  if (p == 0.5) return 0;  // the median of a symmetric distribution
  // Closed forms where the tails are heaviest.
  if (df == 1) return std::tan(kPi * (p - 0.5));
  if (df == 2) return (2 * p - 1) / std::sqrt(2 * p * (1 - p));
  // Bisection on the distribution function; at df >= 3 and p <= 0.9995 the
  // quantile is below 13.
  double lo = 0;
  double hi = 16;
  for (int i = 0; i < 30; ++i) {  // to 16 / 2^30
    const double mid = (lo + hi) / 2;
    (0.5 + StudentTMassFromZero(mid, df) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

std::optional<RatioInterval> InterleavedRatio(
    const std::vector<StepBlock>& blocks, int64_t incumbent, int64_t candidate,
    const CompareOptions& options) {
  std::vector<Pair> pairs;
  RatioInterval out;
  for (Pair& p : PairUp(blocks, incumbent, candidate, options)) {
    if (p.busy) {
      ++out.busy_pairs;
      out.busy_steps +=
          static_cast<int>(p.incumbent.size() + p.candidate.size());
    } else {
      pairs.push_back(std::move(p));
    }
  }
  if (pairs.empty()) return std::nullopt;
  out.pairs = static_cast<int>(pairs.size());
  // Each pair's ratio of medians, and their geometric mean: a pair's two
  // blocks ran on the same machine, so a change between pairs scales both
  // and leaves its ratio; pooling every step instead would weigh a slow
  // pair's steps against a fast pair's whenever the two versions' step
  // counts differ (a block still running).
  auto geometric_mean = [](const std::vector<double>& logs) {
    double sum = 0;
    for (const double l : logs) sum += l;
    return std::exp(sum / static_cast<double>(logs.size()));
  };
  std::vector<double> logs;
  for (const Pair& p : pairs) {
    out.incumbent_steps += static_cast<int>(p.incumbent.size());
    out.candidate_steps += static_cast<int>(p.candidate.size());
    std::vector<double> candidate_s = p.candidate;
    std::vector<double> incumbent_s = p.incumbent;
    logs.push_back(std::log(Median(candidate_s) / Median(incumbent_s)));
  }
  out.ratio = geometric_mean(logs);
  const std::vector<double> pair_logs = logs;

  // Two levels: pairs with replacement, then each chosen pair's steps with
  // replacement (a block of k steps gives k draws).
  std::mt19937_64 rng(options.seed);
  auto draw = [&rng](size_t n) {
    return std::uniform_int_distribution<size_t>(0, n - 1)(rng);
  };
  const int resamples = std::max(options.resamples, 1);
  std::vector<double> ratios;
  ratios.reserve(resamples);
  std::vector<double> a;
  std::vector<double> b;
  for (int r = 0; r < resamples; ++r) {
    logs.clear();
    for (size_t i = 0; i < pairs.size(); ++i) {
      const Pair& p = pairs[draw(pairs.size())];
      a.clear();
      b.clear();
      for (size_t k = 0; k < p.incumbent.size(); ++k) {
        a.push_back(p.incumbent[draw(p.incumbent.size())]);
      }
      for (size_t k = 0; k < p.candidate.size(); ++k) {
        b.push_back(p.candidate[draw(p.candidate.size())]);
      }
      logs.push_back(std::log(Median(b) / Median(a)));
    }
    ratios.push_back(geometric_mean(logs));
  }
  std::sort(ratios.begin(), ratios.end());
  const double tail = std::clamp((1 - options.confidence) / 2, 0.0, 0.5);
  auto at = [&ratios](double q) {
    const size_t i = static_cast<size_t>(
        std::floor(q * static_cast<double>(ratios.size() - 1) + 0.5));
    return ratios[std::min(i, ratios.size() - 1)];
  };
  out.low = std::min(at(tail), out.ratio);
  out.high = std::max(at(1 - tail), out.ratio);
  out.bootstrap_width = out.width();

  // With few pairs the bootstrap knows only the pairs it has, and draws
  // them again: four pairs give it few distinct resamples, and it reads
  // the spread between pairs too small. Student's t over the pairs' log
  // ratios widens by as much as that spread is uncertain; the interval is
  // the wider of the two (bench/README.md, "noise": 3 of 16 four-pair
  // intervals missed the quiet re-measure with the bootstrap alone).
  if (pair_logs.size() >= 2) {
    const double n = static_cast<double>(pair_logs.size());
    double mean = 0;
    for (const double l : pair_logs) mean += l;
    mean /= n;
    double squares = 0;
    for (const double l : pair_logs) squares += (l - mean) * (l - mean);
    out.log_sd = std::sqrt(squares / (n - 1));
    const double half = StudentTQuantile(1 - tail, static_cast<int>(n) - 1) *
                        out.log_sd / std::sqrt(n);
    out.low = std::min(out.low, std::exp(mean - half));
    out.high = std::max(out.high, std::exp(mean + half));
  }
  return out;
}

PlanReason ComparisonReason(ComparisonKind kind) {
  switch (kind) {
    case ComparisonKind::kTrial:
      return PlanReason::kTrial;
    case ComparisonKind::kRollbackCheck:
      return PlanReason::kRollback;
    case ComparisonKind::kDriftCheck:
      return PlanReason::kDrift;
  }
  return PlanReason::kTrial;
}

absl::string_view ComparisonPass(ComparisonKind kind) {
  switch (kind) {
    case ComparisonKind::kTrial:
      return kTrialPass;
    case ComparisonKind::kRollbackCheck:
      return kRollbackCheckPass;
    case ComparisonKind::kDriftCheck:
      return kDriftCheckPass;
  }
  return kTrialPass;
}

absl::string_view ComparisonName(ComparisonKind kind) {
  switch (kind) {
    case ComparisonKind::kTrial:
      return "trial";
    case ComparisonKind::kRollbackCheck:
      return "rollback check";
    case ComparisonKind::kDriftCheck:
      return "drift check";
  }
  return "trial";
}

BusyCount BusyPairs(const std::vector<StepBlock>& blocks, int64_t incumbent,
                    int64_t candidate, const CompareOptions& options) {
  BusyCount out;
  for (const Pair& p : PairUp(blocks, incumbent, candidate, options)) {
    if (!p.busy) continue;
    ++out.pairs;
    out.steps += static_cast<int>(p.incumbent.size() + p.candidate.size());
  }
  return out;
}

BusyCount BusyPairs(const std::optional<RatioInterval>& counted,
                    const std::vector<StepBlock>& blocks, int64_t incumbent,
                    int64_t candidate, const CompareOptions& options) {
  if (counted.has_value()) return {counted->busy_pairs, counted->busy_steps};
  return BusyPairs(blocks, incumbent, candidate, options);
}

ComparisonDecision DecideInterleaved(const std::vector<StepBlock>& blocks,
                                     int64_t incumbent, int64_t candidate,
                                     const CompareOptions& options) {
  ComparisonDecision d;
  d.interval = InterleavedRatio(blocks, incumbent, candidate, options);
  d.busy = BusyPairs(d.interval, blocks, incumbent, candidate, options);
  // Under a busy host the pairs left out run up while none is counted: a
  // steady hog ends the comparison undecided, keeping the incumbent,
  // rather than deciding on what the hog favours.
  const bool busy_enough = d.busy.pairs >= std::max(options.max_busy_pairs, 1);
  if (!d.interval.has_value() || d.interval->pairs < options.min_pairs) {
    if (busy_enough) d.verdict = Verdict::kInconclusive;
    return d;
  }
  const RatioInterval& r = *d.interval;
  const double gain = std::max(options.min_gain, 0.0);
  if (r.high < 1 && r.ratio <= 1 - gain) {
    d.verdict = Verdict::kCandidateFaster;
  } else if (r.low > 1) {
    d.verdict = Verdict::kCandidateSlower;
  } else if (r.low >= 1 - gain && r.high <= 1 + gain) {
    d.verdict = Verdict::kEquivalent;
  } else if (busy_enough ||
             r.pairs >=
                 std::max(options.max_pairs, r.ratio <= 1 - gain
                                                 ? options.promising_max_pairs
                                                 : options.max_pairs)) {
    d.verdict = Verdict::kInconclusive;
  }
  return d;
}

int64_t TrialBackoffSteps(int64_t base, int inconclusive) {
  const int doublings = std::clamp(inconclusive, 0, 4);
  return std::max<int64_t>(base, 1) << doublings;
}

Speedup DescribeSpeedup(const std::optional<RatioInterval>& interval,
                        absl::string_view basis, double max_width,
                        BusyCount busy) {
  Speedup s;
  if (interval.has_value()) {
    busy = {interval->busy_pairs, interval->busy_steps};
  }
  s.busy_steps = busy.steps;
  // What the figure leaves out, said with it.
  const std::string left_out =
      busy.pairs > 0
          ? absl::StrFormat(
                "; %d steps in %d block %s left out: the host's CPUs were "
                "busy with other work",
                busy.steps, busy.pairs, busy.pairs == 1 ? "pair" : "pairs")
          : std::string();
  if (!interval.has_value() || interval->ratio <= 0 || interval->low <= 0) {
    s.text = absl::StrFormat(
        "not measured yet (no interleaved blocks of the baseline (v0: %s) "
        "and this plan%s)",
        basis, left_out);
    return s;
  }
  const RatioInterval& r = *interval;
  s.steps = r.incumbent_steps + r.candidate_steps;
  if (r.pairs < 2) {
    s.text = absl::StrFormat(
        "not measured yet (%d steps interleaved with the baseline (v0: %s) "
        "in one block pair; two are needed%s)",
        s.steps, basis, left_out);
    return s;
  }
  if (r.width() > max_width) {
    s.text = absl::StrFormat(
        "not measured yet (%d steps interleaved with the baseline (v0: %s) "
        "in %d block pairs: %.2f\u2013%.2f\u00d7, wider than %.0f%%%s)",
        s.steps, basis, r.pairs, 1 / r.high, 1 / r.low, 100 * max_width,
        left_out);
    return s;
  }
  s.factor = 1 / r.ratio;
  s.low = 1 / r.high;
  s.high = 1 / r.low;
  s.text = absl::StrFormat(
      "%.2f\u00d7 (%.2f\u2013%.2f) %s than the baseline (v0: %s), measured "
      "interleaved over %d steps%s",
      s.factor, s.low, s.high, s.factor >= 1 ? "faster" : "slower", basis,
      s.steps,
      busy.pairs > 0 ? absl::StrFormat(" (%d more left out: the host's CPUs "
                                       "were busy with other work)",
                                       busy.steps)
                     : std::string());
  return s;
}

void HostContention::Record(int64_t version, double share, double seconds) {
  if (!(share >= 0) || !std::isfinite(share) || !(seconds > 0) ||
      !std::isfinite(seconds)) {
    return;
  }
  std::deque<std::pair<double, double>>& recent = recent_[version];
  recent.emplace_back(share, seconds);
  if (recent.size() > static_cast<size_t>(kWindow)) recent.pop_front();
}

double HostContention::BusyThreshold(int64_t version) const {
  auto it = recent_.find(version);
  if (it == recent_.end() ||
      it->second.size() < static_cast<size_t>(kMinSteps)) {
    return std::numeric_limits<double>::infinity();
  }
  // Each group's wait over its wall time, in groups of kGroupSteps.
  std::vector<double> groups;
  const std::deque<std::pair<double, double>>& recent = it->second;
  for (size_t i = 0; i + kGroupSteps <= recent.size(); i += kGroupSteps) {
    double wait = 0;
    double wall = 0;
    for (size_t j = i; j < i + kGroupSteps; ++j) {
      wait += recent[j].first * recent[j].second;
      wall += recent[j].second;
    }
    groups.push_back(wait / wall);
  }
  const size_t k = groups.size() / 10;
  std::nth_element(groups.begin(), groups.begin() + k, groups.end());
  const double quiet = groups[k];
  return std::max(kBusyFactor * quiet, quiet + kBusyMargin);
}

std::map<int64_t, double> HostContention::Thresholds() const {
  std::map<int64_t, double> out;
  for (const auto& [version, recent] : recent_) {
    const double t = BusyThreshold(version);
    if (std::isfinite(t)) out[version] = t;
  }
  return out;
}

int NoisePairs(const std::vector<std::vector<double>>& series, int block_steps,
               int min_pairs, int max_pairs, double max_width) {
  const size_t counted = static_cast<size_t>(std::max(1, block_steps - 1));
  std::vector<double> spreads;  // |log ratio| of neighbouring blocks
  for (const std::vector<double>& steps : series) {
    double last = 0;
    bool has_last = false;
    for (size_t i = 0; i + counted <= steps.size(); i += counted) {
      std::vector<double> block(steps.begin() + i, steps.begin() + i + counted);
      const double m = Median(block);
      if (!(m > 0) || !std::isfinite(m)) {
        has_last = false;
        continue;
      }
      if (has_last) spreads.push_back(std::abs(std::log(m) - last));
      last = std::log(m);
      has_last = true;
    }
  }
  if (spreads.size() < 2 || !(max_width > 0)) return min_pairs;
  const double spread = 1.4826 * Median(spreads);
  // A 95% interval over n pairs spans about 2 t(n-1) standard errors of
  // the mean log ratio (InterleavedRatio); relative to the figure, that is
  // its width. The fewest pairs whose width fits.
  const int least = std::max(min_pairs, 2);  // t needs two
  const int most = std::max(least, max_pairs);
  for (int n = least; n < most; ++n) {
    const double width = 2 * StudentTQuantile(0.975, n - 1) * spread *
                         kPairsNoiseMargin / std::sqrt(static_cast<double>(n));
    if (width <= max_width) return n;
  }
  return most;
}

int MorePairsForWidth(const RatioInterval& measured, int max_pairs,
                      double max_width) {
  const int n = measured.pairs;
  if (n <= 0 || !(measured.width() > max_width) || !(max_width > 0) ||
      n >= max_pairs) {
    return 0;
  }
  for (int m = n + 1; m <= max_pairs; ++m) {
    const double bootstrap =
        measured.bootstrap_width * std::sqrt(static_cast<double>(n) / m);
    const double t = 2 * std::sinh(StudentTQuantile(0.975, m - 1) *
                                   measured.log_sd / std::sqrt(m * 1.0));
    if (std::max(bootstrap, t) * kPairsNoiseMargin <= max_width) {
      return m - n;
    }
  }
  return max_pairs - n;
}

}  // namespace tandem
