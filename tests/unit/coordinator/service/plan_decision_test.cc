#include "coordinator/service/plan_decision.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// A block of `n` counted steps around `mean_s`, spread by `spread` (relative,
// the same fixed zig-zag in every block, so tables stay exact), after a
// first step that paid for the switch (`first_s`, left out).
StepBlock Block(int64_t version, double mean_s, double spread = 0.01, int n = 5,
                double first_s = 0) {
  StepBlock b;
  b.version = version;
  b.step_s.push_back(first_s > 0 ? first_s : mean_s);
  for (int i = 0; i < n; ++i) {
    const double wiggle = std::sin(1.7 * i + 0.3);
    b.step_s.push_back(mean_s * (1 + spread * wiggle));
  }
  return b;
}

// A B A B ... for `pairs` pairs, the machine's speed `machine[i]` scaling
// pair i's both blocks (1: as measured alone).
std::vector<StepBlock> Interleaved(double a_s, double b_s, int pairs,
                                   double spread = 0.01,
                                   std::vector<double> machine = {}) {
  std::vector<StepBlock> blocks;
  for (int i = 0; i < pairs; ++i) {
    const double m = i < static_cast<int>(machine.size()) ? machine[i] : 1.0;
    blocks.push_back(Block(1, a_s * m, spread));
    blocks.push_back(Block(2, b_s * m, spread));
  }
  return blocks;
}

struct Case {
  std::string name;
  std::vector<StepBlock> blocks;
  Verdict want;
};

TEST(PlanDecisionTest, Table_MeasurementsToVerdicts) {
  const std::vector<Case> cases = {
      {"clearly faster", Interleaved(1.0, 0.85, 3), Verdict::kCandidateFaster},
      {"clearly slower", Interleaved(1.0, 1.15, 3), Verdict::kCandidateSlower},
      {"the same plan, quiet", Interleaved(1.0, 1.0, 3, 0.005),
       Verdict::kEquivalent},
      {"faster by less than min_gain, quiet", Interleaved(1.0, 0.99, 3, 0.003),
       Verdict::kEquivalent},
      {"one pair only", Interleaved(1.0, 0.5, 1), Verdict::kMeasureMore},
      {"2% faster under 20% noise, still measuring",
       Interleaved(1.0, 0.98, 3, 0.2), Verdict::kMeasureMore},
      {"2% faster under 20% noise, out of pairs",
       Interleaved(1.0, 0.98, 6, 0.2), Verdict::kInconclusive},
      // A hog arrives at the third pair and doubles every step: both plans
      // pay, and the ratio holds.
      {"the machine slows mid-comparison",
       Interleaved(1.0, 0.85, 4, 0.01, {1, 1, 2, 2}),
       Verdict::kCandidateFaster},
      // The machine moves between pairs as much as the plans differ: the
      // pairs disagree and nothing is decided from it.
      {"pairs that disagree",
       {Block(1, 1.0), Block(2, 0.80), Block(1, 1.0), Block(2, 1.25)},
       Verdict::kMeasureMore},
  };
  CompareOptions options;  // min_gain 3%, 95%, 2..6 pairs
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const ComparisonDecision d = DecideInterleaved(c.blocks, 1, 2, options);
    EXPECT_EQ(VerdictName(d.verdict), VerdictName(c.want));
    EXPECT_EQ(d.keep_candidate(), c.want == Verdict::kCandidateFaster);
  }
}

TEST(PlanDecisionTest, Interval_BracketsTheRatioOfMedians) {
  const std::optional<RatioInterval> r =
      InterleavedRatio(Interleaved(0.40, 0.30, 4, 0.02), 1, 2, {});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->pairs, 4);
  EXPECT_EQ(r->incumbent_steps, 20);
  EXPECT_EQ(r->candidate_steps, 20);
  EXPECT_NEAR(r->ratio, 0.75, 0.01);
  EXPECT_LE(r->low, r->ratio);
  EXPECT_GE(r->high, r->ratio);
  EXPECT_GT(r->low, 0.70);
  EXPECT_LT(r->high, 0.80);
}

