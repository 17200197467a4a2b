// One rank's training job, as both front ends (standalone and agent mode)
// build it from a job spec: the model program and its graph, the data, and,
// once the process group exists, the sharded store and the executor.
//
//   PrepareModel(spec)  ──>  ModelParts (program, graph)   no communication
//   StartTraining(...)  ──>  TrainingJob (store, executor)  collective
//   job.Step(step)      ──>  StepStats                      collective
//
// With checkpoint.dir set, Start resumes from the newest complete checkpoint
// there (first_step() says where training continues; a checkpoint that
// fails verification on any rank is logged and the previous complete one is
// used), and Step writes one every checkpoint.every steps
// (worker/checkpoint/checkpoint_files.h).
#ifndef TANDEM_WORKER_TRAINER_TRAINING_JOB_H_
#define TANDEM_WORKER_TRAINER_TRAINING_JOB_H_

#include <future>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/ir/graph.h"
#include "common/ir/schedule.h"
#include "common/models/model_config.h"
#include "tandem/v1/job.pb.h"
#include "worker/checkpoint/checkpoint_files.h"
#include "worker/data/micro_batch.h"
#include "worker/data/tensor_source.h"
#include "worker/data/token_source.h"
#include "worker/runtime/communicator.h"
#include "worker/runtime/executor.h"
#include "worker/runtime/iteration_report.h"
#include "worker/runtime/memory_meter.h"
#include "worker/runtime/program.h"
#include "worker/runtime/sharded_param_store.h"

namespace tandem {

struct ModelParts {
  // For a builtin model, the model; for an archive (model.kind torchscript)
  // only the batch shape, vocab and world.
  ModelConfig config;
  Program program;
  // DeriveGraph of the program; a builtin model's annotated with the
  // builder's estimates, an archive's left at zero (times come from
  // profiles).
  Graph graph;
  // The program inputs the token data sources feed (unused with data.kind
  // tensors, which feeds every input by name).
  TokenInputs token_inputs;
};

// Builds the model of a validated spec at `world` ranks: the builtin model,
// or the archive at model.path (model.kind torchscript, loaded with
// LoadArchiveProgram). Errors: the spec's model is invalid, or
// stage/features this worker cannot run yet.
absl::StatusOr<ModelParts> PrepareModel(const v1::JobSpec& spec, int world);

// Settings of this worker process rather than of the job.
struct TrainingJobOptions {
  // Directory of the host tier's files when a schedule offloads (empty:
  // $TANDEM_OFFLOAD_DIR, $TMPDIR or /tmp).
  std::string offload_dir;
  // Where the shards, the gathered params, the optimizer states and the
  // micro-batches live: the CPU or one GPU (cuda:N, current on the calling
  // thread).
  at::Device device = at::Device(at::kCPU);
  // Measure what transfers take from compute at start (interference
  // probe, a few tenths of a second) and report it in every profile.
  bool interference_probe = true;
};

class TrainingJob {
 public:
  // Collective: every rank calls it with the same spec and graph. Checks
  // that all ranks built the same graph, shards the params and installs
  // `initial` (checked like Executor::Create). `model` and `meter` must
  // outlive the job. `initial`'s mode must be the spec's zero_stage. Resumes
  // from a checkpoint when there is one, resharded when it was written at
  // another world size. Errors besides the executor's: FailedPrecondition
  // when the newest checkpoint is of another model or format version (the
  // message says how to go on).
  static absl::StatusOr<std::unique_ptr<TrainingJob>> Start(
      const v1::JobSpec& spec, const ModelParts* model, int rank, int world,
      c10::intrusive_ptr<c10d::ProcessGroup> group, Schedule initial,
      MemoryMeter* meter, const TrainingJobOptions& options = {});

  // The first step to run: 0, or the step the resumed checkpoint was taken
  // after.
  int64_t first_step() const { return first_step_; }

  // Runs iteration `step` on this rank's slice of the global batch, reports
  // it to the observer, if any, and writes a checkpoint when one is due
  // (collective). A failed checkpoint write is logged, not fatal.
  absl::StatusOr<StepStats> Step(int64_t step);

  // Receives an IterationReport after every step (nullptr: none); must
  // outlive the job.
  void set_observer(IterationObserver* observer) { observer_ = observer; }

  Executor& executor() { return *executor_; }
  Communicator& comm() { return *comm_; }

  // The run's last JSON line (without the newline), identical on every rank
  // but for "rank": {"param_digests":{"<param>":..,...},"steps":N,"rank":r},
  // the digests of Executor::ParamDigests. Collective.
  absl::StatusOr<std::string> FinalJson();

