#include "worker/trainer/training_job.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/job/job_spec.h"
#include "common/job/lr_schedule.h"
#include "common/json_string.h"
#include "common/models/graph_builder.h"
#include "common/status_macros.h"
#include "worker/checkpoint/sharded_checkpoint.h"
#include "worker/data/micro_batch.h"
#include "worker/models/archive_program.h"
#include "worker/models/builtin_models.h"
#include "worker/models/init_from.h"
#include "worker/runtime/interference_probe.h"
#include "worker/runtime/torch_status.h"

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

// Complete checkpoints kept besides the newest (a corrupted newest one
// falls back to these).
constexpr int kCheckpointsKept = 3;
// A background checkpoint's file is written over this share of the
// checkpoint interval (checkpoint.every steps at the snapshot step's time).
constexpr double kCheckpointSpread = 0.5;

// Seeds libtorch's default CPU generator, and `device`'s when it is a GPU,
// with seed * 1000003 + rank: what the model's random ops (dropout) draw
// from. Unseeded, libtorch seeds them from /dev/urandom, and a run with
// dropout would not repeat.
void SeedGenerators(uint64_t seed, int rank, const c10::Device& device) {
  const uint64_t value = seed * 1000003u + static_cast<uint64_t>(rank);
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_current_seed(value);
  }
  if (!device.is_cpu()) {
    at::Generator own = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(own.mutex());
    own.set_current_seed(value);
  }
}

}  // namespace

