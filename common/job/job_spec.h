// The job spec (tandem.v1.JobSpec, the YAML a user submits): defaults and
// field-level validation, shared by the coordinator (on Submit) and the worker
// (standalone mode), and the model config it implies.
#ifndef TANDEM_COMMON_JOB_JOB_SPEC_H_
#define TANDEM_COMMON_JOB_JOB_SPEC_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/models/model_config.h"
#include "tandem/v1/job.pb.h"

namespace tandem {

// Collective pieces (the spec's `comm`). On a link shaped to 200 Mbit/s (tbf,
// 50 ms of queue), two-way Gloo collectives sent whole ran at 12-17 MB/s per
// direction under sustained traffic, in 64 KiB pieces 4 in flight at 23.5
// (the link carries 25); at 2 Gbit/s whole messages were as fast or faster.
// comm.chunk_bytes 0 (the default) lets the workers measure the link at
// start: pieces below 64 MB/s per direction, whole above.
inline constexpr int64_t kDefaultCommChunkBytes = 64 << 10;
inline constexpr int32_t kDefaultCommMaxInFlight = 4;

// optimize.trial_margin when unset.
inline constexpr double kDefaultTrialMargin = 0.10;
// optimize.min_gain when unset.
inline constexpr double kDefaultMinGain = 0.03;
// optimize.baseline_pairs when unset, and its largest value.
inline constexpr int32_t kDefaultBaselinePairs = 4;
inline constexpr int32_t kMaxBaselinePairs = 16;

// Fills fields left at zero with their defaults: data.kind "synthetic",
// batch.grad_accum 1, train.{lr 1e-3, lr_schedule constant, beta1 0.9, beta2
// 0.95, eps 1e-8, grad_clip 1.0} (weight_decay, warmup_steps and min_lr
// default to 0), parallel.{world_size 1, zero_stage 3}, optimize.{policy
// tandem unless passes are given, warmup_steps 3, drift_threshold 0.1,
// drift_window 5, trial_margin 0.10 when unset}, comm.max_in_flight 4
// (comm.chunk_bytes 0: automatic), data.token_bytes 2, model.dtype f32,
// train.master_dtype f32, train.reduce_dtype model.dtype and, for presets with
// a known shape, model sizes. Idempotent.
void ApplyJobSpecDefaults(v1::JobSpec& spec);

// Checks optimize.policy and optimize.passes against the planner's pass
// registry, one message per problem, each starting with the field's path.
// The coordinator supplies it (coordinator/planner/job_plan.h); the worker,
// which does not plan, validates without one.
using PlanSpecCheck = std::function<std::vector<std::string>(
    const v1::OptimizeSpec& optimize, int32_t zero_stage)>;

// Checks every field and returns InvalidArgument listing each problem by its
// path, e.g. "parallel.world_size must be >= 1, got 0; batch.seq_len must be
// >= 1, got -4". Call after ApplyJobSpecDefaults.
absl::Status ValidateJobSpec(const v1::JobSpec& spec,
                             const PlanSpecCheck& plan_check = nullptr);

// What a job's model is, for `tandem status`, the report and the progress
// line: `text` describes it (a builtin model by its preset and shapes, an
// exported one by its units, params, inputs and glues, read from its
// archive's manifest); a step trains on `items_per_step` `unit`s ("tokens"
// when the model reads a token sequence from a token source, "samples"
// otherwise). Call after ValidateJobSpec.
struct JobModelDescription {
  std::string text;
  std::string unit;
  int64_t items_per_step = 0;
};
JobModelDescription DescribeJobModel(const v1::JobSpec& spec);

// Directories an operator lets jobs use (the coordinator's --data-roots and
// --checkpoint-roots). `read` bounds what a job reads (data.path,
// model.path, model.init_from), `write` where it writes (checkpoint.dir); a
// job may also read under a write root (its own checkpoints). An empty list
// allows any path outside the system's directories, which ValidateJobSpec
// refuses in any case.
struct JobPathRoots {
  std::vector<std::string> read;
  std::vector<std::string> write;
};

// InvalidArgument naming each field whose path is not under one of its
// roots, e.g. "checkpoint.dir '/home/x' is not under a checkpoint root this
// coordinator allows (/shared/ckpt); ...". With or without roots, a path
// that is relative (it would depend on some process's directory) or has a
// ".." component is refused: the coordinator checks this before it opens
// anything a spec names. Paths are otherwise judged as written.
absl::Status CheckJobPathRoots(const v1::JobSpec& spec,
                               const JobPathRoots& roots);

// The worker's check before it opens anything a spec names, whoever sent
// the spec: each path field (data.path, model.path, model.init_from,
// checkpoint.dir) with its symlinks resolved (the part that exists; a
// checkpoint directory not made yet is taken as written beyond it), and
// refused, InvalidArgument naming the field and where it leads, when that
// is among the system's files (as ValidateJobSpec judges a path as
// written). Returns the spec with the resolved paths, which the worker then
// opens. No error quotes a file's content.
absl::StatusOr<v1::JobSpec> ResolveJobPaths(v1::JobSpec spec);

// The model the spec describes, at the spec's world size, micro-batch and
// sequence length. Fails like ValidateJobSpec.
absl::StatusOr<ModelConfig> ModelConfigFromJobSpec(const v1::JobSpec& spec);

// model.dtype and train.reduce_dtype into `c`: unset, the dtype is f32 and
// the reduce dtype model.dtype's (ModelConfig's nullopt). For builtin models
// (ModelConfigFromJobSpec) and exported ones alike.
void SetPrecisionFromJobSpec(const v1::JobSpec& spec, ModelConfig& c);

// Whether a rank on `device` ("cpu", "cuda:<n>"; empty: not reported) can
// run `spec`: FailedPrecondition, saying why and what to change, when
// model.dtype is f16 and the device is not CUDA (f16 has CUDA kernels only),
// or when the device is not what hardware.device declares. The coordinator
// asks it when a rank registers, the worker before it trains.
absl::Status CheckRankDevice(const v1::JobSpec& spec, absl::string_view device,
                             absl::string_view who);

}  // namespace tandem

#endif  // TANDEM_COMMON_JOB_JOB_SPEC_H_
