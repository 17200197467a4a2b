// One rank's training job, as both front ends (standalone and agent mode)
// build it from a job spec: the model program and its graph, the data, and,
// once the process group exists, the sharded store and the executor.
//
//   PrepareModel(spec)  ──>  ModelParts (program, graph)   no communication
//   StartTraining(...)  ──>  TrainingJob (store, executor)  collective
//   job.Step(step)      ──>  StepStats                      collective
#ifndef TANDEM_WORKER_RUNTIME_TRAINING_JOB_H_
#define TANDEM_WORKER_RUNTIME_TRAINING_JOB_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/ir/graph.h"
#include "common/ir/schedule.h"
#include "common/models/model_config.h"
#include "tandem/v1/job.pb.h"
#include "worker/data/token_source.h"
#include "worker/runtime/communicator.h"
#include "worker/runtime/executor.h"
#include "worker/runtime/memory_meter.h"
#include "worker/runtime/program.h"
#include "worker/runtime/sharded_param_store.h"

namespace tandem {

struct ModelParts {
  ModelConfig config;
  Program program;
  // DeriveGraph of the program, annotated with the builder's estimates.
  Graph graph;
};

// Builds the model of a validated spec at `world` ranks. Errors: the spec's
// model is invalid, or stage/features this worker cannot run yet.
absl::StatusOr<ModelParts> PrepareModel(const v1::JobSpec& spec, int world);

class TrainingJob {
 public:
  // Collective: every rank calls it with the same spec and graph. Checks
  // that all ranks built the same graph, shards the params and installs
  // `initial` (checked like Executor::Create). `model` and `meter` must
  // outlive the job.
  static absl::StatusOr<std::unique_ptr<TrainingJob>> Start(
      const v1::JobSpec& spec, const ModelParts* model, int rank, int world,
      c10::intrusive_ptr<c10d::ProcessGroup> group, Schedule initial,
      MemoryMeter* meter);

  // Runs iteration `step` on this rank's slice of the global batch.
  absl::StatusOr<StepStats> Step(int64_t step);

  Executor& executor() { return *executor_; }
  Communicator& comm() { return *comm_; }

 private:
  TrainingJob() = default;

  const ModelParts* model_ = nullptr;
  int rank_ = 0;
  int world_ = 1;
  std::unique_ptr<TokenSource> data_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<ShardedParamStore> store_;
  std::unique_ptr<Executor> executor_;
};

// One step's JSON line (without the newline):
// {"step":..,"loss":..,"iteration_s":..,"exposed_comm_s":..,"peak_bytes":..,
//  "schedule_version":..,"grad_norm":..,"rank":..}
std::string StepJson(const StepStats& stats, int rank);

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_TRAINING_JOB_H_
