// Decisions between two schedules from measurements taken interleaved:
// blocks of steps under the incumbent (A) and a candidate (B), A B A B...,
// switched between iterations, so that a change in the machine (another
// job on the link, a CPU hog) lands on both. Pure logic: no lock, no store,
// no clock, and a seeded resampler, so the same measurements always give the
// same decision (coordinator/README.md, "Decisions under noise").
//
// The figure compared is the ratio of medians, candidate over incumbent
// (below 1: the candidate is faster), taken in each block pair (an A block
// and the B block next to it) and combined as their geometric mean, with a
// percentile bootstrap interval. A change in the machine between pairs
// scales both blocks of a pair and leaves its ratio; pairs that disagree
// widen the interval instead of deciding it. The bootstrap resamples block
// pairs, then steps within each chosen block.
#ifndef TANDEM_COORDINATOR_SERVICE_PLAN_DECISION_H_
#define TANDEM_COORDINATOR_SERVICE_PLAN_DECISION_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace tandem {

// Why a schedule version exists (its provenance's reason, stored by name).
enum class PlanReason {
  kInitial,        // the first plan, from the warm-up's profile
  kDrift,          // measured steps left the prediction
  kMemory,         // measured peak came near the budget beyond the prediction
  kReoptimize,     // a user asked (Reoptimize)
  kRollback,       // an earlier version's plan again
  kCached,         // an identical earlier job's plan
  kTrial,          // the runner-up, measured against the active plan
  kKept,           // a trial's plan again, after it measured faster
  kMemoryGuard,    // planned from steps under the least-memory fallback
  kBaselineCheck,  // the settled plan again, alternated with the baseline
};

// The provenance pass of a "rollback" version that alternates with the
// active version before it runs on ("rollback-check-of-vK": K, the active
// version it is checked against); a check still the newest version is
// undecided.
inline constexpr char kRollbackCheckPass[] = "rollback-check-of-v";

// The provenance pass of a "drift" version whose plan differs from the
// active version's: it alternates with that version ("drift-check-of-vK":
// K) and runs on only if measured faster, since a re-fitted model can read
// a machine that slowed for every plan as a reason to switch; a check still
// the newest version is undecided.
inline constexpr char kDriftCheckPass[] = "drift-check-of-v";

// The provenance pass of a "trial" version ("trial-of-vK": K, the version
// whose runner-up it is, and which it alternates with).
inline constexpr char kTrialPass[] = "trial-of-v";

// What a version published to alternate with an earlier one is, and so what
// its verdict decides (DecideInterleaved). Each is a version of one reason
// marked by one pass (ComparisonReason, ComparisonPass).
enum class ComparisonKind {
  kTrial,          // the runner-up of the active version's plan
  kRollbackCheck,  // the best plan measured one after the other, against
                   // the active version found behind it
  kDriftCheck,     // a drift re-plan, against the version that drifted
};
inline constexpr ComparisonKind kComparisonKinds[] = {
    ComparisonKind::kTrial, ComparisonKind::kRollbackCheck,
    ComparisonKind::kDriftCheck};
// kTrial, kRollback, kDrift: a version's reason, and the kind of the event
// its verdict is recorded as (PlanReasonName).
PlanReason ComparisonReason(ComparisonKind kind);
// kTrialPass, kRollbackCheckPass, kDriftCheckPass.
absl::string_view ComparisonPass(ComparisonKind kind);
// How a verdict names it: "trial", "rollback check", "drift check".
absl::string_view ComparisonName(ComparisonKind kind);
// A version that is compared: what it is, and the version it alternates
// with.
struct ComparedVersion {
  ComparisonKind kind = ComparisonKind::kTrial;
  int64_t against = -1;
};

// The stored name ("initial", "drift", "memory", "reoptimize", "rollback",
// "cached", "trial", "kept", "memory-guard", "baseline-check").
absl::string_view PlanReasonName(PlanReason reason);
// Nullopt for a name that is none of the above.
std::optional<PlanReason> PlanReasonFromName(absl::string_view name);

// Consecutive steps run under one schedule version, in the order measured.
// The first step of a block paid for the switch into it and is left out.
struct StepBlock {
  int64_t version = 0;
  std::vector<double> step_s;
  // Per step, beside step_s (empty when no rank measured it): the largest
  // share of the step's wall time that any rank's compute thread was
  // runnable but waited for a CPU (IterationProgress.cpu_wait_share). A
  // negative entry: not measured.
  std::vector<double> cpu_wait_share;
};

