#include "coordinator/service/drift_detector.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

TEST(DriftDetectorTest, Observe_SustainedDeviation_FiresAfterWindow) {
  DriftDetector d(0.10, 5, 0);
  d.SetPrediction(1.0, 0);
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(d.Observe(1.2, 0).has_value());
  auto reason = d.Observe(1.2, 0);
  ASSERT_TRUE(reason.has_value());
  EXPECT_EQ(*reason, "drift");
  EXPECT_NEAR(d.score(), 0.2, 1e-12);
  EXPECT_FALSE(d.Observe(1.2, 0).has_value());  // quiet until re-planned
}

TEST(DriftDetectorTest, Observe_OneOutlier_ResetsStreak) {
  DriftDetector d(0.10, 3, 0);
  d.SetPrediction(1.0, 0);
  EXPECT_FALSE(d.Observe(1.5, 0));
  EXPECT_FALSE(d.Observe(1.5, 0));
  EXPECT_FALSE(d.Observe(1.05, 0));  // within threshold: streak resets
  EXPECT_FALSE(d.Observe(1.5, 0));
  EXPECT_FALSE(d.Observe(1.5, 0));
  EXPECT_TRUE(d.Observe(1.5, 0));
}

TEST(DriftDetectorTest, Observe_FasterThanPredicted_AlsoDrifts) {
  DriftDetector d(0.10, 2, 0);
  d.SetPrediction(1.0, 0);
  EXPECT_FALSE(d.Observe(0.5, 0));
  EXPECT_EQ(d.Observe(0.5, 0).value_or(""), "drift");
}

TEST(DriftDetectorTest, Observe_NearBudget_FiresMemory) {
  DriftDetector d(0.10, 5, 1000);
  d.SetPrediction(1.0, 500);
  EXPECT_FALSE(d.Observe(1.0, 940));
  EXPECT_EQ(d.Observe(1.0, 950).value_or(""), "memory");
}

TEST(DriftDetectorTest, Observe_NoPrediction_NeverDrifts) {
  DriftDetector d(0.10, 1, 0);
  EXPECT_FALSE(d.Observe(100, 0));
  EXPECT_FALSE(d.has_prediction());
  d.SetBudget(10);
  EXPECT_EQ(d.Observe(1, 10).value_or(""), "memory");
}

}  // namespace
}  // namespace tandem