  // A checkpoint file still being written is finished at full speed first.
  ~TrainingJob();

 private:
  TrainingJob() = default;
  absl::StatusOr<StepStats> RunAndReport(int64_t step);
  // Restores the newest usable checkpoint into the store; returns its step
  // (0 when there is none).
  absl::StatusOr<int64_t> Resume();
  // Starts the checkpoint after `steps_done` steps: snapshots this rank's
  // state (copies) and writes its file in the background, paced over half
  // the checkpoint interval at `step_s` per step (WritePace);
  // FinishCheckpoint writes the manifest once every rank's file is durable.
  // Waits for an earlier one still in flight first (collective).
  absl::Status WriteCheckpoint(int64_t steps_done, double step_s);
  // Collective, with pending_ set: when every rank's write is done (or,
  // with `wait`, after waiting for this rank's), rank 0 writes the manifest
  // if every write succeeded, and pending_ is cleared; otherwise nothing
  // changes. A failed write is logged, never fatal.
  absl::Status FinishCheckpoint(bool wait);

  const ModelParts* model_ = nullptr;
  int rank_ = 0;
  int world_ = 1;
  // The token source, or (data.kind tensors) the tensors source, or
  // (data.kind synthetic, a model with an input of no role) the synthetic
  // inputs.
  std::unique_ptr<TokenSource> data_;
  std::unique_ptr<TensorSource> tensors_;
  std::unique_ptr<SyntheticInputs> synthetic_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<ShardedParamStore> store_;
  std::unique_ptr<Executor> executor_;
  MemoryMeter* meter_ = nullptr;
  at::Device device_ = at::Device(at::kCPU);
  IterationObserver* observer_ = nullptr;
  int64_t budget_bytes_ = 0;
  int64_t sharded_param_bytes_ = 0;
  // The footprint of the schedule version last reported.
  int64_t footprint_version_ = -1;
  ScheduleFootprint footprint_;
  // Checkpoints: null when checkpoint.dir is empty.
  std::unique_ptr<CheckpointDirectory> checkpoints_;
  // A checkpoint whose rank file is being written in the background.
  struct PendingCheckpoint {
    CheckpointMeta meta;
    std::future<absl::Status> written;
    // What the writer writes from; snapshot_ once it is done.
    std::shared_ptr<RankCheckpoint> state;
    // Set when someone waits for the write: the writer stops pacing.
    std::shared_ptr<std::atomic<bool>> hurry;
  };
  std::optional<PendingCheckpoint> pending_;
  // The last written snapshot, kept so that the next one reuses its
  // buffers (FillCheckpoint).
  std::shared_ptr<RankCheckpoint> snapshot_;
  int64_t checkpoint_every_ = 0;
  bool checkpoint_sync_ = false;  // CheckpointSpec.sync
  int64_t first_step_ = 0;
  // train.loss_scale.mode dynamic; the scaler's state the resumed
  // checkpoint held (none: a fresh scaler).
  bool loss_scaling_ = false;
  std::optional<LossScaleState> restored_loss_scale_;
  // The data's position: step s reads the global batch that starts at
  // sequence data_origin_sequence_ + (s - data_origin_step_) *
  // GlobalBatch() (a resume at another global batch size goes on where
  // the checkpoint's data stopped).
  int64_t data_origin_step_ = 0;
  int64_t data_origin_sequence_ = 0;
  // Sequences (samples) per step over all ranks.
  int64_t GlobalBatch() const {
    return int64_t{model_->config.micro_batch} * model_->config.grad_accum *
           world_;
  }
  // train.steps.
  int64_t steps_ = 0;
};

// One step's JSON line (without the newline):
// {"step":..,"loss":..,"iteration_s":..,"exposed_comm_s":..,"peak_bytes":..,
//  "schedule_version":..,"grad_norm":..,"rank":..}, with "loss_scale" and
// "skipped" under loss scaling. Always valid JSON: a non-finite value is
// null, and a non-finite loss adds "loss_nonfinite": "NaN", "inf" or "-inf".
std::string StepJson(const StepStats& stats, int rank);

// Aborted, "loss became NaN at step S (train.on_nonfinite: stop): ..."
// with what to change, when the step's loss is not finite and the spec's
// train.on_nonfinite is not "continue". Call after the step is reported,
// so that it is kept on record.
absl::Status CheckFiniteLoss(const v1::JobSpec& spec, const StepStats& stats);

}  // namespace tandem

#endif  // TANDEM_WORKER_TRAINER_TRAINING_JOB_H_