TEST(PlanDecisionTest, StudentTQuantile_MatchesTheTables) {
  EXPECT_NEAR(StudentTQuantile(0.975, 1), 12.706, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.975, 2), 4.303, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.975, 3), 3.182, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.975, 5), 2.571, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.975, 10), 2.228, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.975, 30), 2.042, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.975, 1000), 1.962, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.95, 4), 2.132, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.995, 3), 5.841, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.5, 7), 0, 1e-9);
  EXPECT_TRUE(std::isinf(StudentTQuantile(0.975, 0)));
}

// Three quiet pairs that disagree (0.90, 1.00, 0.95): the bootstrap, which
// can only redraw those three, reads them as more certain than they are;
// the interval is at least Student's t over their log ratios (t(2) = 4.303).
TEST(PlanDecisionTest, FewPairs_IntervalAtLeastStudentsT) {
  std::vector<StepBlock> blocks;
  const std::vector<double> ratios = {0.90, 1.00, 0.95};
  for (const double r : ratios) {
    blocks.push_back(Block(1, 1.0, 0.002));
    blocks.push_back(Block(2, r, 0.002));
  }
  const std::optional<RatioInterval> got = InterleavedRatio(blocks, 1, 2, {});
  ASSERT_TRUE(got.has_value());
  double mean = 0;
  for (const double r : ratios) mean += std::log(r) / 3;
  double squares = 0;
  for (const double r : ratios) {
    squares += (std::log(r) - mean) * (std::log(r) - mean);
  }
  const double half = 4.303 * std::sqrt(squares / 2 / 3);
  EXPECT_NEAR(got->ratio, std::exp(mean), 1e-3);
  EXPECT_LE(got->low, std::exp(mean - half) + 1e-3);
  EXPECT_GE(got->high, std::exp(mean + half) - 1e-3);
  // So the candidate, 5% faster by its ratio, is not yet called faster.
  EXPECT_EQ(VerdictName(DecideInterleaved(blocks, 1, 2, {}).verdict),
            VerdictName(Verdict::kMeasureMore));
}

TEST(PlanDecisionTest, SameMeasurements_SameInterval) {
  const std::vector<StepBlock> blocks = Interleaved(1.0, 0.9, 3, 0.1);
  const std::optional<RatioInterval> a = InterleavedRatio(blocks, 1, 2, {});
  const std::optional<RatioInterval> b = InterleavedRatio(blocks, 1, 2, {});
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->low, b->low);
  EXPECT_EQ(a->high, b->high);
}

// The first step of a block paid for the switch (a 1.25 s spike in the
// demo): it never counts.
TEST(PlanDecisionTest, FirstStepOfEachBlock_LeftOut) {
  std::vector<StepBlock> blocks;
  for (int i = 0; i < 3; ++i) {
    blocks.push_back(Block(1, 1.0, 0.01, 5, /*first_s=*/9.0));
    blocks.push_back(Block(2, 0.8, 0.01, 5, /*first_s=*/9.0));
  }
  const ComparisonDecision d = DecideInterleaved(blocks, 1, 2, {});
  ASSERT_TRUE(d.interval.has_value());
  EXPECT_NEAR(d.interval->ratio, 0.8, 0.01);
  EXPECT_EQ(d.verdict, Verdict::kCandidateFaster);
}

// Blocks of other versions and blocks too short to count are skipped;
// two blocks of one version in a row pair the newer one.
TEST(PlanDecisionTest, Pairing_SkipsOtherVersionsAndShortBlocks) {
  StepBlock short_block = Block(2, 0.1, 0.0, 1);  // one counted step
  const std::vector<StepBlock> blocks = {
      Block(1, 5.0),  // replaced by the next block of v1
      Block(1, 1.0), Block(7, 0.1), short_block,
      Block(2, 0.9), Block(1, 1.0), Block(2, 0.9),
  };
  const std::optional<RatioInterval> r = InterleavedRatio(blocks, 1, 2, {});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->pairs, 2);
  EXPECT_NEAR(r->ratio, 0.9, 0.01);
  // Measured one after the other (no pair): nothing to compare.
  EXPECT_FALSE(
      InterleavedRatio({Block(1, 1.0), Block(1, 1.0)}, 1, 2, {}).has_value());
  // Non-finite and non-positive steps never count.
  StepBlock bad = Block(2, 0.9);
  bad.step_s.push_back(std::nan(""));
  bad.step_s.push_back(-1);
  const std::optional<RatioInterval> r2 =
      InterleavedRatio({Block(1, 1.0), bad}, 1, 2, {});
  ASSERT_TRUE(r2.has_value());
  EXPECT_EQ(r2->candidate_steps, 5);
}

