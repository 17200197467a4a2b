#include "common/job/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace tandem {
namespace {

// Python's math.pi, which torch's CosineAnnealingLR uses.
constexpr double kPi = 3.141592653589793;

}  // namespace

double LearningRate(const v1::TrainSpec& train, int64_t step) {
  const double lr = train.lr();
  const int64_t warmup = std::max<int64_t>(train.warmup_steps(), 0);
  step = std::max<int64_t>(step, 0);
  if (step < warmup) {
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup + 1);
  }
  const std::string& kind = train.lr_schedule();
  const int64_t decay_steps = train.steps() - warmup;
  if (decay_steps <= 0 || (kind != "cosine" && kind != "linear")) return lr;
  const double floor = train.min_lr();
  const double e = static_cast<double>(std::min(step - warmup, decay_steps));
  const double d = static_cast<double>(decay_steps);
  if (kind == "cosine") {
    // CosineAnnealingLR's closed form, operation for operation.
    return floor + (lr - floor) * (1 + std::cos(kPi * e / d)) / 2;
  }
  return lr - (lr - floor) * e / d;
}

}  // namespace tandem