absl::StatusOr<ModelParts> PrepareModel(const v1::JobSpec& spec, int world) {
  if (spec.parallel().zero_stage() != 3 && spec.parallel().zero_stage() != 1) {
    return absl::UnimplementedError(
        absl::StrCat("parallel.zero_stage ", spec.parallel().zero_stage(),
                     " is not supported by this worker; use 1 or 3"));
  }
  v1::JobSpec at_world = spec;
  at_world.mutable_parallel()->set_world_size(world);
  ModelParts parts;
  if (spec.model().kind() == "torchscript") {
    // An exported archive: its own shapes, no analytic estimates (the
    // planner times its nodes from profiles).
    ModelConfig& c = parts.config;
    c.name = spec.name().empty() ? "job" : spec.name();
    c.vocab = spec.model().vocab();
    c.seq_len = spec.batch().seq_len();
    c.micro_batch = spec.batch().micro_batch();
    c.grad_accum = spec.batch().grad_accum();
    c.world_size = world;
    SetPrecisionFromJobSpec(spec, c);
    ArchiveProgramOptions options;
    options.activation_checkpointing = spec.model().activation_checkpointing();
    options.dtype = c.dtype;
    options.reduce_dtype = c.reduce_dtype.value_or(c.dtype);
    ASSIGN_OR_RETURN(parts.program,
                     LoadArchiveProgram(spec.model().path(), options));
    if (!spec.model().init_from().empty()) {
      RETURN_IF_ERROR(
          InitFromWeightsFile(spec.model().init_from(), parts.program));
    }
    // The tensors source feeds every input by name, and so does the
    // synthetic one for a model with an input of no role; the token
    // sources need the roles.
    if (spec.data().kind() != "tensors" && !HasNamedInputs(parts.program)) {
      ASSIGN_OR_RETURN(parts.token_inputs, TokenInputsOf(parts.program));
    }
    ASSIGN_OR_RETURN(parts.graph,
                     DeriveGraph(parts.program, world, c.grad_accum,
                                 int64_t{c.micro_batch} * c.seq_len));
    return parts;
  }
  ASSIGN_OR_RETURN(parts.config, ModelConfigFromJobSpec(at_world));
  ASSIGN_OR_RETURN(parts.program,
                   BuildModelProgram(parts.config, spec.train().seed()));
  if (!spec.model().init_from().empty()) {
    RETURN_IF_ERROR(
        InitFromWeightsFile(spec.model().init_from(), parts.program));
  }
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
    MemoryMeter* meter, const TrainingJobOptions& options) {
  const ShardingMode mode = spec.parallel().zero_stage() == 1
                                ? ShardingMode::kZero1
                                : ShardingMode::kZero3;
  if (initial.mode != mode) {
    return absl::FailedPreconditionError(absl::StrCat(
        "schedule v", initial.version, " is a ", ShardingModeName(initial.mode),
        " schedule, but the job spec says parallel.zero_stage ",
        spec.parallel().zero_stage(), "; plan the schedule for ",
        ShardingModeName(mode)));
  }
  // f16 runs on CUDA only, and a declared hardware.device must be this
  // rank's: the coordinator checked it at registration, standalone mode not.
  RETURN_IF_ERROR(
      CheckRankDevice(spec, options.device.str(), absl::StrCat("rank ", rank)));
  std::unique_ptr<TrainingJob> job(new TrainingJob());
  job->model_ = model;
  job->loss_scaling_ = spec.train().loss_scale().mode() == "dynamic";
  job->rank_ = rank;
  job->world_ = world;
  job->steps_ = spec.train().steps();
  const ModelConfig& config = model->config;
  if (spec.data().kind() == "tensors") {
    ASSIGN_OR_RETURN(job->tensors_,
                     TensorSource::Open(spec.data().path(),
                                        ArchiveInputsOf(model->program)));
  } else if (HasNamedInputs(model->program)) {
    // data.kind synthetic (the job spec admits nothing else here).
    ASSIGN_OR_RETURN(job->synthetic_,
                     SyntheticInputs::Make(ArchiveInputsOf(model->program),
                                           spec.data().seed(), config.vocab,
                                           config.seq_len));
  } else if (spec.data().kind() == "tokens") {
    ASSIGN_OR_RETURN(
        job->data_, OpenTokenFile(spec.data().path(), spec.data().token_bytes(),
                                  config.vocab, config.seq_len));
  } else {
    job->data_ =
        MakeSyntheticTokens(spec.data().seed(), config.vocab, config.seq_len);
  }
  job->comm_ = std::make_unique<Communicator>(std::move(group),
                                              CommOptionsFromSpec(spec));
  // Everything from here on may run collectives. One that fails (a peer
  // died before its first step) is marked as such: the caller has no
  // Communicator left to ask, and a lost peer is for the coordinator to
  // judge, not this rank's error.
  absl::Status setup = [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckSameGraph(model->graph, *job->comm_));
    ASSIGN_OR_RETURN(const ChunkTuning tuning, job->comm_->TuneChunkBytes());
    if (tuning.tuned()) {
      absl::FPrintF(
          stderr,
          "rank %d: link %.1f MB/s out of each rank (%d MiB all-gather "
          "in %d KiB pieces: %.3f s): collectives %s\n",
          rank, tuning.rate() / 1e6, tuning.probe_bytes >> 20,
          kDefaultCommChunkBytes >> 10, tuning.probe_s,
          tuning.chunk_bytes == kWholeMessages
              ? std::string("whole")
              : absl::StrCat("in ", tuning.chunk_bytes >> 10, " KiB pieces"));
    }
    job->device_ = options.device;
    InterferenceProbe interference;
    if (options.interference_probe) {
      InterferenceProbeOptions probe_options;
      probe_options.link_bytes_per_s = tuning.rate();
      probe_options.offload_dir = options.offload_dir;
      ASSIGN_OR_RETURN(
          interference,
          MeasureInterference(*job->comm_, options.device, probe_options));
      absl::FPrintF(stderr,
                    "rank %d: transfers take compute: %.3g s per GB "
                    "all-gathered, %.3g reduce-scattered (the slower rank's; "
                    "this rank's own %.3g and %.3g), %.3g copied to the "
                    "host tier; compute makes them %.2fx, %.2fx and %.2fx as "
                    "long (probe %.2f s)\n",
                    rank, interference.compute_s_per_allgather_byte * 1e9,
                    interference.compute_s_per_reduce_scatter_byte * 1e9,
                    interference.own_compute_s_per_allgather_byte * 1e9,
                    interference.own_compute_s_per_reduce_scatter_byte * 1e9,
                    interference.compute_s_per_copy_byte * 1e9,
                    interference.allgather_stretch,
                    interference.reduce_scatter_stretch,
                    interference.copy_stretch, interference.probe_s);
    }
    // Random ops in the model (dropout) draw from the default generators:
    // seeded from train.seed and the rank, so a run repeats itself and the
    // ranks draw different numbers. A resume then restores the checkpoint's
    // CPU generator state.
    RETURN_IF_ERROR(TorchCall("seeding the random generators", [&] {
      SeedGenerators(spec.train().seed(), rank, options.device);
    }));
    ASSIGN_OR_RETURN(
        job->store_,
        ShardedParamStore::Create(model->program, rank, world, options.device));
    if (!spec.checkpoint().dir().empty()) {
      job->checkpoints_ =
          std::make_unique<CheckpointDirectory>(spec.checkpoint().dir());
      job->checkpoint_every_ = spec.checkpoint().every();
      job->checkpoint_sync_ = spec.checkpoint().sync();
      ASSIGN_OR_RETURN(job->first_step_, job->Resume());
    }
    ExecutorOptions exec;
    exec.offload_dir = options.offload_dir;
    exec.first_step = job->first_step_;
    exec.adamw.lr = spec.train().lr();
    exec.adamw.beta1 = spec.train().beta1();
    exec.adamw.beta2 = spec.train().beta2();
    exec.adamw.eps = spec.train().eps();
    exec.adamw.weight_decay = spec.train().weight_decay();
    exec.adamw.grad_clip = spec.train().grad_clip();
    if (const v1::LossScaleSpec& ls = spec.train().loss_scale();
        ls.mode() == "dynamic") {
      exec.loss_scale.enabled = true;
      exec.loss_scale.init_scale = static_cast<float>(ls.init_scale());
      exec.loss_scale.growth_factor = ls.growth_factor();
      exec.loss_scale.backoff_factor = ls.backoff_factor();
      exec.loss_scale.growth_interval = ls.growth_interval();
      exec.loss_scale_state = job->restored_loss_scale_;
    }
    // Each step's rate from train.lr_schedule, by the executor's own step
    // count, which starts at the checkpoint's step on a resume.
    exec.lr_schedule = [train = spec.train()](int64_t step) {
      return LearningRate(train, step);
    };
    exec.budget_bytes = spec.memory().budget_bytes();
    ASSIGN_OR_RETURN(
        job->executor_,
        Executor::Create(&model->program, model->graph, job->store_.get(),
                         job->comm_.get(), meter, std::move(initial), exec));
    job->executor_->profiler().SetInterference(
        interference.compute_s_per_allgather_byte,
        interference.compute_s_per_reduce_scatter_byte,
        interference.compute_s_per_copy_byte);
    if (options.interference_probe) {
      job->executor_->profiler().SetStretch(interference.allgather_stretch,
                                            interference.reduce_scatter_stretch,
                                            interference.copy_stretch);
    }
    job->executor_->profiler().SetProbedHostCopy(interference.host_copy_bytes,
                                                 interference.host_copy_s);
    job->executor_->profiler().SetCollectiveScratch(
        job->comm_->AllGatherScratch(), job->comm_->ReduceScatterScratch());
    job->meter_ = meter;
    job->budget_bytes_ = spec.memory().budget_bytes();
    for (int32_t id = 0; id < job->store_->num_params(); ++id) {
      job->sharded_param_bytes_ +=
          job->store_->shard_numel(id) * static_cast<int64_t>(sizeof(float));
    }
    return absl::OkStatus();
  }();
  if (!setup.ok()) {
    if (!job->comm_->failure().ok()) return MarkCollectiveFailure(setup);
    return setup;
  }
  return job;
}

