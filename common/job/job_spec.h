// The job spec (tandem.v1.JobSpec, the YAML a user submits): defaults and
// field-level validation, shared by the coordinator (on Submit) and the worker
// (standalone mode), and the model config it implies.
#ifndef TANDEM_COMMON_JOB_JOB_SPEC_H_
#define TANDEM_COMMON_JOB_JOB_SPEC_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/models/model_config.h"
#include "tandem/v1/job.pb.h"

namespace tandem {

// Fills fields left at zero with their defaults: data.kind "synthetic",
// batch.grad_accum 1, train.{lr 1e-3, weight_decay 0, beta1 0.9, beta2 0.95,
// eps 1e-8, grad_clip 1.0}, parallel.{world_size 1, zero_stage 3},
// optimize.{passes [tandem pipeline], warmup_steps 3, drift_threshold 0.1,
// drift_window 5}, data.token_bytes 2, model.dtype f32 and, for presets with a
// known shape, model sizes. Idempotent.
void ApplyJobSpecDefaults(v1::JobSpec& spec);

// Checks every field and returns InvalidArgument listing each problem by its
// path, e.g. "parallel.world_size must be >= 1, got 0; batch.seq_len must be
// >= 1, got -4". Call after ApplyJobSpecDefaults.
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// The model the spec describes, at the spec's world size, micro-batch and
// sequence length. Fails like ValidateJobSpec.
absl::StatusOr<ModelConfig> ModelConfigFromJobSpec(const v1::JobSpec& spec);

}  // namespace tandem

#endif  // TANDEM_COMMON_JOB_JOB_SPEC_H_
