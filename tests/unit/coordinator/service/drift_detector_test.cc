#include "coordinator/service/drift_detector.h"

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <random>

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
  EXPECT_NEAR(d.window_median_s(), 1.2, 1e-12);
  EXPECT_FALSE(d.Observe(1.2, 0).has_value());  // quiet until re-planned
}

// A window of 3 tolerates one step back within the threshold: the median
// and two of three steps still say the job runs 50% slower.
TEST(DriftDetectorTest, Observe_OneStepWithinThreshold_StillFires) {
  DriftDetector d(0.10, 3, 0);
  d.SetPrediction(1.0, 0);
  EXPECT_FALSE(d.Observe(1.5, 0));
  EXPECT_FALSE(d.Observe(1.05, 0));
  EXPECT_EQ(d.Observe(1.5, 0).value_or(""), "drift");
}

TEST(DriftDetectorTest, Observe_TwoOfFiveWithinThreshold_DoesNotFire) {
  DriftDetector d(0.10, 5, 0);
  d.SetPrediction(1.0, 0);
  for (double t : {1.5, 1.0, 1.5, 1.0, 1.5, 1.0, 1.5, 1.0}) {
    EXPECT_FALSE(d.Observe(t, 0)) << t;
  }
}

TEST(DriftDetectorTest, Observe_SingleHugeOutlier_NeverFires) {
  for (int window : {3, 5, 8}) {
    DriftDetector d(0.10, window, 0);
    d.SetPrediction(1.0, 0);
    for (int i = 0; i < 50; ++i) {
      EXPECT_FALSE(d.Observe(i == 30 ? 5.0 : 1.0, 0)) << window << " " << i;
    }
  }
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

// A plan made to sit close to the budget (predicted 960 of 1000) that peaks
// where it said is not re-planned for memory (a small-budget job published
// a "memory" re-plan every window, one per plan); one over its prediction by
// more than the guard band (2% of the budget) is.
TEST(DriftDetectorTest, Observe_NearBudgetAsPredicted_NoMemoryReplan) {
  DriftDetector d(0.10, 5, 1000);
  d.SetPrediction(1.0, 960);
  EXPECT_FALSE(d.Observe(1.0, 975));
  EXPECT_FALSE(d.Observe(1.0, 980));
  EXPECT_EQ(d.Observe(1.0, 985).value_or(""), "memory");
}

TEST(DriftDetectorTest, Observe_NoPrediction_NeverDrifts) {
  DriftDetector d(0.10, 1, 0);
  EXPECT_FALSE(d.Observe(100, 0));
  EXPECT_FALSE(d.has_prediction());
  d.SetBudget(10);
  EXPECT_EQ(d.Observe(1, 10).value_or(""), "memory");
}

// CPU step times: lognormal around a level, each step correlated with the
// previous one, and rare stalls (a 1.5x to 5x step) that never last.
class NoisySteps {
 public:
  NoisySteps(uint64_t seed, double sigma, double spike_rate)
      : rng_(seed), sigma_(sigma), spike_rate_(spike_rate) {}
  double Next(double level) {
    // AR(1) in log space with correlation 0.3 and stationary sd sigma_.
    ar_ = 0.3 * ar_ + std::sqrt(1 - 0.09) * sigma_ * normal_(rng_);
    double t = level * std::exp(ar_);
    if (uniform_(rng_) < spike_rate_) t *= 1.5 + 3.5 * uniform_(rng_);
    return t;
  }

 private:
  std::mt19937_64 rng_;
  std::normal_distribution<double> normal_{0.0, 1.0};
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
  double sigma_;
  double spike_rate_;
  double ar_ = 0;
};

// Fires over `steps` steady steps at `level` predicted at `predicted`; after
// each fire the schedule is "re-planned" to the same prediction, as a
// re-plan that changed nothing would be.
int SteadyFires(uint64_t seed, double sigma, double spike_rate,
                double predicted, int steps) {
  NoisySteps noise(seed, sigma, spike_rate);
  DriftDetector d(0.10, 5, 0);
  for (int i = 0; i < 30; ++i) d.ObserveUnpredicted(noise.Next(0.02));
  d.SetPrediction(predicted, 0);
  int fires = 0;
  for (int i = 0; i < steps; ++i) {
    if (d.Observe(noise.Next(0.02), 0).has_value()) {
      ++fires;
      d.SetPrediction(predicted, 0);
    }
  }
  return fires;
}

// The target: under 1 false re-plan per 1000 steps on a steady job
// (bench/README.md, "drift"). 100k steps per case, fixed seeds.
TEST(DriftDetectorTest, Observe_SteadyNoisyJob_UnderOneFirePer1000Steps) {
  struct Case {
    double sigma, spike_rate, predicted;
    uint64_t seed;
  };
  // Quiet and noisy machines; a prediction on the level, 5% under it
  // (within the threshold) and 8% over it.
  for (const Case& c : {Case{0.03, 0.01, 0.020, 1}, Case{0.05, 0.02, 0.019, 2},
                        Case{0.10, 0.02, 0.020, 3}, Case{0.20, 0.05, 0.0216, 4},
                        Case{0.40, 0.05, 0.020, 5}}) {
    const int fires =
        SteadyFires(c.seed, c.sigma, c.spike_rate, c.predicted, 100000);
    EXPECT_LT(fires, 100) << "sigma " << c.sigma << " spikes " << c.spike_rate
                          << " seed " << c.seed;
  }
}

// The old rule (every step of the window beyond the threshold) fires on
// this noise far more often: the case above is not an easy one.
TEST(DriftDetectorTest, Observe_SteadyNoisyJob_NoiseGateIsWhatHoldsIt) {
  NoisySteps noise(7, 0.20, 0.05);
  int streak = 0, old_fires = 0;
  for (int i = 0; i < 100000; ++i) {
    streak = std::fabs(noise.Next(0.02) / 0.02 - 1) > 0.10 ? streak + 1 : 0;
    if (streak >= 5) {
      ++old_fires;
      streak = 0;
    }
  }
  EXPECT_GT(old_fires, 1000);
  EXPECT_LT(SteadyFires(7, 0.20, 0.05, 0.02, 100000), 100);
}

// A level shift (a throttled link, a slower machine) of +20% or +50% fires
// within drift_window steps of the change, on a machine with a few percent
// of noise and stalls.
TEST(DriftDetectorTest, Observe_LevelShift_FiresWithinWindow) {
  for (double shift : {1.2, 1.5}) {
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      NoisySteps noise(seed, 0.03, 0.01);
      DriftDetector d(0.10, 5, 0);
      d.SetPrediction(0.02, 0);
      for (int i = 0; i < 300; ++i) {
        ASSERT_FALSE(d.Observe(noise.Next(0.02), 0).has_value())
            << "steady step " << i << " seed " << seed;
      }
      int fired_after = -1;
      for (int i = 1; i <= 5 && fired_after < 0; ++i) {
        if (d.Observe(noise.Next(0.02 * shift), 0).has_value()) {
          fired_after = i;
        }
      }
      EXPECT_GE(fired_after, 1) << "shift " << shift << " seed " << seed;
      EXPECT_NEAR(d.score(), shift - 1, 0.1);
    }
  }
}