// Pairs whose ratios alternate between `a` and `b` (candidate over
// incumbent), `pairs` of them: a machine that moves within a pair.
std::vector<StepBlock> Disagreeing(double a, double b, int pairs) {
  std::vector<StepBlock> blocks;
  for (int i = 0; i < pairs; ++i) {
    blocks.push_back(Block(1, 1.0));
    blocks.push_back(Block(2, i % 2 == 0 ? a : b));
  }
  return blocks;
}

// A candidate that looks faster by more than min_gain but is not decided
// after max_pairs measures on (giving up would likely keep the slower plan);
// it is inconclusive at promising_max_pairs. One that does not look faster
// by min_gain stops at max_pairs.
TEST(PlanDecisionTest, PromisingCandidate_MeasuresOnToPromisingMaxPairs) {
  CompareOptions options;  // 2..6 pairs, 12 for a promising candidate
  ASSERT_EQ(options.max_pairs, 6);
  ASSERT_EQ(options.promising_max_pairs, 12);
  // Ratios 0.80 and 1.12 in turn: 0.947 by geometric mean, the interval
  // reaching from ~0.87 to above 1.
  const ComparisonDecision at6 =
      DecideInterleaved(Disagreeing(0.80, 1.12, 6), 1, 2, options);
  ASSERT_TRUE(at6.interval.has_value());
  EXPECT_NEAR(at6.interval->ratio, 0.947, 0.005);
  EXPECT_GT(at6.interval->high, 1.0);
  EXPECT_EQ(VerdictName(at6.verdict), VerdictName(Verdict::kMeasureMore));
  const ComparisonDecision at12 =
      DecideInterleaved(Disagreeing(0.80, 1.12, 12), 1, 2, options);
  ASSERT_TRUE(at12.interval.has_value());
  EXPECT_EQ(at12.interval->pairs, 12);
  EXPECT_GT(at12.interval->high, 1.0);
  EXPECT_EQ(VerdictName(at12.verdict), VerdictName(Verdict::kInconclusive));
  EXPECT_FALSE(at12.keep_candidate());
  // The same spread around a ratio short of min_gain (0.99): inconclusive
  // at 6, the incumbent kept.
  const ComparisonDecision short_of_gain =
      DecideInterleaved(Disagreeing(0.84, 1.17, 6), 1, 2, options);
  ASSERT_TRUE(short_of_gain.interval.has_value());
  EXPECT_GT(short_of_gain.interval->ratio, 1 - options.min_gain);
  EXPECT_EQ(VerdictName(short_of_gain.verdict),
            VerdictName(Verdict::kInconclusive));
  // promising_max_pairs under max_pairs changes nothing.
  options.promising_max_pairs = 3;
  EXPECT_EQ(
      VerdictName(
          DecideInterleaved(Disagreeing(0.80, 1.12, 6), 1, 2, options).verdict),
      VerdictName(Verdict::kInconclusive));
}

TEST(PlanDecisionTest, MinGain_IsTheSmallestSpeedupKept) {
  const std::vector<StepBlock> blocks = Interleaved(1.0, 0.95, 4, 0.003);
  CompareOptions options;
  options.min_gain = 0.03;
  EXPECT_EQ(DecideInterleaved(blocks, 1, 2, options).verdict,
            Verdict::kCandidateFaster);
  options.min_gain = 0.08;
  EXPECT_EQ(DecideInterleaved(blocks, 1, 2, options).verdict,
            Verdict::kEquivalent);
}

TEST(PlanDecisionTest, TrialBackoff_DoublesUpTo16Times) {
  const std::vector<std::pair<int, int64_t>> table = {
      {0, 20}, {1, 40}, {2, 80}, {3, 160}, {4, 320}, {9, 320}, {-1, 20}};
  for (const auto& [inconclusive, steps] : table) {
    EXPECT_EQ(TrialBackoffSteps(20, inconclusive), steps) << inconclusive;
  }
  EXPECT_EQ(TrialBackoffSteps(0, 2), 4);
}