// What tells a block measured while the host's CPUs were busy with other
// work (another job, a CPU hog) from one measured quietly: its counted
// steps' median cpu_wait_share against the quiet level of the version it
// ran (coordinator/README.md, "A busy host"). The quiet level is the
// host's and the plan's own (what a rank's own threads cost each other:
// about 0.06 on a 2-core host, more for a plan with busier communication
// threads), so it is learned per version from the job's steps: the 10th
// percentile over the version's last kWindow measured steps, taken in
// groups of kGroupSteps consecutive ones (the group's wait over its wall
// time: one step's share is noisy; a 20 ms step reads anything from 0 to
// 0.5 on a quiet host), so a hog must take nine in ten groups to become
// the quiet level. A block is busy above max(kBusyFactor x that level,
// that level + kBusyMargin); on a 2-core host half a core of hog read 0.16
// and 0.9 of one 0.23 against 0.06 quiet (bench/README.md, "A signal for
// the CPU hog").
class HostContention {
 public:
  static constexpr int kWindow = 400;
  static constexpr int kGroupSteps = 3;
  // Steps of a version before it has a quiet level (four groups).
  static constexpr int kMinSteps = 4 * kGroupSteps;
  static constexpr double kBusyFactor = 2.0;
  static constexpr double kBusyMargin = 0.05;

  // A step of `version` of `seconds` measured at `share`; a negative or
  // non-finite share, or a step of no time: not measured, ignored.
  void Record(int64_t version, double share, double seconds);
  // The level above which a block of `version` is busy; infinity while the
  // version has fewer than kMinSteps measured steps (no block is busy).
  double BusyThreshold(int64_t version) const;
  // The thresholds of every version with a quiet level, for CompareOptions.
  std::map<int64_t, double> Thresholds() const;

 private:
  // Per version, its last kWindow measured steps: (share, seconds).
  std::map<int64_t, std::deque<std::pair<double, double>>> recent_;
};

inline constexpr double kMinJudgedBlockSeconds = 0.5;

struct CompareOptions {
  // The smallest speedup worth a switch (optimize.min_gain).
  double min_gain = 0.03;
  // Of the interval.
  double confidence = 0.95;
  int resamples = 2000;
  uint64_t seed = 1;
  // Block pairs needed before any verdict, and after which an undecided
  // comparison is inconclusive.
  int min_pairs = 2;
  int max_pairs = 6;
  // An undecided comparison whose ratio already clears min_gain in the
  // candidate's favour (its interval still reaching 1 - min_gain or above)
  // measures on to this many pairs before it is inconclusive: giving up at
  // max_pairs there keeps the incumbent when the candidate is likely the
  // faster (bench/README.md, "noise": two trials 3.9% and 5.7% faster by a
  // quiet re-measure were given up undecided after 6 pairs). A ratio
  // short of min_gain, or against the candidate, stops at max_pairs: the
  // incumbent it keeps is no worse than min_gain.
  int promising_max_pairs = 12;
  // Steps a block needs (after its first) to count.
  int min_block_steps = 2;
  // Per version, the cpu_wait_share above which its blocks ran on a busy
  // host (HostContention::Thresholds): a pair with such a block is left
  // out of the ratio. A version without one has no busy block.
  std::map<int64_t, double> busy_wait_share;
  // Pairs left out as busy after which a comparison still undecided is
  // inconclusive: under a steady hog it would otherwise alternate on.
  int max_busy_pairs = 6;
  // The least time a block's counted steps took for it to be judged busy:
  // a shorter block's share is mostly the scheduler's granularity (on this
  // host the demo's 20 ms steps read 0.00-0.55 with nothing else
  // running), and is never judged. The e2e and noise-bench models' blocks
  // take 0.5-1.2 s.
  double min_judged_s = kMinJudgedBlockSeconds;
};

// Candidate over incumbent: the geometric mean over block pairs of each
// pair's ratio of medians, and its interval.
struct RatioInterval {
  double ratio = 0;
  double low = 0;
  double high = 0;
  int incumbent_steps = 0;
  int candidate_steps = 0;
  // Block pairs the interval resampled.
  int pairs = 0;
  // Block pairs left out because a block of theirs ran on a busy host
  // (CompareOptions::busy_wait_share), and their counted steps.
  int busy_pairs = 0;
  int busy_steps = 0;
  // The bootstrap's interval alone, relative to the ratio as width() is,
  // and the sample standard deviation of the pairs' log ratios (0 with one
  // pair), from which Student's t widened it.
  double bootstrap_width = 0;
  double log_sd = 0;
  double width() const { return ratio > 0 ? (high - low) / ratio : 0; }
};

// Pairs each block of one version with the next block of the other (blocks
// of other versions, and blocks too short to count, are skipped), leaves
// out the pairs with a busy block, and bootstraps the ratio: pairs with
// replacement, then each chosen pair's steps. From two pairs on, the
// interval is the wider of that and Student's t over the pairs' log
// ratios, which a handful of pairs needs. Nullopt without a pair counted.
// BusyPairs: the pairs left out (and their counted steps), also when none
// is counted.
std::optional<RatioInterval> InterleavedRatio(
    const std::vector<StepBlock>& blocks, int64_t incumbent, int64_t candidate,
    const CompareOptions& options);

// The `p` quantile of Student's t with `df` degrees of freedom (p in
// [0.5, 0.9995]; infinity for df < 1).
double StudentTQuantile(double p, int df);

struct BusyCount {
  int pairs = 0;
  int steps = 0;
};
BusyCount BusyPairs(const std::vector<StepBlock>& blocks, int64_t incumbent,
                    int64_t candidate, const CompareOptions& options);