// Noise measured on the baseline counts for the first plan: a window 30%
// off on a job whose 5-step medians wander by more than that is noise; on a
// quiet job it is drift.
TEST(DriftDetectorTest, SetPrediction_CarriesBaselineNoise) {
  NoisySteps loud(3, 0.5, 0);
  DriftDetector noisy(0.10, 5, 0);
  for (int i = 0; i < 60; ++i) noisy.ObserveUnpredicted(loud.Next(1.0));
  noisy.SetPrediction(1.0, 0);
  EXPECT_GT(noisy.noise_bound(), 0.3);
  DriftDetector quiet(0.10, 5, 0);
  for (int i = 0; i < 60; ++i) quiet.ObserveUnpredicted(1.0);
  quiet.SetPrediction(1.0, 0);
  EXPECT_EQ(quiet.noise_bound(), 0.0);
  for (int i = 0; i < 4; ++i) {
    EXPECT_FALSE(noisy.Observe(1.3, 0));
    EXPECT_FALSE(quiet.Observe(1.3, 0));
  }
  EXPECT_FALSE(noisy.Observe(1.3, 0));
  EXPECT_EQ(quiet.Observe(1.3, 0).value_or(""), "drift");
}

// A link that flaps between two rates, on a noisy machine: each fire is
// re-planned, and the re-plan keeps the schedule at the window that fired
// (Rearm). The first flap fires (a second time at most, where the window
// that fired caught the slow level's noise); the flaps after go between
// levels the schedule is known at and fire nothing. Re-armed with
// SetPrediction instead (a new schedule each time), every flap fires.
TEST(DriftDetectorTest, Rearm_LinkFlapsBetweenTwoRates_FiresOnce) {
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    for (bool forget : {false, true}) {
      NoisySteps noise(seed, 0.03, 0.01);
      DriftDetector d(0.10, 5, 0);
      d.SetPrediction(1.0, 0);
      int fires = 0;
      int flaps = 0;
      for (int i = 0; i < 600; ++i) {
        // 60 steps fast, then 60 slow, and so on.
        const bool slow = (i / 60) % 2 == 1;
        if (i > 0 && i % 60 == 0) ++flaps;
        if (d.Observe(noise.Next(slow ? 1.6 : 1.0), 0).has_value()) {
          ++fires;
          if (forget) {
            d.SetPrediction(d.window_median_s(), 0);
          } else {
            d.Rearm(d.window_median_s(), 0);
          }
        }
      }
      if (forget) {
        EXPECT_GE(fires, flaps) << "seed " << seed;
      } else {
        // Once, or twice where the window that fired first read the slow
        // level more than the threshold off its later windows.
        EXPECT_LE(fires, 2) << "seed " << seed;
        ASSERT_FALSE(d.known_levels_s().empty());
        EXPECT_NEAR(d.known_levels_s().front(), 1.0, 1e-12);
      }
    }
  }
}