TEST(PlanDecisionTest, PlanReason_NamesRoundTrip) {
  for (PlanReason r :
       {PlanReason::kInitial, PlanReason::kDrift, PlanReason::kMemory,
        PlanReason::kReoptimize, PlanReason::kRollback, PlanReason::kCached,
        PlanReason::kTrial, PlanReason::kKept, PlanReason::kMemoryGuard,
        PlanReason::kBaselineCheck}) {
    const std::optional<PlanReason> back =
        PlanReasonFromName(PlanReasonName(r));
    ASSERT_TRUE(back.has_value()) << PlanReasonName(r);
    EXPECT_EQ(*back, r);
  }
  EXPECT_EQ(PlanReasonName(PlanReason::kMemoryGuard), "memory-guard");
  EXPECT_FALSE(PlanReasonFromName("Drift").has_value());
  EXPECT_FALSE(PlanReasonFromName("").has_value());
}

TEST(PlanDecisionTest, Speedup_CarriesItsIntervalAndBasis) {
  const Speedup s = DescribeSpeedup(
      InterleavedRatio(Interleaved(1.27, 1.0, 4, 0.01), 1, 2, {}),
      "FSDP-style on-demand gathers");
  ASSERT_TRUE(s.measured());
  EXPECT_NEAR(s.factor, 1.27, 0.02);
  EXPECT_LE(s.low, s.factor);
  EXPECT_GE(s.high, s.factor);
  EXPECT_EQ(s.steps, 40);
  EXPECT_THAT(s.text, HasSubstr("faster than the baseline (v0: FSDP-style "
                                "on-demand gathers), measured interleaved "
                                "over 40 steps"));
  EXPECT_THAT(s.text, HasSubstr("1.27\u00d7 ("));
}

// The demo's "2.43x faster": a baseline of 5 steps spread ±19%, measured
// before the plan, not beside it. Never a number from that.
TEST(PlanDecisionTest, Speedup_NotMeasuredYet_FromTooLittle) {
  const std::string basis = "on-demand";
  EXPECT_THAT(DescribeSpeedup(std::nullopt, basis).text,
              HasSubstr("not measured yet"));
  EXPECT_FALSE(DescribeSpeedup(std::nullopt, basis).measured());
  // One pair, however clear.
  const Speedup one = DescribeSpeedup(
      InterleavedRatio(Interleaved(2.4, 1.0, 1), 1, 2, {}), basis);
  EXPECT_FALSE(one.measured());
  EXPECT_THAT(one.text, HasSubstr("one block pair; two are needed"));
  // Wide: 40% spread within the blocks.
  const Speedup wide = DescribeSpeedup(
      InterleavedRatio(Interleaved(2.4, 1.0, 2, 0.40), 1, 2, {}), basis);
  EXPECT_FALSE(wide.measured());
  EXPECT_THAT(wide.text, HasSubstr("wider than 20%"));
  EXPECT_EQ(wide.factor, 0);
}

TEST(PlanDecisionTest, Speedup_SlowerThanTheBaselineSaysSo) {
  const Speedup s = DescribeSpeedup(
      InterleavedRatio(Interleaved(1.0, 1.2, 3, 0.005), 1, 2, {}), "b");
  ASSERT_TRUE(s.measured());
  EXPECT_LT(s.factor, 1);
  EXPECT_THAT(s.text, HasSubstr("slower than the baseline"));
}

// `n` steps whose blocks of 3 (a check's counted steps) alternate between
// `base` and `base * (1 + swing)`, as under a CPU hog that comes and goes.
std::vector<double> Swinging(int n, double base, double swing) {
  std::vector<double> steps;
  for (int i = 0; i < n; ++i) {
    steps.push_back((i / 3) % 2 == 0 ? base : base * (1 + swing));
  }
  return steps;
}

