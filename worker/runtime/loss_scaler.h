// Dynamic loss scaling (worker/README.md, "Loss scaling"): the rules of
// torch.amp.GradScaler, for any model dtype. The loss is multiplied by
// scale() before backward, so that small gradients survive a 16-bit
// gradient; the optimizer divides it out again. A step whose gradients hold
// an infinity or a NaN on any rank is skipped on every rank (the ranks
// decide it in the step's existing exchange: the global squared gradient
// norm is not finite), and the scale backs off; after `growth_interval`
// steps in a row without one, the scale grows.
//
// Update() is GradScaler.update()'s `_amp_update_scale_`, operation for
// operation: the scale is an fp32 value, the growth tracker an int32.
//
//   found_inf:  scale *= backoff_factor; tracker = 0
//   otherwise:  tracker += 1; when tracker == growth_interval:
//                 scale *= growth_factor (only if that is finite); tracker = 0
//
// The state (scale, tracker, and the steps skipped so far, which AdamW's bias
// correction leaves out as torch's optimizer.step() never ran for them)
// travels in checkpoints as one small blob, identical on every rank.
//
// No libtorch: the rules are tested in isolation.
#ifndef TANDEM_WORKER_RUNTIME_LOSS_SCALER_H_
#define TANDEM_WORKER_RUNTIME_LOSS_SCALER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// GradScaler's constructor arguments and defaults. `enabled` false: the
// scale is 1, no step is skipped, and the executor runs as without a scaler.
struct LossScaleOptions {
  bool enabled = false;
  float init_scale = 65536.0f;
  // Doubles, as GradScaler passes them to the kernel; each product is
  // rounded to fp32.
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int32_t growth_interval = 2000;
};

struct LossScaleState {
  float scale = 1.0f;
  int32_t growth_tracker = 0;
  // Steps skipped since the job began (over restarts).
  int64_t skipped_steps = 0;

  bool operator==(const LossScaleState& o) const {
    return scale == o.scale && growth_tracker == o.growth_tracker &&
           skipped_steps == o.skipped_steps;
  }
};

class LossScaler {
 public:
  // The scale starts at options.init_scale when enabled, else 1.
  explicit LossScaler(const LossScaleOptions& options);

  bool enabled() const { return options_.enabled; }
  // The factor this step's loss is multiplied by before backward.
  float scale() const { return state_.scale; }
  // 1 / scale in fp32, as GradScaler's unscale_ computes it (in double, then
  // rounded): the factor the gradients are multiplied by before the
  // optimizer.
  float inv_scale() const;
  const LossScaleState& state() const { return state_; }

  // Ends a step: `found_inf` when any rank's gradients were not finite (the
  // step was skipped). No-op when disabled.
  void Update(bool found_inf);

  // Restores a checkpoint's state. InvalidArgument for a non-positive or
  // non-finite scale, or a negative count.
  absl::Status Restore(const LossScaleState& state);

  // The checkpoint blob: fixed-width little-endian fields.
  static std::string Serialize(const LossScaleState& state);
  // DataLoss for a blob of the wrong size or with impossible values.
  static absl::StatusOr<LossScaleState> Parse(absl::string_view blob);

 private:
  LossScaleOptions options_;
  LossScaleState state_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_LOSS_SCALER_H_