TrainingJob::~TrainingJob() {
  if (pending_.has_value()) pending_->hurry->store(true);
}

absl::StatusOr<StepStats> TrainingJob::Step(int64_t step) {
  // An earlier checkpoint's files are written while this step trains; the
  // ranks agree on its manifest at the first step boundary after.
  if (pending_.has_value()) RETURN_IF_ERROR(FinishCheckpoint(/*wait=*/false));
  ASSIGN_OR_RETURN(StepStats stats, RunAndReport(step));
  if (checkpoints_ != nullptr && (step + 1) % checkpoint_every_ == 0) {
    RETURN_IF_ERROR(WriteCheckpoint(step + 1, stats.iteration_s));
  }
  // Nothing trains after the last step to hide the write behind; a
  // synchronous checkpoint is complete before the step returns.
  if (pending_.has_value() && (checkpoint_sync_ || step + 1 >= steps_)) {
    RETURN_IF_ERROR(FinishCheckpoint(/*wait=*/true));
  }
  return stats;
}

absl::StatusOr<StepStats> TrainingJob::RunAndReport(int64_t step) {
  const ModelConfig& config = model_->config;
  std::vector<MicroBatch> batches;
  int64_t tokens =
      int64_t{config.micro_batch} * config.seq_len * config.grad_accum;
  if (tensors_ != nullptr) {
    // Shapes may differ by micro-batch, step and rank (variable lengths):
    // the program and the schedule do not depend on them.
    ASSIGN_OR_RETURN(
        batches,
        ReadRankBatches(*tensors_, step - data_origin_step_, config.grad_accum,
                        rank_, world_, config.micro_batch, &tokens,
                        data_origin_sequence_));
  } else if (synthetic_ != nullptr) {
    batches = ReadRankBatches(*synthetic_, step - data_origin_step_,
                              config.grad_accum, rank_, world_,
                              config.micro_batch, data_origin_sequence_);
  } else {
    ASSIGN_OR_RETURN(
        batches,
        ReadRankBatches(*data_, step - data_origin_step_, config.grad_accum,
                        rank_, world_, config.micro_batch, model_->token_inputs,
                        data_origin_sequence_));
  }
  // Tokens are read on the host; the model's first node indexes the
  // embedding on the device with them.
  if (!device_.is_cpu()) {
    for (MicroBatch& batch : batches) {
      for (auto& [name, tensor] : batch.tensors) tensor = tensor.to(device_);
    }
  }
  if (observer_ == nullptr) return executor_->RunStep(batches);
  // The step runs under the schedule active now.
  const Schedule& active = executor_->active_schedule();
  if (active.version != footprint_version_) {
    footprint_ = ComputeScheduleFootprint(model_->graph, active);
    footprint_version_ = active.version;
  }
  ASSIGN_OR_RETURN(StepStats stats, executor_->RunStep(batches));
  const IterationTimeline::Iteration& last =
      executor_->profiler().timeline().last();
  IterationTimeline::Summary timeline;
  if (last.iteration == stats.step) {
    timeline = Summarize(last);
  } else {  // profiling is off: no timeline
    timeline.compute_s = stats.iteration_s - stats.exposed_comm_s;
  }
  IterationReport r;
  r.step = stats.step;
  r.loss = stats.loss;
  r.iteration_s = stats.iteration_s;
  // The optimizer's wait for states coming back from the host tier is copy,
  // not compute.
  r.compute_s = std::max(0.0, timeline.compute_s - stats.exposed_copy_s);
  r.communication_s = timeline.communication_s;
  r.exposed_communication_s = stats.exposed_comm_s;
  r.tokens = tokens;
  r.allocated_bytes = meter_->current_bytes();
  r.peak_bytes = stats.peak_bytes;
  r.budget_bytes = budget_bytes_;
  r.offloaded_bytes = stats.offloaded_bytes;
  r.gathered_param_bytes = footprint_.peak_gathered_bytes;
  r.persistent_param_bytes = footprint_.persistent_bytes;
  r.sharded_param_bytes = sharded_param_bytes_;
  r.schedule_version = stats.schedule_version;
  if (stats.loss_scaling) {
    r.loss_scale = stats.loss_scale;
    r.skipped = stats.skipped;
  }
  r.collective_bytes = timeline.collective_bytes;
  observer_->OnIteration(r);
  return stats;
}