// A baseline check's block pairs follow the noise measured: steady steps
// keep the job's optimize.baseline_pairs; blocks 10% apart need 15 pairs
// for a 20% interval (1.4826 x ln 1.1 = 0.141 per pair ratio: the fewest n
// with 2 t(n-1) x 0.141 x 1.25 / sqrt(n) <= 0.2, t(14) / sqrt(15) = 0.554
// where 14 pairs give 0.577); 30% apart would need over 100, capped.
TEST(PlanDecisionTest, NoisePairs_FollowTheMeasuredSpread) {
  constexpr int kBlock = 4;
  EXPECT_EQ(NoisePairs({std::vector<double>(30, 0.5)}, kBlock, 4, 16), 4);
  EXPECT_EQ(NoisePairs({Swinging(24, 0.5, 0.10)}, kBlock, 4, 16), 15);
  EXPECT_EQ(NoisePairs({Swinging(24, 0.5, 0.30)}, kBlock, 4, 16), 16);
  // A wider interval allowed, fewer pairs: t(n-1) / sqrt(n) <= 1.13 from
  // n = 6 (t(5) / sqrt(6) = 1.05; five give 1.24).
  EXPECT_EQ(NoisePairs({Swinging(24, 0.5, 0.10)}, kBlock, 2, 16, 0.40), 6);
  // Pooled over the two versions' series: the steady one's ratios (0) make
  // half of them, so the median is half the swing's, and the 20% interval
  // needs 6 pairs, not the job's 4.
  EXPECT_EQ(NoisePairs({Swinging(24, 0.5, 0.10), std::vector<double>(24, 1)},
                       kBlock, 4, 16),
            6);
  // Never fewer than two: t needs them.
  EXPECT_EQ(NoisePairs({std::vector<double>(30, 0.5)}, kBlock, 1, 16), 2);
  // One spike in a steady series moves a block's median by nothing.
  std::vector<double> spiked(30, 0.5);
  spiked[7] = 2.5;
  EXPECT_EQ(NoisePairs({spiked}, kBlock, 4, 16), 4);
  // Too few blocks to tell (two blocks, one ratio): the job's pairs.
  EXPECT_EQ(NoisePairs({Swinging(6, 0.5, 0.30)}, kBlock, 4, 16), 4);
  EXPECT_EQ(NoisePairs({}, kBlock, 4, 16), 4);
}

// A measured interval `pairs` wide: its bootstrap part `bootstrap_width`
// and Student's t's from the pairs' log ratios spread by `log_sd`, around a
// ratio of 1.
RatioInterval Measured(int pairs, double bootstrap_width, double log_sd = 0) {
  RatioInterval r;
  r.pairs = pairs;
  r.ratio = 1;
  r.bootstrap_width = bootstrap_width;
  r.log_sd = log_sd;
  double width = bootstrap_width;
  if (pairs >= 2) {
    width = std::max(width, 2 * std::sinh(StudentTQuantile(0.975, pairs - 1) *
                                          log_sd / std::sqrt(pairs * 1.0)));
  }
  r.low = 1 - width / 2;
  r.high = 1 + width / 2;
  return r;
}

// A check whose interval came out too wide measures on for the pairs its
// width asks, pooled. Where the bootstrap set the width, it narrows as
// 1/sqrt(pairs): 2 pairs 25% wide need 2 x (0.25 x 1.25 / 0.2)^2 = 4.9,
// so 5 in all, 3 more; 4 pairs 40% wide would need 25, capped at 16 in
// all. Narrow enough already, or at the cap: none.
TEST(PlanDecisionTest, MorePairsForWidth_WhatTheWidthAsks) {
  EXPECT_EQ(MorePairsForWidth(Measured(2, 0.25), 16), 3);
  EXPECT_EQ(MorePairsForWidth(Measured(4, 0.40), 16), 12);
  EXPECT_EQ(MorePairsForWidth(Measured(4, 0.21), 16), 3);
  EXPECT_EQ(MorePairsForWidth(Measured(4, 0.199), 16), 0);
  EXPECT_EQ(MorePairsForWidth(Measured(4, 0.15), 16), 0);
  EXPECT_EQ(MorePairsForWidth(Measured(16, 0.30), 16), 0);
  EXPECT_EQ(MorePairsForWidth(Measured(0, 0.30), 16), 0);
  // Against a wider bound: (0.5 x 1.25 / 0.4)^2 x 2 = 4.9, 3 more.
  EXPECT_EQ(MorePairsForWidth(Measured(2, 0.50, 0), 16, 0.40), 3);
}

