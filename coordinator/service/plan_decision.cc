#include "coordinator/service/plan_decision.h"

#include <algorithm>
#include <array>
#include <cmath>
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

struct Pair {
  std::vector<double> incumbent;
  std::vector<double> candidate;
};

// Each block of one version with the next block of the other, in order.
std::vector<Pair> PairUp(const std::vector<StepBlock>& blocks,
                         int64_t incumbent, int64_t candidate,
                         int min_block_steps) {
  std::vector<Pair> pairs;
  std::optional<std::pair<int64_t, std::vector<double>>> pending;
  for (const StepBlock& b : blocks) {
    if (b.version != incumbent && b.version != candidate) continue;
    std::vector<double> steps = Counted(b);
    if (static_cast<int>(steps.size()) < std::max(min_block_steps, 1)) {
      continue;
    }
    if (pending.has_value() && pending->first != b.version) {
      Pair p;
      if (b.version == candidate) {
        p.incumbent = std::move(pending->second);
        p.candidate = std::move(steps);
      } else {
        p.incumbent = std::move(steps);
        p.candidate = std::move(pending->second);
      }
      pairs.push_back(std::move(p));
      pending.reset();
    } else {
      pending.emplace(b.version, std::move(steps));  // the newer block
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

std::optional<RatioInterval> InterleavedRatio(
    const std::vector<StepBlock>& blocks, int64_t incumbent, int64_t candidate,
    const CompareOptions& options) {
  const std::vector<Pair> pairs =
      PairUp(blocks, incumbent, candidate, options.min_block_steps);
  if (pairs.empty()) return std::nullopt;
  RatioInterval out;
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

ComparisonDecision DecideInterleaved(const std::vector<StepBlock>& blocks,
                                     int64_t incumbent, int64_t candidate,
                                     const CompareOptions& options) {
  ComparisonDecision d;
  d.interval = InterleavedRatio(blocks, incumbent, candidate, options);
  if (!d.interval.has_value() || d.interval->pairs < options.min_pairs) {
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
  } else if (r.pairs >=
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
                        absl::string_view basis, double max_width) {
  Speedup s;
  if (!interval.has_value() || interval->ratio <= 0 || interval->low <= 0) {
    s.text = absl::StrFormat(
        "not measured yet (no interleaved blocks of the baseline (v0: %s) "
        "and this plan)",
        basis);
    return s;
  }
  const RatioInterval& r = *interval;
  s.steps = r.incumbent_steps + r.candidate_steps;
  if (r.pairs < 2) {
    s.text = absl::StrFormat(
        "not measured yet (%d steps interleaved with the baseline (v0: %s) "
        "in one block pair; two are needed)",
        s.steps, basis);
    return s;
  }
  if (r.width() > max_width) {
    s.text = absl::StrFormat(
        "not measured yet (%d steps interleaved with the baseline (v0: %s) "
        "in %d block pairs: %.2f\u2013%.2f\u00d7, wider than %.0f%%)",
        s.steps, basis, r.pairs, 1 / r.high, 1 / r.low, 100 * max_width);
    return s;
  }
  s.factor = 1 / r.ratio;
  s.low = 1 / r.high;
  s.high = 1 / r.low;
  s.text = absl::StrFormat(
      "%.2f\u00d7 (%.2f\u2013%.2f) %s than the baseline (v0: %s), measured "
      "interleaved over %d steps",
      s.factor, s.low, s.high, s.factor >= 1 ? "faster" : "slower", basis,
      s.steps);
  return s;
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
  // A 95% interval spans about 2 x 1.96 standard errors of the mean log
  // ratio over the pairs; relative to the figure, that is its width.
  const double needed =
      std::ceil(std::pow(2 * 1.96 * spread * kPairsNoiseMargin / max_width, 2));
  return static_cast<int>(std::clamp<double>(needed, std::max(min_pairs, 0),
                                             std::max(min_pairs, max_pairs)));
}

int MorePairsForWidth(int pairs, double width, int max_pairs,
                      double max_width) {
  if (pairs <= 0 || !(width > max_width) || !(max_width > 0) ||
      pairs >= max_pairs) {
    return 0;
  }
  const double scale = width * kPairsNoiseMargin / max_width;
  const double all =
      std::min<double>(std::ceil(pairs * scale * scale), max_pairs);
  return std::max(0, static_cast<int>(all) - pairs);
}

}  // namespace tandem