// Known levels are only a schedule's: a window at a third level still
// fires, and a new schedule (SetPrediction) forgets them all.
TEST(DriftDetectorTest, Rearm_ThirdLevelFires_NewScheduleForgets) {
  DriftDetector d(0.10, 3, 0);
  d.SetPrediction(1.0, 0);
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(d.Observe(1.5, 0));
  EXPECT_EQ(d.Observe(1.5, 0).value_or(""), "drift");
  d.Rearm(1.5, 0);
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(d.Observe(1.0, 0)) << i;
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(d.Observe(1.5, 0)) << i;
  EXPECT_FALSE(d.Observe(2.5, 0));  // the window's median is still 1.5
  EXPECT_EQ(d.Observe(2.5, 0).value_or(""), "drift");
  d.Rearm(2.5, 0);
  EXPECT_EQ(d.known_levels_s(), (std::deque<double>{1.0, 1.5}));
  d.SetPrediction(2.5, 0);
  EXPECT_TRUE(d.known_levels_s().empty());
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(d.Observe(1.0, 0));
  EXPECT_EQ(d.Observe(1.0, 0).value_or(""), "drift");
}

// One entry per level: a re-arm at a level already known (within the
// threshold) moves it, and the oldest go past kKnownLevels.
TEST(DriftDetectorTest, Rearm_KeepsOneEntryPerLevel_OldestOut) {
  DriftDetector d(0.10, 3, 0);
  d.SetPrediction(1.0, 0);
  d.Rearm(2.0, 0);
  d.Rearm(1.02, 0);  // back near 1.0: 1.0 is the expectation now
  EXPECT_EQ(d.known_levels_s(), (std::deque<double>{2.0}));
  for (double level : {3.0, 4.0, 5.0, 6.0, 7.0}) d.Rearm(level, 0);
  EXPECT_EQ(d.known_levels_s(), (std::deque<double>{3.0, 4.0, 5.0, 6.0}));
  EXPECT_EQ(d.known_levels_s().size(),
            static_cast<size_t>(DriftDetector::kKnownLevels));
}

// Known levels are the plan's: another plan's schedule forgets them, and a
// version that reruns the plan (a rollback, a baseline check) brings back
// those not at its new expectation.
TEST(DriftDetectorTest, Rearm_LevelsComeBackWithThePlan) {
  DriftDetector d(0.10, 3, 0);
  d.SetPrediction(1.0, 0, /*plan=*/1);
  d.Rearm(1.5, 0);
  d.Rearm(2.5, 0);
  EXPECT_EQ(d.known_levels_s(), (std::deque<double>{1.0, 1.5}));
  d.SetPrediction(0.8, 0, /*plan=*/2);
  EXPECT_TRUE(d.known_levels_s().empty());
  d.SetPrediction(1.5, 0, /*plan=*/1);
  EXPECT_EQ(d.known_levels_s(), (std::deque<double>{1.0}));
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(d.Observe(1.0, 0)) << i;
  d.SetPrediction(1.5, 0);  // no plan named: nothing known
  EXPECT_TRUE(d.known_levels_s().empty());
}

}  // namespace
}  // namespace tandem
