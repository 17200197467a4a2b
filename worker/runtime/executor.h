// The executor: runs one training iteration of a program under a schedule
// (worker/README.md, "Runtime rules"). Forward runs the program's nodes in
// order, performing the schedule's actions anchored before and after each;
// backward is one autograd pass per micro-batch, with the actions anchored at
// backward nodes fired from hooks on the forward outputs (the hook on node i's
// output runs when node i+1's backward has finished and node i's is about to
// start). A node marked ProgramNode::recompute (activation checkpointing)
// runs forward without keeping its activations, only its inputs, and runs
// again inside its backward, on the params gathered for that backward node
// (worker/README.md, "Activation checkpointing"). The optimizer node drains
// the reduce-scatters, exchanges the loss, the gradient norm and the schedule
// agreement in one small all-gather, clips and steps AdamW on this rank's
// shards. With loss scaling (loss_scaler.h) the loss is scaled before
// backward, the gradients unscaled in the optimizer's one multiply, and a
// step whose global gradient norm is not finite is skipped on every rank.
//
// It performs exactly the schedule's ALLGATHER, WAIT, RELEASE,
// REDUCE_SCATTER, OFFLOAD and RELOAD actions. In ZeRO-3 mode persistent
// params stay gathered across iterations and are refreshed by one all-gather
// after each optimizer step. In ZeRO-1 mode every param is replicated
// (persistent); the schedule's ALLGATHERs after the optimizer overwrite them
// in place with the updated shards. OFFLOAD and RELOAD move an entry's
// optimizer states to and from the host tier (host_tier.h) on its copy
// thread, overlapping compute; the optimizer waits, param by param, only for
// the reloads of the states it is updating (and reloads states a schedule
// left on the host itself). A node whose
// params are not gathered and waited for fails the iteration with an error
// instead of reading freed memory; schedules are checked (hash, validity,
// CheckScheduleSemantics) before they are accepted, so a valid schedule
// never gets there.
//
// Contract: every rank runs the same program and graph, and calls RunStep the
// same number of times; collectives are then issued in the same order on
// every rank. New schedules take effect at an iteration boundary all ranks
// agree on (schedule_slot.h). After a failed step the executor is broken and
// every later call returns the same error.
#ifndef TANDEM_WORKER_RUNTIME_EXECUTOR_H_
#define TANDEM_WORKER_RUNTIME_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/ir/graph.h"
#include "common/ir/profile.h"
#include "common/ir/schedule.h"
#include "common/lowering/least_memory.h"
#include "worker/runtime/communicator.h"
#include "worker/runtime/host_tier.h"
#include "worker/runtime/loss_scaler.h"
#include "worker/runtime/memory_meter.h"
#include "worker/runtime/profiler.h"
#include "worker/runtime/program.h"
#include "worker/runtime/schedule_slot.h"
#include "worker/runtime/sharded_param_store.h"