absl::StatusOr<int64_t> TrainingJob::Resume() {
  const std::string hash = model_->graph.StructuralHash();
  const std::vector<int64_t> steps = checkpoints_->ListWithManifest();
  // Every rank must choose the same checkpoint: they must see one directory.
  ASSIGN_OR_RETURN(
      std::vector<double> seen,
      comm_->AllGatherScalars({static_cast<double>(steps.size()),
                               steps.empty() ? -1.0 : steps.front()}));
  for (int r = 0; r < world_; ++r) {
    if (seen[2 * r] != seen[0] || seen[2 * r + 1] != seen[1]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", r, " sees other checkpoints in '", checkpoints_->dir(),
          "' than rank 0; checkpoint.dir must be one directory shared by "
          "every rank"));
    }
  }
  for (int64_t step : steps) {
    const std::string where = checkpoints_->StepDir(step);
    absl::Status problem;
    RestoreSource source;
    absl::StatusOr<CheckpointMeta> meta = checkpoints_->ReadManifest(step);
    if (meta.ok()) {
      absl::StatusOr<RestoreSource> read = ReadRestoreSource(
          *checkpoints_, *meta, model_->program, hash, *store_, rank_, world_);
      if (read.ok()) {
        source = *std::move(read);
      } else if (read.status().code() ==
                 absl::StatusCode::kFailedPrecondition) {
        // Every rank reads the same params list, so all refuse together.
        return read.status();
      } else {
        problem = read.status();
      }
    } else if (meta.status().code() == absl::StatusCode::kFailedPrecondition) {
      return meta.status();  // another format version
    } else {
      problem = meta.status();
    }
    ASSIGN_OR_RETURN(std::vector<double> usable,
                     comm_->AllGatherScalars({problem.ok() ? 1.0 : 0.0}));
    const bool everyone =
        std::all_of(usable.begin(), usable.end(), [](double v) { return v; });
    if (!problem.ok()) {
      std::fprintf(stderr,
                   "tandem-worker rank %d: checkpoint %s is unusable: %s; "
                   "falling back to the previous complete checkpoint\n",
                   rank_, where.c_str(),
                   std::string(problem.message()).c_str());
      continue;
    }
    if (!everyone) {
      std::fprintf(stderr,
                   "tandem-worker rank %d: checkpoint %s is unusable on "
                   "another rank; falling back to the previous complete "
                   "checkpoint\n",
                   rank_, where.c_str());
      continue;
    }
    RETURN_IF_ERROR(
        TorchCall("restoring a checkpoint", [&] { Restore(source, *store_); }));
    restored_loss_scale_ = source.loss_scale;
    // The data goes on where the checkpoint's stopped, in steps of this
    // job's global batch.
    data_origin_step_ = meta->data_step;
    data_origin_sequence_ = meta->data_sequences >= 0
                                ? meta->data_sequences
                                : meta->data_step * GlobalBatch();
    if (meta->world_size != world_) {
      std::fprintf(stderr,
                   "tandem-worker rank %d: resumed from %s (step %lld), "
                   "resharded from %d ranks to %d\n",
                   rank_, where.c_str(), static_cast<long long>(step),
                   meta->world_size, world_);
    } else {
      std::fprintf(stderr,
                   "tandem-worker rank %d: resumed from %s (step %lld)\n",
                   rank_, where.c_str(), static_cast<long long>(step));
    }
    return meta->data_step;
  }
  if (!steps.empty()) {
    std::fprintf(stderr,
                 "tandem-worker rank %d: no usable checkpoint in '%s'; "
                 "starting from step 0\n",
                 rank_, checkpoints_->dir().c_str());
  }
  return 0;
}

