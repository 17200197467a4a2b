#include "coordinator/service/work_scale.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tandem {
namespace {

// Works cycling through sequences of 1/4, 1, 1/2 and 2 of the reference's.
constexpr double kWorks[] = {100, 400, 200, 800};

TEST(WorkScaleTest, FixedWork_NeverScaled) {
  WorkScale w;
  w.SetReference(400);
  for (int i = 0; i < 20; ++i) w.Record(1, 0.05 + 0.001 * (i % 3), 400);
  EXPECT_FALSE(w.varies());
  EXPECT_EQ(w.slope(), 0);
  EXPECT_DOUBLE_EQ(w.ToReference(0.07, 400), 0.07);
  // A step of unknown work is left as measured too.
  EXPECT_DOUBLE_EQ(w.ToReference(0.07, 0), 0.07);
}

TEST(WorkScaleTest, LinearTimes_ScaledExactlyToTheReference) {
  WorkScale w;
  w.SetReference(250);
  w.SetReference(999);  // the first reference stays
  EXPECT_EQ(w.reference(), 250);
  auto time = [](double work) { return 0.02 + 1e-4 * work; };
  for (int i = 0; i < 12; ++i) w.Record(0, time(kWorks[i % 4]), kWorks[i % 4]);
  EXPECT_TRUE(w.varies());
  EXPECT_NEAR(w.slope(), 1e-4, 1e-12);
  for (double work : kWorks) {
    EXPECT_NEAR(w.ToReference(time(work), work), time(250), 1e-12) << work;
  }
  EXPECT_NEAR(w.Scale(time(100), 100, 800), time(800), 1e-12);
}

// Pairs across schedule versions say nothing: each version ran one work, at
// its own speed.
TEST(WorkScaleTest, PairsAcrossVersions_NotCounted) {
  WorkScale w;
  w.SetReference(100);
  for (int i = 0; i < 10; ++i) w.Record(1, 0.10, 100);
  for (int i = 0; i < 10; ++i) w.Record(2, 0.05, 800);
  EXPECT_TRUE(w.varies());
  EXPECT_EQ(w.slope(), 0);
  EXPECT_DOUBLE_EQ(w.ToReference(0.05, 800), 0.05);
}

// Fewer than kMinPairs informative pairs: not enough to fit.
TEST(WorkScaleTest, TooFewPairs_NoSlope) {
  WorkScale w;
  w.SetReference(100);
  w.Record(0, 0.01, 100);
  w.Record(0, 0.04, 400);
  w.Record(0, 0.02, 200);  // 3 pairs
  EXPECT_EQ(w.slope(), 0);
  w.Record(0, 0.08, 800);  // 6 pairs
  EXPECT_GT(w.slope(), 0);
}

// The median of pairwise slopes ignores a minority of wild steps (a stall).
TEST(WorkScaleTest, Outliers_DoNotMoveTheSlope) {
  WorkScale w;
  w.SetReference(250);
  for (int i = 0; i < 40; ++i) {
    const double work = kWorks[i % 4];
    w.Record(0, (i % 9 == 4 ? 10.0 : 1.0) * (0.02 + 1e-4 * work), work);
  }
  EXPECT_NEAR(w.slope(), 1e-4, 2e-5);
}

// Times that shrink as work grows (noise, or another effect) are not
// scaled; a scaled time never leaves [t, t x to / from].
TEST(WorkScaleTest, NegativeSlopeIgnored_ScaledTimeBounded) {
  WorkScale shrinking;
  shrinking.SetReference(100);
  for (int i = 0; i < 12; ++i) {
    shrinking.Record(0, 0.1 - 1e-5 * kWorks[i % 4], kWorks[i % 4]);
  }
  EXPECT_EQ(shrinking.slope(), 0);

  WorkScale steep;
  steep.SetReference(100);
  // A slope that would take a small step's time below zero at the reference.
  for (int i = 0; i < 12; ++i) {
    steep.Record(0, 1e-3 * kWorks[i % 4] - 0.05, kWorks[i % 4]);
  }
  const double at_800 = 1e-3 * 800 - 0.05;
  const double scaled = steep.ToReference(at_800, 800);
  EXPECT_GE(scaled, at_800 * 100 / 800);
  EXPECT_LE(scaled, at_800);
  EXPECT_DOUBLE_EQ(scaled, at_800 * 100 / 800);
}

}  // namespace
}  // namespace tandem