// The same from InterleavedRatio's answer for these blocks when it counted
// a pair (its busy counts), pairing the blocks again only when it did not.
BusyCount BusyPairs(const std::optional<RatioInterval>& counted,
                    const std::vector<StepBlock>& blocks, int64_t incumbent,
                    int64_t candidate, const CompareOptions& options);

enum class Verdict {
  kMeasureMore,      // fewer than min_pairs pairs counted, or undecided so
                     // far
  kCandidateFaster,  // interval below 1, ratio at least min_gain below 1
  kCandidateSlower,  // interval above 1
  kEquivalent,       // interval inside 1 ± min_gain: not worth a switch
  kInconclusive,     // max_pairs pairs (promising_max_pairs for a candidate
                     // whose ratio clears min_gain), or max_busy_pairs
                     // left out as busy, and still none of the above
};
absl::string_view VerdictName(Verdict verdict);

struct ComparisonDecision {
  Verdict verdict = Verdict::kMeasureMore;
  std::optional<RatioInterval> interval;
  // The pairs left out as busy (also when none was counted).
  BusyCount busy;
  // Whether the candidate runs on: only when it measured faster. Every
  // other verdict that ends the comparison keeps the incumbent.
  bool keep_candidate() const { return verdict == Verdict::kCandidateFaster; }
  bool done() const { return verdict != Verdict::kMeasureMore; }
};
ComparisonDecision DecideInterleaved(const std::vector<StepBlock>& blocks,
                                     int64_t incumbent, int64_t candidate,
                                     const CompareOptions& options);

// Steps to wait before the next trial, after `inconclusive` trials in a row
// ended without a decision: `base` doubled each time, at most 16 × base.
int64_t TrialBackoffSteps(int64_t base, int inconclusive);

// What a plan bought over the baseline, for status, watch, the report and
// the demo: "1.27x (1.21-1.33) faster than the baseline (v0: <basis>),
// measured interleaved over 40 steps", or "not measured yet (...)" while
// there is no interval or it is wider than `max_width` of the figure.
// `interval` is plan over baseline, as InterleavedRatio gives it with the
// baseline as the incumbent.
struct Speedup {
  double factor = 0;  // baseline time over plan time; 0: not measured yet
  double low = 0;
  double high = 0;
  int steps = 0;
  // Counted steps of pairs left out because the host was busy (the text
  // says how many).
  int busy_steps = 0;
  std::string text;
  bool measured() const { return factor > 0; }
};
// The widest interval a figure is given with, relative to it: 20% (e.g.
// 1.24x (1.12-1.37)); wider says "not measured yet". On this shared 2-core
// machine the demo's 6-7 pairs span 22-53% under Student's t
// (bench/README.md, "noise", run 2026-11-30g).
inline constexpr double kMaxSpeedupWidth = 0.20;
// `busy`: the pairs left out as busy when `interval` is nullopt (with an
// interval, its own busy_pairs and busy_steps).
Speedup DescribeSpeedup(const std::optional<RatioInterval>& interval,
                        absl::string_view basis,
                        double max_width = kMaxSpeedupWidth,
                        BusyCount busy = {});

// How many block pairs a baseline check needs for an interval no wider than
// `max_width` (DescribeSpeedup) under the noise measured on this machine:
// `series` are the step times of the versions it alternates (each oldest
// first, its switch step left out), each cut into blocks as a check counts
// them (`block_steps`, each block's first left out). The log ratio of
// neighbouring blocks' medians within a series spreads as a pair's ratio
// does here (two blocks, each as noisy); its spread is taken robustly
// (1.4826 x the median absolute log ratio: a lone spike does not count),
// and the interval of the geometric mean over n pairs spans 2 t(n-1) /
// sqrt(n) of it (InterleavedRatio's Student's t). kPairsNoiseMargin allows for
// the bootstrap resampling the steps within blocks too. At least `min_pairs`
// (the job's optimize.baseline_pairs; also when the series give fewer than two
// ratios) and two, at most `max_pairs`.
inline constexpr double kPairsNoiseMargin = 1.25;
int NoisePairs(const std::vector<std::vector<double>>& series, int block_steps,
               int min_pairs, int max_pairs,
               double max_width = kMaxSpeedupWidth);

// The block pairs a baseline check measures on for when its `measured`
// interval came out wider than `max_width` (RatioInterval::width), for the
// pooled interval to come within `max_width`: the fewest pairs in all at
// which both its parts fit, with kPairsNoiseMargin to spare. The
// bootstrap's part narrows as 1/sqrt(pairs); Student's t's spans
// 2 sinh(t(m-1) x log_sd / sqrt(m)) at m pairs, its quantile falling as
// the pairs grow (two pairs that agree within a few percent need only two
// more, though t(1) made their interval several times too wide). At most
// `max_pairs` in all. 0 when the width is within `max_width` already, or
// the pairs are `max_pairs` or more.
int MorePairsForWidth(const RatioInterval& measured, int max_pairs,
                      double max_width = kMaxSpeedupWidth);

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_SERVICE_PLAN_DECISION_H_