absl::Status TrainingJob::WriteCheckpoint(int64_t steps_done, double step_s) {
  // At most one checkpoint in flight.
  if (pending_.has_value()) RETURN_IF_ERROR(FinishCheckpoint(/*wait=*/true));
  // The previous snapshot's buffers, its file written.
  std::shared_ptr<RankCheckpoint> state = std::move(snapshot_);
  if (state == nullptr) state = std::make_shared<RankCheckpoint>();
  state->meta = CheckpointMeta();
  state->meta.step = steps_done;
  state->meta.world_size = world_;
  state->meta.graph_hash = model_->graph.StructuralHash();
  state->meta.data_step = steps_done;  // batches are indexed by step
  state->meta.data_sequences =
      data_origin_sequence_ + (steps_done - data_origin_step_) * GlobalBatch();
  state->rank = rank_;
  // The snapshot: the blobs are copies, so training may change the shards
  // while the files are written.
  const absl::Status snapshot = TorchCall("checkpointing", [&] {
    store_->WaitStates();
    FillCheckpoint(model_->program, *store_, *state,
                   loss_scaling_ ? &executor_->loss_scale_state() : nullptr);
  });
  PendingCheckpoint pending;
  pending.meta = state->meta;
  pending.state = state;
  pending.hurry = std::make_shared<std::atomic<bool>>(false);
  if (snapshot.ok()) {
    // Training comes first: the file goes out over half the steps until the
    // next checkpoint (WritePace), unless someone waits for it sooner (a
    // synchronous checkpoint, the last step, the job's end).
    WritePace pace;
    pace.spread_s = kCheckpointSpread * static_cast<double>(checkpoint_every_) *
                    std::max(0.0, step_s);
    pending.written = std::async(
        std::launch::async, [dir = *checkpoints_, state = std::move(state),
                             hurry = pending.hurry, pace]() mutable {
          // And the writer runs at the lowest nice level, a small share of
          // a busy CPU but never starved.
          (void)setpriority(PRIO_PROCESS,
                            static_cast<id_t>(syscall(SYS_gettid)), 19);
          pace.hurry = hurry.get();
          return dir.WriteRank(*state, pace);
        });
  } else {
    std::promise<absl::Status> failed;
    failed.set_value(snapshot);
    pending.written = failed.get_future();
  }
  pending_ = std::move(pending);
  return absl::OkStatus();
}