// Where Student's t set the width, its quantile falls with the pairs as
// well: two pairs 0.78 and 0.82 (log sd 0.035) read 64% wide under t(1) =
// 12.7, yet four pairs of that spread fit 20% (2 sinh(3.182 x 0.035 / 2)
// x 1.25 = 0.14; three give 0.22): 2 more, not the 19 that 1/sqrt(pairs)
// alone would ask. Pairs 0.7 and 0.9 (log sd 0.18) would need 22: capped.
// Four pairs spread by 0.1 need 9 (0.192; eight give 0.209).
TEST(PlanDecisionTest, MorePairsForWidth_StudentsTNarrowsFasterThanRootPairs) {
  const double close = std::abs(std::log(0.82) - std::log(0.78)) / std::sqrt(2);
  EXPECT_GT(Measured(2, 0, close).width(), 0.6);
  EXPECT_EQ(MorePairsForWidth(Measured(2, 0, close), 16), 2);
  const double apart = std::abs(std::log(0.9) - std::log(0.7)) / std::sqrt(2);
  EXPECT_EQ(MorePairsForWidth(Measured(2, 0, apart), 16), 14);
  EXPECT_EQ(MorePairsForWidth(Measured(4, 0.05, 0.1), 16), 5);
  // The wider part rules: a bootstrap 40% wide over a quiet t.
  EXPECT_EQ(MorePairsForWidth(Measured(4, 0.40, 0.01), 16), 12);
}

// -- a busy host --------------------------------------------------------------

// `b` with every step's cpu_wait_share at `share`.
StepBlock Waiting(StepBlock b, double share) {
  b.cpu_wait_share.assign(b.step_s.size(), share);
  return b;
}

// A B A B ... for `pairs` pairs, the pairs in `busy` run beside a CPU hog:
// both blocks' wait share 0.20 (0.06 otherwise) and the candidate, whose
// plan overlaps more communication and so loses more to the hog, 25%
// slower there than the incumbent instead of `b_s / a_s` (the noise
// bench's 12-03b demo job 3: a hog kept the plan that was slower quietly).
std::vector<StepBlock> HogInSomePairs(double a_s, double b_s, int pairs,
                                      const std::vector<int>& busy) {
  std::vector<StepBlock> blocks;
  for (int i = 0; i < pairs; ++i) {
    const bool hog = std::find(busy.begin(), busy.end(), i) != busy.end();
    const double share = hog ? 0.20 : 0.06;
    blocks.push_back(Waiting(Block(1, hog ? a_s * 1.5 : a_s), share));
    blocks.push_back(Waiting(Block(2, hog ? a_s * 1.5 * 1.25 : b_s), share));
  }
  return blocks;
}

CompareOptions WithThresholds(double threshold) {
  CompareOptions o;
  o.busy_wait_share = {{1, threshold}, {2, threshold}};
  return o;
}

TEST(PlanDecisionTest, BusyPairs_LeftOutOfTheRatio) {
  // Quietly the candidate is 10% faster; in 3 of 7 pairs a hog makes it
  // 25% slower. Counted, those pairs undo the verdict; left out (the
  // blocks' wait share 0.20 is above the 0.12 a quiet 0.06 allows), the
  // quiet pairs decide it.
  const std::vector<StepBlock> blocks = HogInSomePairs(1.0, 0.9, 7, {1, 3, 5});
  const ComparisonDecision counted =
      DecideInterleaved(blocks, 1, 2, CompareOptions{});
  EXPECT_NE(counted.verdict, Verdict::kCandidateFaster);
  EXPECT_EQ(counted.busy.pairs, 0);

  const ComparisonDecision d =
      DecideInterleaved(blocks, 1, 2, WithThresholds(0.12));
  EXPECT_EQ(d.verdict, Verdict::kCandidateFaster);
  ASSERT_TRUE(d.interval.has_value());
  EXPECT_EQ(d.interval->pairs, 4);
  EXPECT_EQ(d.interval->busy_pairs, 3);
  EXPECT_EQ(d.interval->busy_steps, 30);  // 5 counted steps a block
  EXPECT_EQ(d.busy.pairs, 3);
  EXPECT_NEAR(d.interval->ratio, 0.9, 0.01);
  // A threshold above the hog's share leaves nothing out.
  EXPECT_EQ(DecideInterleaved(blocks, 1, 2, WithThresholds(0.25)).busy.pairs,
            0);
}

