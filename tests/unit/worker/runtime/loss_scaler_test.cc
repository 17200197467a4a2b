// The loss scaler against torch.amp.GradScaler's rules (its update():
// _amp_update_scale_): tables of overflow patterns and the scales GradScaler
// produces for them, worked out from its documented rules, not from
// LossScaler's code.
#include "worker/runtime/loss_scaler.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

LossScaleOptions Dynamic(float init, int32_t interval, double growth = 2.0,
                         double backoff = 0.5) {
  LossScaleOptions o;
  o.enabled = true;
  o.init_scale = init;
  o.growth_factor = growth;
  o.backoff_factor = backoff;
  o.growth_interval = interval;
  return o;
}

struct Case {
  const char* name;
  LossScaleOptions options;
  // 'x': the step overflowed (found_inf), '.': it did not.
  std::string pattern;
  // The scale after each step, as GradScaler.get_scale() reads it.
  std::vector<float> scales;
  int32_t tracker_after;
  int64_t skipped_after;
};

TEST(LossScalerTest, FollowsGradScalerSequence) {
  const Case cases[] = {
      // GradScaler's defaults: the first steps of a job whose first two
      // steps overflow (a 16-bit model's usual start).
      {"defaults_start",
       Dynamic(65536.0f, 2000),
       "xx....",
       {32768.0f, 16384.0f, 16384.0f, 16384.0f, 16384.0f, 16384.0f},
       4,
       2},
      // Growth after `interval` clean steps in a row; an overflow resets the
      // count, so growth needs `interval` clean steps again.
      {"growth_and_reset",
       Dynamic(8.0f, 3),
       "...x....x...",
       {8, 8, 16, 8, 8, 8, 16, 16, 8, 8, 8, 16},
       0,
       2},
      // Other factors: the products are taken in double and rounded to fp32.
      {"other_factors",
       Dynamic(1000.0f, 2, 3.0, 0.25),
       "..x..x",
       {1000, 3000, 750, 750, 2250, 562.5f},
       0,
       2},
      // Interval 1: every clean step grows.
      {"interval_one", Dynamic(1.0f, 1), "...x.", {2, 4, 8, 4, 8}, 0, 1},
      // A non-power-of-two factor rounds in fp32 exactly as GradScaler's
      // kernel does: float(double(scale) * factor).
      {"rounded",
       Dynamic(1.0f, 1, 1.1, 0.5),
       "...",
       {static_cast<float>(1.0 * 1.1),
        static_cast<float>(static_cast<double>(static_cast<float>(1.1)) * 1.1),
        static_cast<float>(
            static_cast<double>(static_cast<float>(
                static_cast<double>(static_cast<float>(1.1)) * 1.1)) *
            1.1)},
       0,
       0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_EQ(c.pattern.size(), c.scales.size());
    LossScaler scaler(c.options);
    EXPECT_EQ(scaler.scale(), c.options.init_scale);
    for (size_t i = 0; i < c.pattern.size(); ++i) {
      scaler.Update(c.pattern[i] == 'x');
      EXPECT_EQ(scaler.scale(), c.scales[i]) << "after step " << i;
    }
    EXPECT_EQ(scaler.state().growth_tracker, c.tracker_after);
    EXPECT_EQ(scaler.state().skipped_steps, c.skipped_after);
  }
}

TEST(LossScalerTest, GrowthStopsShortOfInfinity) {
  // GradScaler does not grow the scale past fp32's range: the product
  // would be infinite, so the scale stays and the tracker resets.
  const float big = std::numeric_limits<float>::max() / 1.5f;
  LossScaler scaler(Dynamic(big, 1));
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), big);
  EXPECT_EQ(scaler.state().growth_tracker, 0);
}

TEST(LossScalerTest, InverseScaleIsRoundedFromDouble) {
  LossScaler pow2(Dynamic(65536.0f, 10));
  EXPECT_EQ(pow2.inv_scale(), 1.0f / 65536.0f);
  LossScaler odd(Dynamic(3.0f, 10));
  EXPECT_EQ(odd.inv_scale(), static_cast<float>(1.0 / 3.0));
}

TEST(LossScalerTest, Disabled_ScaleOneAndNothingCounted) {
  LossScaler off(LossScaleOptions{});
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.scale(), 1.0f);
  EXPECT_EQ(off.inv_scale(), 1.0f);
  off.Update(true);
  off.Update(false);
  EXPECT_EQ(off.scale(), 1.0f);
  EXPECT_EQ(off.state().skipped_steps, 0);
}

TEST(LossScalerTest, CheckpointBlob_RoundTripsAndRefusesDamage) {
  LossScaleState s;
  s.scale = 1024.5f;
  s.growth_tracker = 17;
  s.skipped_steps = 3;
  const std::string blob = LossScaler::Serialize(s);
  EXPECT_EQ(blob.size(), 20u);
  absl::StatusOr<LossScaleState> back = LossScaler::Parse(blob);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, s);

  LossScaler scaler(Dynamic(65536.0f, 2000));
  ASSERT_TRUE(scaler.Restore(*back).ok());
  EXPECT_EQ(scaler.scale(), 1024.5f);
  scaler.Update(true);
  EXPECT_EQ(scaler.state().skipped_steps, 4);

  EXPECT_EQ(LossScaler::Parse(blob.substr(0, 19)).status().code(),
            absl::StatusCode::kDataLoss);
  std::string wrong_magic = blob;
  wrong_magic[0] = 'X';
  EXPECT_THAT(LossScaler::Parse(wrong_magic).status().message(),
              HasSubstr("damaged"));
  LossScaleState bad = s;
  bad.scale = std::numeric_limits<float>::infinity();
  EXPECT_THAT(LossScaler::Parse(LossScaler::Serialize(bad)).status().message(),
              HasSubstr("not a positive number"));
  bad = s;
  bad.skipped_steps = -1;
  EXPECT_EQ(LossScaler::Parse(LossScaler::Serialize(bad)).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(scaler.Restore(bad).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
