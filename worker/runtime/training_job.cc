#include "worker/runtime/training_job.h"

#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job/job_spec.h"
#include "common/models/graph_builder.h"
#include "common/status_macros.h"
#include "worker/data/micro_batch.h"
#include "worker/models/builtin_models.h"

namespace tandem {
namespace {

// Every rank must run the same graph: compare hashes before training.
absl::Status CheckSameGraph(const Graph& graph, Communicator& comm) {
  uint64_t hash = 0;
  if (!absl::SimpleHexAtoi(graph.StructuralHash(), &hash)) {
    return absl::InternalError("graph hash is not hex");
  }
  ASSIGN_OR_RETURN(
      std::vector<double> all,
      comm.AllGatherScalars({static_cast<double>(hash >> 32),
                             static_cast<double>(hash & 0xffffffffu)}));
  for (int r = 0; r < comm.world_size(); ++r) {
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", r,
                       " built a different graph than rank 0; start every "
                       "rank with the same job spec"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelParts> PrepareModel(const v1::JobSpec& spec, int world) {
  if (spec.parallel().zero_stage() != 3) {
    return absl::UnimplementedError(
        absl::StrCat("parallel.zero_stage ", spec.parallel().zero_stage(),
                     " is not supported by this worker yet; use 3"));
  }
  if (!spec.checkpoint().dir().empty()) {
    std::fprintf(stderr,
                 "tandem-worker: checkpoint.dir is set but checkpoints are "
                 "not written yet; training continues without them\n");
  }
  v1::JobSpec at_world = spec;
  at_world.mutable_parallel()->set_world_size(world);
  ModelParts parts;
  ASSIGN_OR_RETURN(parts.config, ModelConfigFromJobSpec(at_world));
  ASSIGN_OR_RETURN(parts.program,
                   BuildModelProgram(parts.config, spec.train().seed()));
  ASSIGN_OR_RETURN(
      parts.graph,
      DeriveGraph(parts.program, world, parts.config.grad_accum,
                  int64_t{parts.config.micro_batch} * parts.config.seq_len));
  ASSIGN_OR_RETURN(Graph estimates, BuildModelGraph(parts.config));
  RETURN_IF_ERROR(AnnotateEstimates(estimates, parts.graph));
  return parts;
}

absl::StatusOr<std::unique_ptr<TrainingJob>> TrainingJob::Start(
    const v1::JobSpec& spec, const ModelParts* model, int rank, int world,
    c10::intrusive_ptr<c10d::ProcessGroup> group, Schedule initial,
    MemoryMeter* meter) {
  std::unique_ptr<TrainingJob> job(new TrainingJob());
  job->model_ = model;
  job->rank_ = rank;
  job->world_ = world;
  const ModelConfig& config = model->config;
  if (spec.data().kind() == "tokens") {
    ASSIGN_OR_RETURN(
        job->data_, OpenTokenFile(spec.data().path(), spec.data().token_bytes(),
                                  config.vocab, config.seq_len));
  } else {
    job->data_ =
        MakeSyntheticTokens(spec.data().seed(), config.vocab, config.seq_len);
  }
  job->comm_ = std::make_unique<Communicator>(std::move(group));
  RETURN_IF_ERROR(CheckSameGraph(model->graph, *job->comm_));
  ASSIGN_OR_RETURN(job->store_,
                   ShardedParamStore::Create(model->program, rank, world));
  ExecutorOptions exec;
  exec.adamw.lr = spec.train().lr();
  exec.adamw.beta1 = spec.train().beta1();
  exec.adamw.beta2 = spec.train().beta2();
  exec.adamw.eps = spec.train().eps();
  exec.adamw.weight_decay = spec.train().weight_decay();
  exec.adamw.grad_clip = spec.train().grad_clip();
  exec.budget_bytes = spec.memory().budget_bytes();
  ASSIGN_OR_RETURN(
      job->executor_,
      Executor::Create(&model->program, model->graph, job->store_.get(),
                       job->comm_.get(), meter, std::move(initial), exec));
  return job;
}

absl::StatusOr<StepStats> TrainingJob::Step(int64_t step) {
  const ModelConfig& config = model_->config;
  ASSIGN_OR_RETURN(std::vector<MicroBatch> batches,
                   ReadRankBatches(*data_, step, config.grad_accum, rank_,
                                   world_, config.micro_batch));
  return executor_->RunStep(batches);
}

std::string StepJson(const StepStats& s, int rank) {
  auto json = [](double v) { return absl::StrFormat("%.17g", v); };
  return absl::StrCat("{\"step\":", s.step, ",\"loss\":", json(s.loss),
                      ",\"iteration_s\":", json(s.iteration_s),
                      ",\"exposed_comm_s\":", json(s.exposed_comm_s),
                      ",\"peak_bytes\":", s.peak_bytes,
                      ",\"schedule_version\":", s.schedule_version,
                      ",\"grad_norm\":", json(s.grad_norm), ",\"rank\":", rank,
                      "}");
}

}  // namespace tandem