namespace tandem {

struct ExecutorOptions {
  AdamWOptions adamw;
  // The learning rate of iteration `step` (0-based over the whole job: the
  // first RunStep's is first_step, so a resumed job continues its curve),
  // used in place of adamw.lr at that step's optimizer update. Empty:
  // adamw.lr at every step. TrainingJob passes common/job/lr_schedule.h's.
  std::function<double(int64_t step)> lr_schedule;
  // Peak bytes an iteration may reach (the meter's); 0 disables the check
  // and the memory guard.
  int64_t budget_bytes = 0;
  // Memory guard (worker/README.md, "Memory guard"), with budget_bytes > 0:
  // the executor holds the least-memory schedule; a rank whose peak comes
  // within the guard band of the budget (this fraction of it) makes every
  // rank switch to it at the next agreed boundary. A peak over the budget
  // fails the step only under that schedule, when no schedule fits.
  double guard_band = kMemoryGuardBand;
  bool profile = true;
  // Directory of the CPU host tier's files (HostTier::Create; empty: the
  // default). Used only by schedules that offload.
  std::string offload_dir;
  // Iteration number of the first RunStep: the step a checkpoint was taken
  // after (AdamW's bias correction counts from it, less the steps the loss
  // scaler skipped).
  int64_t first_step = 0;
  // Dynamic loss scaling (loss_scaler.h); off by default.
  LossScaleOptions loss_scale;
  // The scaler's state from a checkpoint (a resume); unset: a fresh one.
  std::optional<LossScaleState> loss_scale_state;
};

struct StepStats {
  int64_t step = 0;
  // Mean over the global batch (all ranks, all micro-batches); identical on
  // every rank.
  double loss = 0;
  // Global gradient norm before clipping (unscaled); identical on every
  // rank. Not finite in a step the loss scaler skipped.
  double grad_norm = 0;
  // The factor the loss was multiplied by before backward (1 without loss
  // scaling), and whether the step was skipped: its gradients held an
  // infinity or a NaN on some rank, so no param or moment changed and the
  // scale backed off.
  float loss_scale = 1.0f;
  bool skipped = false;
  // Loss scaling is on (ExecutorOptions::loss_scale).
  bool loss_scaling = false;
  double iteration_s = 0;
  // Time compute spent waiting for communication: WAITs, draining the
  // reduce-scatters, the persistent refresh, and the end-of-step exchange
  // (which also absorbs any skew between ranks).
  double exposed_comm_s = 0;
  int64_t peak_bytes = 0;
  int64_t schedule_version = 0;
  // Time the optimizer waited for optimizer states to come back from the
  // host tier (part of iteration_s, not of exposed_comm_s).
  double exposed_copy_s = 0;
  // Most bytes of optimizer state on the host tier during the iteration.
  int64_t offloaded_bytes = 0;
  // Time compute waited for collectives in flight to finish and free their
  // buffers before a node, to hold the plan's peak (part of
  // exposed_comm_s; worker/README.md, "Memory guard").
  double memory_hold_s = 0;
  // The memory guard switched every rank to the least-memory schedule after
  // this step; guard_reason says which peak tripped it.
  bool memory_guard = false;
  std::string guard_reason;
  // Elements of this rank's batch inputs over its micro-batches: what the
  // step's compute scales with. Constant for fixed shapes; with
  // variable-length batches it tells the coordinator's drift detection how
  // much work a step held (coordinator/README.md, "Variable work").
  int64_t work = 0;
  // The share of iteration_s this (the compute) thread was runnable but
  // waited for a CPU (worker/runtime/cpu_wait.h); -1: not measured.
  double cpu_wait_share = -1;
};

// Checks that this runtime can execute `schedule` on `graph`: the graph hash
// matches, ValidateSchedule and CheckScheduleSemantics pass, the mode is
// zero3 with no param both persistent and grouped, or zero1 with every param
// persistent and re-gathered after the optimizer; offload entries are
// disjoint and each moves its params' whole states.
// Errors are InvalidArgument / FailedPrecondition / Unimplemented and say
// what to change.
absl::Status CheckRunnableSchedule(const Graph& graph,
                                   const Schedule& schedule);

class Executor {
 public:
  // `program`, `store`, `comm` and `meter` must outlive the executor;
  // `graph` must be DeriveGraph(program, ...). Rejects `initial` like
  // CheckRunnableSchedule.
  static absl::StatusOr<std::unique_ptr<Executor>> Create(
      const Program* program, Graph graph, ShardedParamStore* store,
      Communicator* comm, MemoryMeter* meter, Schedule initial,
      ExecutorOptions options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Thread-safe. Checks `schedule` (CheckRunnableSchedule; its mode must be
  // the running one's: a job's ZeRO stage is fixed) and queues it: it
  // takes effect at the first iteration boundary at which every rank holds
  // it, and not before iteration `not_before_iteration`. With `incumbent`
  // (checked alike): a comparison, the two alternating in blocks of
  // `block_steps` iterations once it takes effect, for `block_pairs` pairs
  // (0: until a newer schedule; ScheduleSlot).
  absl::Status OfferSchedule(Schedule schedule,
                             int64_t not_before_iteration = 0,
                             std::optional<Schedule> incumbent = std::nullopt,
                             int64_t block_steps = 0, int64_t block_pairs = 0);

  // Runs one iteration over this rank's micro-batches (one per graph
  // micro-batch). Each micro-batch's loss (its own mean) weighs 1 / (world *
  // micro-batches) of the step's, or its MicroBatch::loss_weight when set
  // (the tensors source: its share of the global batch's counted items);
  // the gradients and StepStats::loss are that weighted mean, so shapes may
  // differ between micro-batches and ranks. Errors: InvalidArgument when
  // some micro-batches set a weight and others do not; the step's failure
  // (communication, a node reading an ungathered param, the memory budget
  // exceeded under the least-memory plan; over it under another schedule, the
  // memory guard switches instead), after which the executor is broken.
  absl::StatusOr<StepStats> RunStep(absl::Span<const MicroBatch> batches);

  // Per param, a digest of its full value that sees every element's place
  // (ShardedParamStore::ShardDigests summed over the ranks in rank order):
  // identical on every rank, and equal to fp32 rounding across world sizes
  // and schedules. Collective: every rank calls it at the same point.
  absl::StatusOr<std::vector<double>> ParamDigests();

  int64_t step() const { return step_; }
  // The loss scaler's state after the last step (what a checkpoint keeps).
  const LossScaleState& loss_scale_state() const { return scaler_.state(); }
  const Graph& graph() const { return graph_; }
  const Schedule& active_schedule() const { return slot_.active(); }
  // The profile window (Profiler::Snapshot): collectives are keyed by the
  // node they were issued at; the persistent refresh appears as an
  // all-gather with group_id -1, the persistent params and the optimizer
  // node.
  Profiler& profiler() { return profiler_; }

 private:
  struct Prepared;
  struct IterationState;
  Executor(const Program* program, ProgramFlow flow, Graph graph,
           ShardedParamStore* store, Communicator* comm, MemoryMeter* meter,
           Schedule initial, std::optional<Schedule> fallback,
           ExecutorOptions options);
  // The guard's verdict for this rank from its peak so far: within the
  // band of the budget, under a schedule other than the least-memory one.
  bool NearBudget(int64_t peak) const;
  // The guard band's fixed part: options_.guard_band of the budget.
  int64_t GuardBand() const;

  absl::Status Activate(const Schedule& schedule);
  absl::Status RunStepImpl(absl::Span<const MicroBatch> batches,
                           StepStats* stats);
  void RunMicroBatch(int k, const MicroBatch& batch);
  // Forward node `i` of micro-batch `k` on `inputs`: the schedule's actions
  // before and after it, its params, its profile. `place` (may be empty)
  // receives the outputs before the node's memory is measured (the caller
  // stores them and drops dead values there); returns what it left.
  std::vector<at::Tensor> RunForwardNode(
      int k, int i, std::vector<at::Tensor> inputs, bool* trained_so_far,
      const std::function<void(std::vector<at::Tensor>&)>& place);
  // Glue `g` of micro-batch `k` on its inputs (program.h, ProgramGlue): its
  // forward, serving each tandem::call_unit with RunForwardNode of the next
  // node it covers and a backward boundary on that node's outputs. Fails
  // when the glue calls its nodes out of order or not all of them.
  std::vector<at::Tensor> RunGlue(int k, int g, std::vector<at::Tensor> inputs,
                                  bool* trained_so_far);
  // Backward boundary `i` of micro-batch `k` on the values `crossing`
  // visits (each replaced by a hooked identity when it carries a
  // gradient); fails when none does, unless a frozen prefix ends there.
  void HookBoundary(
      int k, int i, bool trained_so_far,
      const std::function<
          void(const std::function<void(at::Tensor&, const std::string&)>&)>&
          crossing);
  // Actions anchored before/after the node at graph position `pos`.
  void RunActions(int pos, AnchorPosition where);
  // Fails unless every param of the node at `pos` is usable (waits for a
  // persistent refresh still in flight).
  void EnsureParams(int pos);
  // Backward boundary `i` of micro-batch `k` (between forward nodes i and
  // i+1): every later node's backward is done, node i's is next.
  void OnBackwardBoundary(int k, int i);
  // Hook body: one value of boundary `i` has its complete gradient; fires
  // the boundaries whose hooks have all fired, in order.
  void OnBoundaryHook(int k, int i);
  std::string BoundaryName(int i) const;
  void StartBackwardNode(int pos);
  // Before the node at `pos`: when the memory now plus what the node's own
  // allocations rose by last time, plus the largest buffers a collective
  // still queued may allocate while the node runs, would pass hold_limit_,
  // waits for the collectives in flight, oldest first, until it would not
  // (their buffers are freed as they finish) or none is left. A collective
  // that runs earlier or later than the plan assumed then costs time, not a
  // trip of the memory guard.
  void HoldPlannedPeak(int pos);
  void FinishBackwardNode(int pos);
  void RefreshPersistent(const Prepared* previous);
  void WaitCounted(const AsyncHandle& handle, CollectiveTiming timing);

  const Program* program_;
  const ProgramFlow flow_;
  const Graph graph_;
  ShardedParamStore* store_;
  Communicator* comm_;
  MemoryMeter* meter_;
  const ExecutorOptions options_;
  const int num_nodes_;      // forward nodes of one micro-batch
  const ShardingMode mode_;  // the initial schedule's; offers must match
  ScheduleSlot slot_;
  std::unique_ptr<Prepared> active_;
  Profiler profiler_;
  // Persistent params' refresh after the last optimizer step, in the
  // chunks of common/lowering/persistent_refresh.h (frozen params already
  // gathered stay as they are): a node waits for its params' chunk, and the
  // chunks before it (they finish in order).
  struct RefreshChunk {
    AsyncHandle handle;
    std::vector<int32_t> ids;
  };
  std::vector<RefreshChunk> refresh_;
  // Chunks before this one have been waited for.
  size_t refresh_next_ = 0;
  // Waits for the refresh chunks up to and including `chunk`.
  void WaitRefreshThrough(size_t chunk);
  std::unique_ptr<IterationState> it_;
  // Created by the first schedule that offloads; kept for the store's
  // copies in flight.
  std::unique_ptr<HostTier> host_;
  int64_t step_ = 0;
  LossScaler scaler_;
  // Each node's own memory rise (by graph position) in the last iteration
  // that measured it: HoldPlannedPeak's estimate of what it will need.
  std::vector<int64_t> last_rise_;
  // The last step's peak under the active schedule (the switching step's
  // only when over the budget): the guard reads it with the step's own.
  int64_t last_peak_ = 0;
  // The active schedule runs the least-memory plan (the fallback, or a
  // published plan identical to it): nothing to fall back to.
  bool least_memory_active_ = false;
  // HoldPlannedPeak's line for the active schedule (0: no hold).
  int64_t hold_limit_ = 0;
  absl::Status broken_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_EXECUTOR_H_