absl::Status TrainingJob::FinishCheckpoint(bool wait) {
  PendingCheckpoint& pending = *pending_;
  if (wait) pending.hurry->store(true);
  const bool done = wait || pending.written.wait_for(std::chrono::seconds(0)) ==
                                std::future_status::ready;
  // Every rank must decide alike: the manifest only once every file is
  // durable, and none may wait for another's write in a collective.
  ASSIGN_OR_RETURN(std::vector<double> all_done,
                   comm_->AllGatherScalars({done ? 1.0 : 0.0}));
  if (!std::all_of(all_done.begin(), all_done.end(),
                   [](double v) { return v; })) {
    return absl::OkStatus();  // asked again after the next step
  }
  const absl::Status written = pending.written.get();
  const CheckpointMeta meta = pending.meta;
  // The writer is done with it: the next snapshot reuses its buffers.
  snapshot_ = std::move(pending.state);
  pending_.reset();
  ASSIGN_OR_RETURN(std::vector<double> ok,
                   comm_->AllGatherScalars({written.ok() ? 1.0 : 0.0}));
  const std::string where = checkpoints_->StepDir(meta.step);
  if (!written.ok()) {
    std::fprintf(stderr, "tandem-worker rank %d: writing checkpoint %s: %s\n",
                 rank_, where.c_str(), std::string(written.message()).c_str());
  }
  if (!std::all_of(ok.begin(), ok.end(), [](double v) { return v; })) {
    std::fprintf(stderr,
                 "tandem-worker rank %d: checkpoint %s is incomplete (a rank "
                 "could not write its file); training goes on\n",
                 rank_, where.c_str());
    return absl::OkStatus();
  }
  if (rank_ != 0) return absl::OkStatus();
  // Every rank's file is durable: the manifest makes the checkpoint count.
  if (absl::Status s = checkpoints_->WriteManifest(meta); !s.ok()) {
    std::fprintf(stderr, "tandem-worker rank 0: writing checkpoint %s: %s\n",
                 where.c_str(), std::string(s.message()).c_str());
    return absl::OkStatus();
  }
  checkpoints_->Prune(kCheckpointsKept);
  return absl::OkStatus();
}

