#include "coordinator/service/schedule_measurements.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

// Steps first..first+n-1 of `version` at the given times, cycling.
void Steps(ScheduleMeasurements& m, int64_t version, int64_t first, int n,
           std::initializer_list<double> times) {
  auto it = times.begin();
  for (int i = 0; i < n; ++i) {
    m.Record(version, first + i, *it);
    if (++it == times.end()) it = times.begin();
  }
}

TEST(ScheduleMeasurementsTest, Summarize_SkipsTheSwitchStepAndNeedsWindow) {
  ScheduleMeasurements m(3);
  m.Record(1, 10, 9.0);  // the switch step: left out
  m.Record(1, 11, 1.0);
  m.Record(1, 12, 2.0);
  EXPECT_FALSE(m.Summarize(1).has_value());
  m.Record(1, 13, 4.0);
  std::optional<ScheduleMeasurements::Summary> s = m.Summarize(1);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->samples, 3);
  EXPECT_DOUBLE_EQ(s->median_s, 2.0);
  // |1-2|, |2-2|, |4-2| -> median 1, over the median 2.
  EXPECT_DOUBLE_EQ(s->relative_mad, 0.5);
}

// Each version's kept steps in order, its switch step left out, the
// oldest dropped past kMaxSamples: what a baseline check's NoisePairs reads.
TEST(ScheduleMeasurementsTest, AllSteps_EachVersionsKeptStepsInOrder) {
  ScheduleMeasurements m(3);
  Steps(m, 2, 40, 4, {9.0, 2.0, 3.0, 4.0});
  Steps(m, 0, 0, ScheduleMeasurements::kMaxSamples + 3, {9.0, 5.0, 6.0});
  const std::vector<std::vector<double>> all = m.AllSteps();
  ASSERT_EQ(all.size(), 2u);
  ASSERT_EQ(all[0].size(),
            static_cast<size_t>(ScheduleMeasurements::kMaxSamples));
  // Steps 3.. kept: 9, 5, 6, 9, ...
  EXPECT_DOUBLE_EQ(all[0].front(), 9.0);
  EXPECT_DOUBLE_EQ(all[0][1], 5.0);
  EXPECT_EQ(all[1], (std::vector<double>{2.0, 3.0, 4.0}));
}

TEST(ScheduleMeasurementsTest, BehindBest_SlowerBeyondNoise_NamesTheBest) {
  ScheduleMeasurements m(4);
  Steps(m, 0, 0, 6, {0.100, 0.101, 0.099});
  Steps(m, 1, 6, 6, {0.080, 0.081, 0.079});
  Steps(m, 2, 12, 6, {0.130, 0.131, 0.129});
  std::optional<ScheduleMeasurements::Behind> behind = m.BehindBest(2);
  ASSERT_TRUE(behind.has_value());
  EXPECT_EQ(behind->best_version, 1);  // the fastest, not the baseline
  EXPECT_DOUBLE_EQ(behind->best.median_s, 0.080);
  EXPECT_DOUBLE_EQ(behind->active.median_s, 0.130);
  EXPECT_DOUBLE_EQ(behind->noise, ScheduleMeasurements::kMinNoise);
  // The fastest is behind nobody.
  EXPECT_FALSE(m.BehindBest(1).has_value());
}

TEST(ScheduleMeasurementsTest, BehindBest_WithinNoise_NotBehind) {
  ScheduleMeasurements m(4);
  // 4% slower: under the 5% floor.
  Steps(m, 0, 0, 6, {0.100});
  Steps(m, 1, 6, 6, {0.104});
  EXPECT_FALSE(m.BehindBest(1).has_value());
  // Noisy steps widen the margin: 20% slower against +-10% jitter (relative
  // MAD 0.1 -> 30% margin) is not behind either.
  ScheduleMeasurements noisy(5);
  Steps(noisy, 0, 0, 8, {0.09, 0.10, 0.11});
  Steps(noisy, 1, 8, 8, {0.108, 0.12, 0.132});
  std::optional<ScheduleMeasurements::Summary> v1 = noisy.Summarize(1);
  ASSERT_TRUE(v1.has_value());
  EXPECT_NEAR(v1->relative_mad, 0.1, 1e-9);
  EXPECT_FALSE(noisy.BehindBest(1).has_value());
}

TEST(ScheduleMeasurementsTest, BehindBest_NothingElseJudged_Nullopt) {
  ScheduleMeasurements m(4);
  Steps(m, 0, 0, 3, {0.1});  // 2 samples: not judged
  Steps(m, 1, 3, 6, {0.5});
  EXPECT_FALSE(m.BehindBest(1).has_value());
  m.Record(1, 100, -1);  // nonsense is ignored
  EXPECT_EQ(m.Summarize(1)->samples, 5);
}

}  // namespace
}  // namespace tandem