TEST(PlanDecisionTest, BusyPairs_OneBusyBlockLeavesItsPairOut) {
  // The hog in the incumbent's block alone makes the candidate look 33%
  // faster in that pair: a pair is left out when either block is busy.
  std::vector<StepBlock> blocks;
  for (int i = 0; i < 4; ++i) {
    const bool hog = i == 2;
    blocks.push_back(Waiting(Block(1, hog ? 1.5 : 1.0), hog ? 0.3 : 0.06));
    blocks.push_back(Waiting(Block(2, 1.0), 0.06));
  }
  const std::optional<RatioInterval> r =
      InterleavedRatio(blocks, 1, 2, WithThresholds(0.12));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->pairs, 3);
  EXPECT_EQ(r->busy_pairs, 1);
  EXPECT_NEAR(r->ratio, 1.0, 0.005);
}

TEST(PlanDecisionTest, SteadyHog_EndsTheComparisonUndecided) {
  // Every block busy: no pair counts, and after max_busy_pairs (6) the
  // comparison is inconclusive (the incumbent runs on) instead of
  // alternating for ever or deciding on what the hog favours.
  CompareOptions o = WithThresholds(0.12);
  ASSERT_EQ(o.max_busy_pairs, 6);
  const ComparisonDecision five =
      DecideInterleaved(HogInSomePairs(1.0, 0.9, 5, {0, 1, 2, 3, 4}), 1, 2, o);
  EXPECT_EQ(five.verdict, Verdict::kMeasureMore);
  EXPECT_FALSE(five.interval.has_value());
  EXPECT_EQ(five.busy.pairs, 5);
  const ComparisonDecision six = DecideInterleaved(
      HogInSomePairs(1.0, 0.9, 6, {0, 1, 2, 3, 4, 5}), 1, 2, o);
  EXPECT_EQ(six.verdict, Verdict::kInconclusive);
  EXPECT_FALSE(six.keep_candidate());
}

TEST(PlanDecisionTest, BusyPairs_UnmeasuredBlocksAreNotJudged) {
  // No wait share (a worker that does not report it, or steps stored
  // before it existed), or one missing in most of the block's counted
  // steps: the block counts as before.
  std::vector<StepBlock> blocks = Interleaved(1.0, 0.85, 3);
  EXPECT_EQ(DecideInterleaved(blocks, 1, 2, WithThresholds(0.12)).verdict,
            Verdict::kCandidateFaster);
  for (StepBlock& b : blocks) {
    b.cpu_wait_share.assign(b.step_s.size(), -1);
    b.cpu_wait_share[1] = 0.5;  // one of five counted steps measured
  }
  const ComparisonDecision d =
      DecideInterleaved(blocks, 1, 2, WithThresholds(0.12));
  EXPECT_EQ(d.verdict, Verdict::kCandidateFaster);
  EXPECT_EQ(d.busy.pairs, 0);
  // A version without a threshold (too few measured steps) has no busy
  // block.
  CompareOptions only_incumbent;
  only_incumbent.busy_wait_share = {{1, 0.12}};
  const std::vector<StepBlock> hog = HogInSomePairs(1.0, 0.9, 3, {0});
  std::vector<StepBlock> candidate_busy_only = hog;
  candidate_busy_only[0] = Waiting(candidate_busy_only[0], 0.06);
  EXPECT_EQ(BusyPairs(candidate_busy_only, 1, 2, only_incumbent).pairs, 0);
  EXPECT_EQ(BusyPairs(hog, 1, 2, only_incumbent).pairs, 1);
}