absl::StatusOr<std::string> TrainingJob::FinalJson() {
  ASSIGN_OR_RETURN(const std::vector<double> digests,
                   executor_->ParamDigests());
  std::string out = "{\"param_digests\":{";
  for (int32_t id = 0; id < store_->num_params(); ++id) {
    absl::StrAppend(&out, id == 0 ? "" : ",", "\"", store_->name(id),
                    "\":", absl::StrFormat("%.17g", digests[id]));
  }
  absl::StrAppend(&out, "},\"steps\":", steps_, ",\"rank\":", rank_, "}");
  return out;
}

absl::Status CheckFiniteLoss(const v1::JobSpec& spec, const StepStats& s) {
  if (std::isfinite(s.loss) || spec.train().on_nonfinite() == "continue") {
    return absl::OkStatus();
  }
  // Every rank has the same loss (the end-of-step exchange), so every rank
  // stops at the same step. Not FailedPrecondition: that is a stop the
  // coordinator ordered, and this one must reach it.
  return absl::AbortedError(absl::StrCat(
      "loss became ", NonFiniteName(s.loss), " at step ", s.step + 1,
      " (train.on_nonfinite: stop): training diverged; lower train.lr, set "
      "train.grad_clip, or check the data, or set train.on_nonfinite: "
      "continue to train on"));
}

std::string StepJson(const StepStats& s, int rank) {
  // JSON has no NaN or infinity: such a value is null, and a diverged
  // loss's kind is spelled out beside it.
  auto json = [](double v) {
    return std::isfinite(v) ? absl::StrFormat("%.17g", v) : std::string("null");
  };
  return absl::StrCat(
      "{\"step\":", s.step, ",\"loss\":", json(s.loss),
      std::isfinite(s.loss)
          ? std::string()
          : absl::StrCat(",\"loss_nonfinite\":\"", NonFiniteName(s.loss), "\""),
      ",\"iteration_s\":", json(s.iteration_s),
      ",\"exposed_comm_s\":", json(s.exposed_comm_s),
      ",\"memory_hold_s\":", json(s.memory_hold_s),
      ",\"peak_bytes\":", s.peak_bytes,
      ",\"schedule_version\":", s.schedule_version,
      ",\"grad_norm\":", json(s.grad_norm),
      s.loss_scaling
          ? absl::StrCat(",\"loss_scale\":", json(s.loss_scale),
                         ",\"skipped\":", s.skipped ? "true" : "false")
          : std::string(),
      ",\"work\":", s.work,
      s.cpu_wait_share >= 0
          ? absl::StrCat(",\"cpu_wait_share\":", json(s.cpu_wait_share))
          : std::string(),
      ",\"rank\":", rank, "}");
}

}  // namespace tandem