TEST(PlanDecisionTest, HostContention_LearnsEachVersionsQuietLevel) {
  HostContention h;
  // Too few steps: no block of the version is busy.
  for (int i = 0; i < HostContention::kMinSteps - 1; ++i)
    h.Record(1, 0.06, 0.3);
  EXPECT_TRUE(std::isinf(h.BusyThreshold(1)));
  EXPECT_TRUE(h.Thresholds().empty());
  h.Record(1, 0.06, 0.3);
  // Twice the quiet level, at least 0.05 above it.
  EXPECT_NEAR(h.BusyThreshold(1), 0.12, 1e-12);
  // The quiet level is a low quantile: a hog in most steps leaves it.
  for (int i = 0; i < 24; ++i) h.Record(1, 0.23, 0.45);
  EXPECT_NEAR(h.BusyThreshold(1), 0.12, 1e-12);
  // Unmeasured steps are ignored.
  h.Record(1, -1, 0.3);
  h.Record(1, std::nan(""), 0.3);
  h.Record(1, 0.5, 0);
  EXPECT_NEAR(h.BusyThreshold(1), 0.12, 1e-12);
  // A plan whose own communication threads keep its compute thread
  // waiting more has its own, higher level.
  for (int i = 0; i < HostContention::kMinSteps; ++i) h.Record(2, 0.10, 0.3);
  EXPECT_NEAR(h.BusyThreshold(2), 0.20, 1e-12);
  EXPECT_EQ(h.Thresholds().size(), 2u);
  // Only the last kWindow steps: a host that got busier for good becomes
  // the quiet level.
  for (int i = 0; i < HostContention::kWindow; ++i) h.Record(1, 0.2, 0.3);
  EXPECT_NEAR(h.BusyThreshold(1), 0.4, 1e-12);
}

// One step's share is noisy (a 20 ms step reads 0 to 0.5 quiet); the
// quiet level is taken over groups of steps, each its wait over its wall
// time, so a few near-zero steps do not make it.
TEST(PlanDecisionTest, HostContention_QuietLevelOverGroupsOfSteps) {
  HostContention h;
  // Each group of three: 0.0, 0.15, 0.15 at equal times: 0.10 a group.
  for (int i = 0; i < 30; ++i) h.Record(1, i % 3 == 0 ? 0.0 : 0.15, 0.3);
  EXPECT_NEAR(h.BusyThreshold(1), 0.20, 1e-9);
  // Weighted by time: a long step counts for more of its group.
  HostContention w;
  for (int i = 0; i < 12; ++i)
    w.Record(1, i % 3 == 0 ? 0.3 : 0.0, i % 3 == 0 ? 1.0 : 0.5);
  EXPECT_NEAR(w.BusyThreshold(1), 0.30, 1e-9);  // 0.15 a group: 2 x 0.15
}

TEST(PlanDecisionTest, BusyPairs_ShortBlocksAreNotJudged) {
  // Blocks of 5 counted steps of 0.05 s: 0.25 s, under kMinJudgedBlockSeconds.
  std::vector<StepBlock> blocks;
  for (int i = 0; i < 3; ++i) {
    blocks.push_back(Waiting(Block(1, 0.05), i == 1 ? 0.5 : 0.06));
    blocks.push_back(Waiting(Block(2, 0.045), i == 1 ? 0.5 : 0.06));
  }
  EXPECT_EQ(BusyPairs(blocks, 1, 2, WithThresholds(0.12)).pairs, 0);
  CompareOptions any_length = WithThresholds(0.12);
  any_length.min_judged_s = 0;
  EXPECT_EQ(BusyPairs(blocks, 1, 2, any_length).pairs, 1);
}

TEST(PlanDecisionTest, Speedup_SaysWhatWasLeftOut) {
  CompareOptions o = WithThresholds(0.12);
  const std::vector<StepBlock> blocks = HogInSomePairs(1.27, 1.0, 6, {2});
  const Speedup s = DescribeSpeedup(InterleavedRatio(blocks, 1, 2, o), "b");
  ASSERT_TRUE(s.measured());
  EXPECT_EQ(s.busy_steps, 10);
  EXPECT_THAT(s.text, HasSubstr("over 50 steps (10 more left out: the host's "
                                "CPUs were busy with other work)"));
  // Nothing counted yet: the figure says why.
  const std::vector<StepBlock> all = HogInSomePairs(1.27, 1.0, 2, {0, 1});
  const Speedup none =
      DescribeSpeedup(InterleavedRatio(all, 1, 2, o), "b", kMaxSpeedupWidth,
                      BusyPairs(all, 1, 2, o));
  EXPECT_FALSE(none.measured());
  EXPECT_THAT(none.text, HasSubstr("not measured yet"));
  EXPECT_THAT(none.text, HasSubstr("20 steps in 2 block pairs left out: the "
                                   "host's CPUs were busy with other work"));
}

}  // namespace

}  // namespace tandem
