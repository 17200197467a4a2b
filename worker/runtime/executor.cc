#include "worker/runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ir/graph.h"
#include "common/ir/validate.h"
#include "common/lowering/least_memory.h"
#include "common/lowering/persistent_refresh.h"
#include "common/lowering/schedule_semantics.h"
#include "common/status_macros.h"
#include "torch/csrc/autograd/autograd.h"
#include "torch/csrc/autograd/custom_function.h"
#include "torch/custom_class.h"
#include "worker/runtime/cpu_wait.h"
#include "worker/runtime/glue_op.h"
#include "worker/runtime/torch_status.h"

namespace tandem {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Activation checkpointing (ProgramNode::recompute): what a recomputing
// node's backward needs besides its saved inputs. The autograd context holds
// it in saved_data, which takes IValues only: hence a registered custom
// class.
struct RecomputeState : torch::CustomClassHolder {
  const ProgramNode* node = nullptr;
  size_t num_inputs = 0;
  // The node's full params: the store's leaves themselves, not saved
  // variables. Their storage is released after forward and gathered again,
  // in place, before this backward; the recompute reads it through detached
  // aliases, so it sees the values gathered then (the same as in forward:
  // the optimizer runs after every backward).
  std::vector<at::Tensor> params;
  // Run first in backward: fails the step unless the params are gathered.
  std::function<void()> check_params;
  // The random generator of the node's device as forward found it: the
  // recompute draws the same numbers (dropout masks) as forward did, and
  // the generator is put back to where it was before the recompute, so
  // nothing after sees a difference (torch.utils.checkpoint's
  // preserve_rng_state).
  at::Generator generator;
  at::Tensor generator_state;
};

const auto kRecomputeStateClass =
    torch::class_<RecomputeState>("tandem", "RecomputeState");

// A node run without keeping its activations: forward runs with grad
// disabled (Function::apply) and keeps only the node's inputs; backward runs
// the node's forward again with grad enabled, on detached inputs and params,
// and back-propagates the incoming gradients through it. The params are
// inputs of the function, so their gradients go to their accumulators
// (AccumulateGrad of the full leaves) as they do from an ordinary node's
// ops: accumulation across micro-batches, reduce-scatters and frozen params
// see no difference.
class RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
 public:
  // `args`: the node's inputs, then its params.
  static variable_list forward(
      AutogradContext* ctx, at::TensorList args,
      const c10::intrusive_ptr<RecomputeState>& state) {
    const size_t n = state->num_inputs;
    ctx->save_for_backward(args.slice(0, n).vec());
    ctx->saved_data["state"] = state;
    // An output no gradient reaches is left out of the recompute's backward.
    ctx->set_materialize_grads(false);
    return state->node->forward(
        absl::MakeConstSpan(args.data(), n),
        absl::MakeConstSpan(args.data() + n, args.size() - n));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const c10::intrusive_ptr<RecomputeState> state =
        ctx->saved_data.at("state").toCustomClass<RecomputeState>();
    state->check_params();
    const variable_list saved = ctx->get_saved_variables();
    const size_t n = saved.size();
    const size_t m = state->params.size();
    // Detached aliases of the arguments (sharing their storage): the
    // recompute's own graph ends at them, and its gradients for them are
    // returned. One gradient per forward argument, the state's undefined.
    std::vector<at::Tensor> args;
    variable_list targets;
    std::vector<size_t> target_arg;
    for (size_t a = 0; a < n + m; ++a) {
      at::Tensor t = a < n ? saved[a].detach() : state->params[a - n].detach();
      if (ctx->needs_input_grad(a)) {
        t.requires_grad_();
        targets.push_back(t);
        target_arg.push_back(a);
      }
      args.push_back(std::move(t));
    }
    variable_list result(n + m + 1);
    std::vector<at::Tensor> outputs;
    {
      at::AutoGradMode enable(true);
      at::Tensor now;
      {
        std::lock_guard<std::mutex> lock(state->generator.mutex());
        now = state->generator.get_state();
        state->generator.set_state(state->generator_state);
      }
      outputs = state->node->forward(absl::MakeConstSpan(args.data(), n),
                                     absl::MakeConstSpan(args.data() + n, m));
      std::lock_guard<std::mutex> lock(state->generator.mutex());
      state->generator.set_state(now);
    }
    TORCH_CHECK(outputs.size() == grads.size(), "node '", state->node->name,
                "' returned ", outputs.size(), " tensors when recomputed, ",
                grads.size(), " in forward");
    variable_list roots;
    variable_list root_grads;
    for (size_t o = 0; o < outputs.size(); ++o) {
      if (grads[o].defined() && outputs[o].requires_grad()) {
        roots.push_back(outputs[o]);
        root_grads.push_back(grads[o]);
      }
    }
    if (roots.empty() || targets.empty()) return result;
    const variable_list got = torch::autograd::grad(
        roots, targets, root_grads, /*retain_graph=*/false,
        /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t t = 0; t < targets.size(); ++t) result[target_arg[t]] = got[t];
    return result;
  }
};

// IterationState::boundary_pending of a boundary no gradient crosses because
// no node before it trains (a frozen prefix): it fires after backward.
constexpr int kDeadBoundary = -1;

SteadyTime Now() { return std::chrono::steady_clock::now(); }
double Since(SteadyTime t) {
  return std::chrono::duration<double>(Now() - t).count();
}

absl::Status Prefixed(const Schedule& s, absl::string_view what,
                      const absl::Status& status) {
  return absl::Status(
      status.code(),
      absl::StrCat("schedule v", s.version, " ", what, ": ", status.message()));
}

}  // namespace

absl::Status CheckRunnableSchedule(const Graph& graph,
                                   const Schedule& schedule) {
  const std::string hash = graph.StructuralHash();
  if (schedule.graph_hash != hash) {
    return absl::FailedPreconditionError(absl::StrCat(
        "schedule v", schedule.version, " was planned for graph ",
        schedule.graph_hash, ", but this worker runs graph '", graph.name,
        "' with hash ", hash, "; plan the schedule for this model"));
  }
  absl::Status valid = ValidateSchedule(schedule, graph);
  if (!valid.ok()) return Prefixed(schedule, "is malformed", valid);
  std::vector<bool> persistent(graph.params.size(), false);
  const GraphIndex index(graph);
  for (int32_t id : schedule.persistent_param_ids) {
    persistent[index.ParamPos(id)] = true;
  }
  // Offload entries move whole params' states, each param's in one entry.
  std::vector<int32_t> offloaded_by(graph.params.size(), -1);
  const int world = std::max(graph.world_size, 1);
  for (const OffloadEntry& o : schedule.offloads) {
    int64_t states = 0;
    for (int32_t id : o.param_ids) {
      const Param& p = graph.params[index.ParamPos(id)];
      states += p.shard_numel(world) * OptimizerStateBytesPerElement(p.dtype);
      int32_t& owner = offloaded_by[index.ParamPos(id)];
      if (owner >= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "schedule v", schedule.version, ": param p", id, " (", p.name,
            ") is in offload entries o", owner, " and o", o.id,
            "; an entry's states may move with one entry only"));
      }
      owner = o.id;
    }
    if (o.bytes < states) {
      return absl::UnimplementedError(absl::StrCat(
          "schedule v", schedule.version, ": offload entry o", o.id, " moves ",
          o.bytes, " of its params' ", states,
          " B of optimizer state; this worker moves whole params' states, "
          "so plan entries of whole params"));
    }
  }
  if (schedule.mode == ShardingMode::kZero1) {
    // Params are replicated: all persistent, and every one re-gathered (and
    // waited for) after the optimizer updated the shards.
    const int optimizer = static_cast<int>(graph.nodes.size()) - 1;
    absl::flat_hash_map<int32_t, int> gathered;  // group -> 1 issued, 2 waited
    for (const Action& a : schedule.actions) {
      if (index.NodePos(a.node_id) != optimizer ||
          a.position != AnchorPosition::kAfter) {
        continue;
      }
      if (a.kind == ActionKind::kAllGather) gathered[a.group_id] = 1;
      if (a.kind == ActionKind::kWait && gathered[a.group_id] == 1) {
        gathered[a.group_id] = 2;
      }
    }
    std::vector<bool> refreshed(graph.params.size(), false);
    for (const GatherGroup& g : schedule.groups) {
      auto it = gathered.find(g.id);
      if (it == gathered.end() || it->second != 2) continue;
      for (int32_t id : g.param_ids) refreshed[index.ParamPos(id)] = true;
    }
    for (size_t i = 0; i < graph.params.size(); ++i) {
      // The optimizer does not change a frozen param: nothing to refresh.
      if (!persistent[i] || (!refreshed[i] && graph.params[i].trainable)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "zero1 schedule v", schedule.version, ": param '",
            graph.params[i].name, "' is ",
            !persistent[i] ? "not persistent"
                           : "not all-gathered and waited for after the "
                             "optimizer",
            "; in ZeRO-1 every param is replicated and refreshed after each "
            "step (plan it with the zero1 pass)"));
      }
    }
  }
  for (const GatherGroup& g : schedule.groups) {
    if (schedule.mode == ShardingMode::kZero1) break;
    for (int32_t id : g.param_ids) {
      if (persistent[index.ParamPos(id)]) {
        return absl::InvalidArgumentError(
            absl::StrCat("schedule v", schedule.version, ": param p", id, " (",
                         graph.params[index.ParamPos(id)].name,
                         ") is persistent and also in gather group g", g.id,
                         "; remove it from one of them"));
      }
    }
  }
  absl::Status semantics = CheckScheduleSemantics(graph, schedule);
  if (!semantics.ok()) {
    return Prefixed(schedule, "rejected before running", semantics);
  }
  return absl::OkStatus();
}

struct Executor::Prepared {
  Schedule schedule;
  std::vector<std::vector<Action>> before;
  std::vector<std::vector<Action>> after;
  absl::flat_hash_map<int32_t, std::vector<int32_t>> group_params;
  absl::flat_hash_map<int32_t, int64_t> group_bytes;
  std::vector<int32_t> persistent;
  std::vector<bool> is_persistent;
  absl::flat_hash_map<int32_t, std::vector<int32_t>> offload_params;
};

struct Executor::IterationState {
  struct Gather {
    AsyncHandle handle;
    int32_t issued_at;
  };
  struct Reduce {
    AsyncHandle handle;
    std::vector<int32_t> params;
    int32_t issued_at;
    int64_t bytes;
  };
  absl::flat_hash_map<int32_t, Gather> gathers;
  std::vector<Reduce> reduces;
  // Every all-gather and reduce-scatter issued this iteration, oldest
  // first, until the memory hold saw it done (HoldPlannedPeak).
  std::deque<AsyncHandle> in_flight;
  double memory_hold_s = 0;
  double exposed_s = 0;
  double loss_sum = 0;
  int64_t offloaded_bytes = 0;
  int64_t max_offloaded_bytes = 0;
  // Host-tier copies of this iteration, for the timeline's copy stream.
  struct Copy {
    std::string label;
    int64_t bytes;
    AsyncHandle handle;
    // An offload: frees its states on the device when done.
    bool frees = false;
  };
  std::vector<Copy> copies;
  SteadyTime backward_start;
  int64_t backward_memory = 0;
  // The current micro-batch's backward boundaries: hooks not yet fired per
  // boundary (kDeadBoundary: none can, a frozen prefix ends later), the
  // values they sit on (for errors), and the next boundary to fire (they
  // fire in order, last first).
  std::vector<int> boundary_pending;
  std::vector<std::vector<std::string>> boundary_values;
  int next_boundary = -1;
};

Executor::Executor(const Program* program, ProgramFlow flow, Graph graph,
                   ShardedParamStore* store, Communicator* comm,
                   MemoryMeter* meter, Schedule initial,
                   std::optional<Schedule> fallback, ExecutorOptions options)
    : program_(program),
      flow_(std::move(flow)),
      graph_(std::move(graph)),
      store_(store),
      comm_(comm),
      meter_(meter),
      options_(options),
      num_nodes_(static_cast<int>(program->nodes.size())),
      mode_(initial.mode),
      slot_(std::move(initial), std::move(fallback)),
      profiler_(options.profile, static_cast<int>(graph_.nodes.size())),
      step_(options.first_step),
      scaler_(options.loss_scale),
      last_rise_(graph_.nodes.size(), 0) {}

Executor::~Executor() { comm_->Drain().IgnoreError(); }

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(
    const Program* program, Graph graph, ShardedParamStore* store,
    Communicator* comm, MemoryMeter* meter, Schedule initial,
    ExecutorOptions options) {
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (graph.nodes[i].id != static_cast<int32_t>(i)) {
      return absl::InvalidArgumentError(
          "the executor needs a graph from DeriveGraph (ids = positions)");
    }
  }
  if (graph.nodes.size() !=
          static_cast<size_t>(graph.micro_batches) * 2 * program->nodes.size() +
              1 ||
      store->num_params() != static_cast<int>(graph.params.size())) {
    return absl::InvalidArgumentError(
        "graph, program and param store do not match; derive the graph from "
        "the program and create the store from it");
  }
  if (meter == nullptr) {
    return absl::InvalidArgumentError("a memory meter is required");
  }
  if (const LossScaleOptions& ls = options.loss_scale; ls.enabled) {
    if (!std::isfinite(ls.init_scale) || ls.init_scale <= 0 ||
        !(ls.growth_factor > 1) || !std::isfinite(ls.growth_factor) ||
        !(ls.backoff_factor > 0 && ls.backoff_factor < 1) ||
        ls.growth_interval < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "loss scaling needs a positive finite initial scale, a growth "
          "factor above 1, a backoff factor between 0 and 1 and a growth "
          "interval of at least 1 step; got ",
          ls.init_scale, ", ", ls.growth_factor, ", ", ls.backoff_factor, ", ",
          ls.growth_interval));
    }
  }
  ASSIGN_OR_RETURN(ProgramFlow flow, AnalyzeProgramFlow(*program));
  RETURN_IF_ERROR(CheckRunnableSchedule(graph, initial));
  std::optional<Schedule> fallback;
  if (options.budget_bytes > 0) {
    // The memory guard's fallback, checked like any schedule it may run.
    // (ValidateSchedule wants a published version: check it as one.)
    ASSIGN_OR_RETURN(fallback, LeastMemorySchedule(graph, initial.mode));
    fallback->version = 0;
    RETURN_IF_ERROR(CheckRunnableSchedule(graph, *fallback));
    fallback->version = kLeastMemoryVersion;
  }
  std::unique_ptr<Executor> executor(
      new Executor(program, std::move(flow), std::move(graph), store, comm,
                   meter, std::move(initial), std::move(fallback), options));
  if (options.loss_scale.enabled && options.loss_scale_state.has_value()) {
    RETURN_IF_ERROR(executor->scaler_.Restore(*options.loss_scale_state));
  }
  RETURN_IF_ERROR(executor->Activate(executor->slot_.active()));
  RETURN_IF_ERROR(TorchCall("gathering persistent params",
                            [&] { executor->RefreshPersistent(nullptr); }));
  return executor;
}

absl::Status Executor::OfferSchedule(Schedule schedule,
                                     int64_t not_before_iteration,
                                     std::optional<Schedule> incumbent,
                                     int64_t block_steps, int64_t block_pairs) {
  for (const Schedule* s : {&schedule, incumbent ? &*incumbent : nullptr}) {
    if (s == nullptr) continue;
    RETURN_IF_ERROR(CheckRunnableSchedule(graph_, *s));
    if (s->mode != mode_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "schedule v", s->version, " is a ", ShardingModeName(s->mode),
          " schedule, but this job runs ", ShardingModeName(mode_),
          " (parallel.zero_stage is fixed for a job); plan it for ",
          ShardingModeName(mode_)));
    }
  }
  return slot_.Offer(std::move(schedule), not_before_iteration,
                     std::move(incumbent), block_steps, block_pairs);
}

absl::Status Executor::Activate(const Schedule& schedule) {
  auto p = std::make_unique<Prepared>();
  p->schedule = schedule;
  p->before.resize(graph_.nodes.size());
  p->after.resize(graph_.nodes.size());
  for (const Action& a : schedule.actions) {
    (a.position == AnchorPosition::kBefore ? p->before : p->after)[a.node_id]
        .push_back(a);
  }
  for (const GatherGroup& g : schedule.groups) {
    int64_t bytes = 0;
    for (int32_t id : g.param_ids) bytes += store_->full_bytes(id);
    p->group_params[g.id] = g.param_ids;
    p->group_bytes[g.id] = bytes;
  }
  p->persistent = schedule.persistent_param_ids;
  p->is_persistent.assign(graph_.params.size(), false);
  for (int32_t id : p->persistent) p->is_persistent[id] = true;
  for (const OffloadEntry& o : schedule.offloads) {
    p->offload_params[o.id] = o.param_ids;
  }
  if (!schedule.offloads.empty() && host_ == nullptr) {
    ASSIGN_OR_RETURN(host_,
                     HostTier::Create(store_->device(), options_.offload_dir));
  }
  // The host memory its offloads copy into, allocated now (at the
  // boundary, between steps) rather than by the first copy, which on a
  // fresh mapping freed the device states late (worker/README.md,
  // "Offload").
  for (const OffloadEntry& o : schedule.offloads) {
    RETURN_IF_ERROR(store_->ReserveHostStates(o.param_ids, *host_));
  }
  const Schedule* least = slot_.fallback();
  least_memory_active_ =
      least != nullptr && schedule.mode == least->mode &&
      schedule.groups == least->groups &&
      schedule.persistent_param_ids == least->persistent_param_ids &&
      schedule.offloads == least->offloads &&
      schedule.actions == least->actions;
  active_ = std::move(p);
  // The memory hold's line (HoldPlannedPeak): halfway from the plan's
  // predicted peak to where the memory guard trips, or that line itself
  // for a plan predicted inside the band. None without a budget, or under
  // the least-memory plan, which waits for its collectives as issued.
  hold_limit_ = 0;
  if (options_.budget_bytes > 0 && slot_.has_fallback() &&
      !least_memory_active_) {
    const int64_t guard_line = options_.budget_bytes - GuardBand();
    const int64_t predicted = schedule.prediction.peak_bytes;
    hold_limit_ = predicted > 0 && predicted < guard_line
                      ? predicted + (guard_line - predicted) / 2
                      : guard_line;
  }
  return absl::OkStatus();
}

void Executor::HoldPlannedPeak(int pos) {
  if (hold_limit_ <= 0) return;
  const int64_t rise = last_rise_[pos];
  // What the node will hold at most: its own rise, and the buffers of a
  // collective that starts while it runs (one that was to start before
  // it, or after it, can start now; one runs at a time).
  const auto over = [&] {
    return meter_->current_bytes() + rise + comm_->QueuedBufferBytes() >
           hold_limit_;
  };
  if (!over()) return;
  const SteadyTime start = Now();
  bool waited = false;
  std::deque<AsyncHandle>& in_flight = it_->in_flight;
  while (!in_flight.empty() && over()) {
    const AsyncHandle handle = std::move(in_flight.front());
    in_flight.pop_front();
    if (handle->done()) continue;
    const absl::Status status = handle->Wait();
    TORCH_CHECK(status.ok(), std::string(status.message()));
    waited = true;
  }
  // An offload frees its states on the device when its copy is done, and
  // the copy thread can run late too (a schedule's first copies into fresh
  // host pages, a busy core): oldest first, as the collectives.
  bool waited_copy = false;
  for (IterationState::Copy& c : it_->copies) {
    if (!over()) break;
    if (!c.frees || c.handle == nullptr || c.handle->done()) continue;
    const absl::Status status = c.handle->Wait();
    TORCH_CHECK(status.ok(), std::string(status.message()));
    waited_copy = true;
  }
  if (!waited && !waited_copy) return;
  const double held = Since(start);
  it_->memory_hold_s += held;
  it_->exposed_s += held;
  profiler_.RecordExchange(waited_copy ? "wait (memory: transfers in flight)"
                                       : "wait (memory: collectives in flight)",
                           start, Now());
}

void Executor::RefreshPersistent(const Prepared* previous) {
  if (mode_ == ShardingMode::kZero1 && previous != nullptr) {
    // The schedule's own gathers after the optimizer refreshed every param.
    refresh_.clear();
    refresh_next_ = 0;
    return;
  }
  if (previous != nullptr) {
    for (int32_t id : previous->persistent) {
      if (!active_->is_persistent[id]) store_->Release({id});
    }
  }
  refresh_.clear();
  refresh_next_ = 0;
  // The optimizer changed the shards: re-gather the persistent set in
  // chunks in the order the next forward uses them, overlapping whatever
  // the caller does before the next step and that step's forward; a node
  // waits for its params' chunk only. A frozen param did not change: it is
  // gathered only when it is not yet (every rank agrees on which: they ran
  // the same schedules, and cut the same chunks from the same graph).
  std::vector<int32_t> ids;
  for (int32_t id : active_->persistent) {
    if (store_->trainable(id) || !store_->allocated(id)) ids.push_back(id);
  }
  if (ids.empty()) return;
  store_->Release(ids);
  for (std::vector<int32_t>& chunk : PersistentRefreshChunks(graph_, ids)) {
    AsyncHandle handle = store_->Gather(chunk, *comm_);
    refresh_.push_back({std::move(handle), std::move(chunk)});
  }
}

void Executor::WaitRefreshThrough(size_t chunk) {
  for (; refresh_next_ <= chunk && refresh_next_ < refresh_.size();
       ++refresh_next_) {
    const RefreshChunk& c = refresh_[refresh_next_];
    CollectiveTiming t;
    t.kind = CollectiveKind::kAllGather;
    t.group_id = -1;
    t.param_ids = c.ids;
    for (int32_t p : c.ids) t.bytes += store_->full_bytes(p);
    t.node_id = static_cast<int32_t>(graph_.nodes.size() - 1);
    WaitCounted(c.handle, std::move(t));
  }
}

void Executor::WaitCounted(const AsyncHandle& handle, CollectiveTiming timing) {
  const double waited_before = handle->waited_s();
  const SteadyTime wait_start = Now();
  const absl::Status status = handle->Wait();
  TORCH_CHECK(status.ok(), std::string(status.message()));
  const double waited = handle->waited_s() - waited_before;
  it_->exposed_s += waited;
  if (profiler_.enabled()) {
    timing.issue_to_done_s = handle->issue_to_done_s();
    timing.run_s = handle->run_s();
    timing.exposed_s = waited;
    profiler_.RecordCollective(
        timing, {handle->started_at(), handle->finished_at(), wait_start});
  }
}

void Executor::EnsureParams(int pos) {
  const Node& node = graph_.nodes[pos];
  for (int32_t id : node.param_ids) {
    if (store_->materialized(id)) continue;
    if (active_->is_persistent[id] && refresh_next_ < refresh_.size()) {
      // The chunk that gathers it (a later one than those waited for).
      for (size_t c = refresh_next_; c < refresh_.size(); ++c) {
        const std::vector<int32_t>& chunk = refresh_[c].ids;
        if (std::find(chunk.begin(), chunk.end(), id) != chunk.end()) {
          WaitRefreshThrough(c);
          break;
        }
      }
      if (store_->materialized(id)) continue;
    }
    TORCH_CHECK(false, "node '", node.name, "' uses param '", store_->name(id),
                "', which schedule v", active_->schedule.version,
                " has not gathered and waited for at this point; the "
                "iteration was stopped before reading freed memory");
  }
}

void Executor::RunActions(int pos, AnchorPosition where) {
  const std::vector<Action>& actions = where == AnchorPosition::kBefore
                                           ? active_->before[pos]
                                           : active_->after[pos];
  for (const Action& a : actions) {
    switch (a.kind) {
      case ActionKind::kAllGather: {
        const std::vector<int32_t>& ids = active_->group_params.at(a.group_id);
        AsyncHandle handle =
            store_->Gather(ids, *comm_,
                           /*refresh=*/mode_ == ShardingMode::kZero1);
        it_->in_flight.push_back(handle);
        it_->gathers[a.group_id] = {std::move(handle), a.node_id};
        break;
      }
      case ActionKind::kWait: {
        auto g = it_->gathers.find(a.group_id);
        TORCH_CHECK(g != it_->gathers.end(), "WAIT for group g", a.group_id,
                    " at node ", graph_.nodes[pos].name,
                    " without an ALLGATHER");
        CollectiveTiming t;
        t.kind = CollectiveKind::kAllGather;
        t.group_id = a.group_id;
        t.bytes = active_->group_bytes.at(a.group_id);
        t.node_id = g->second.issued_at;
        WaitCounted(g->second.handle, std::move(t));
        break;
      }
      case ActionKind::kRelease:
        store_->Release(active_->group_params.at(a.group_id));
        it_->gathers.erase(a.group_id);
        break;
      case ActionKind::kReduceScatter: {
        int64_t bytes = 0;
        for (int32_t id : a.param_ids) bytes += store_->full_bytes(id);
        it_->reduces.push_back({store_->ReduceScatterGrads(a.param_ids, *comm_),
                                a.param_ids, a.node_id, bytes});
        it_->in_flight.push_back(it_->reduces.back().handle);
        if (least_memory_active_) {
          // The least-memory plan frees each gradient before backward goes
          // on, so its peak does not depend on how fast the link drains.
          const absl::Status reduced = it_->reduces.back().handle->Wait();
          TORCH_CHECK(reduced.ok(), std::string(reduced.message()));
        }
        break;
      }
      case ActionKind::kOffload: {
        const std::vector<int32_t>& ids =
            active_->offload_params.at(a.offload_id);
        int64_t bytes = 0;
        for (int32_t id : ids) {
          if (!store_->states_on_host(id)) bytes += store_->state_bytes(id);
        }
        absl::StatusOr<AsyncHandle> copy = store_->OffloadStates(ids, *host_);
        TORCH_CHECK(copy.ok(), std::string(copy.status().message()));
        it_->copies.push_back({absl::StrCat("offload o", a.offload_id), bytes,
                               *copy, /*frees=*/true});
        if (least_memory_active_ && *copy != nullptr) {
          // The memory guard's fallback: its states leave before compute
          // allocates, so its peak is the least any schedule reaches rather
          // than a race with the copy thread.
          const absl::Status copied = (*copy)->Wait();
          TORCH_CHECK(copied.ok(), std::string(copied.message()));
        }
        it_->offloaded_bytes += bytes;
        it_->max_offloaded_bytes =
            std::max(it_->max_offloaded_bytes, it_->offloaded_bytes);
        break;
      }
      case ActionKind::kReload: {
        const std::vector<int32_t>& ids =
            active_->offload_params.at(a.offload_id);
        int64_t bytes = 0;
        for (int32_t id : ids) {
          if (store_->states_on_host(id)) bytes += store_->state_bytes(id);
        }
        it_->offloaded_bytes -= bytes;
        it_->copies.push_back({absl::StrCat("reload o", a.offload_id), bytes,
                               store_->ReloadStates(ids, *host_)});
        break;
      }
    }
  }
}

void Executor::StartBackwardNode(int pos) {
  EnsureParams(pos);
  HoldPlannedPeak(pos);
  if (!profiler_.enabled()) return;
  it_->backward_memory = meter_->current_bytes();
  meter_->BeginNodeWindow();
  it_->backward_start = Now();
}

void Executor::FinishBackwardNode(int pos) {
  if (!profiler_.enabled()) return;
  profiler_.RecordNode(pos, Since(it_->backward_start));
  const OwnMemory own = meter_->NodeWindow();
  if (own.measured) last_rise_[pos] = own.rise_bytes;
  profiler_.RecordMemory(pos, it_->backward_memory, meter_->current_bytes(),
                         own);
}

void Executor::OnBackwardBoundary(int k, int i) {
  // Every node after i has finished its backward; node i's is next.
  const int finished = k * 2 * num_nodes_ + 2 * num_nodes_ - 2 - i;
  FinishBackwardNode(finished);
  RunActions(finished, AnchorPosition::kAfter);
  RunActions(finished + 1, AnchorPosition::kBefore);
  StartBackwardNode(finished + 1);
}

void Executor::OnBoundaryHook(int k, int i) {
  IterationState& it = *it_;
  --it.boundary_pending[i];
  // Boundaries fire in backward order; one whose hooks all fired before a
  // later one's waits for it.
  while (it.next_boundary >= 0 && it.boundary_pending[it.next_boundary] == 0) {
    const int b = it.next_boundary--;
    OnBackwardBoundary(k, b);
  }
}

std::string Executor::BoundaryName(int i) const {
  return absl::StrCat("between node '", program_->nodes[i].name, "' and node '",
                      program_->nodes[i + 1].name, "'");
}

std::vector<at::Tensor> Executor::RunForwardNode(
    int k, int i, std::vector<at::Tensor> inputs, bool* trained_so_far,
    const std::function<void(std::vector<at::Tensor>&)>& place) {
  const int n = num_nodes_;
  const int base = k * 2 * n;
  const int pos = base + i;
  const bool profiling = profiler_.enabled();
  const ProgramNode& node = program_->nodes[i];
  RunActions(pos, AnchorPosition::kBefore);
  EnsureParams(pos);
  HoldPlannedPeak(pos);
  bool grad_in = false;
  for (const at::Tensor& in : inputs) {
    grad_in = grad_in || (in.defined() && in.requires_grad());
  }
  bool trains = false;
  for (int32_t id : node.param_ids) trains = trains || store_->trainable(id);
  *trained_so_far = *trained_so_far || trains;
  // A node after the first that reads no gradient-carrying value (a
  // position embedding reading only the batch) has a backward that no
  // boundary orders: nothing the nodes before it compute waits for it. Its
  // params' gradients are then counted into the boundary before it, so
  // that this boundary (which runs the node's reduce-scatter) fires only
  // once they are accumulated. Not needed after a frozen prefix (the
  // boundary before it is dead): its backward is then the last, and the
  // dead boundaries fire after it.
  const bool unordered = i > 0 && !grad_in && trains &&
                         it_->boundary_pending[i - 1] != kDeadBoundary;
  std::vector<at::Tensor> params;
  params.reserve(node.param_ids.size());
  for (int32_t id : node.param_ids) {
    if (!unordered || !store_->trainable(id)) {
      params.push_back(store_->full(id));
      continue;
    }
    // A leaf sharing the param's storage: its gradient goes into the
    // param's own (as autograd would accumulate it) from a hook, which
    // then counts for the boundary.
    at::Tensor alias = store_->full(id).detach().requires_grad_(true);
    alias.register_hook([this, k, i, id](const at::Tensor& grad) {
      at::Tensor full = store_->full(id);
      at::Tensor& g = full.mutable_grad();
      g = g.defined() ? g + grad : grad.detach().clone();
      OnBoundaryHook(k, i - 1);
    });
    ++it_->boundary_pending[i - 1];
    params.push_back(std::move(alias));
  }
  const int64_t memory_before = profiling ? meter_->current_bytes() : 0;
  if (profiling) meter_->BeginNodeWindow();
  const SteadyTime start = profiling ? Now() : SteadyTime();
  std::vector<at::Tensor> out;
  if (node.recompute) {
    // Its backward twin recomputes it on the params gathered then.
    // StartBackwardNode checks them when the boundary before the twin
    // fires; the recompute checks again in case autograd reaches the node
    // first (a value skipping the boundary).
    auto state = c10::make_intrusive<RecomputeState>();
    state->node = &node;
    state->num_inputs = inputs.size();
    state->params = params;
    const int backward_pos = base + 2 * n - 1 - i;
    state->check_params = [this, backward_pos] { EnsureParams(backward_pos); };
    state->generator = at::globalContext().defaultGenerator(store_->device());
    {
      std::lock_guard<std::mutex> lock(state->generator.mutex());
      state->generator_state = state->generator.get_state();
    }
    std::vector<at::Tensor> args = std::move(inputs);
    args.insert(args.end(), params.begin(), params.end());
    out = RecomputeFunction::apply(at::TensorList(args), state);
  } else {
    out = node.forward(inputs, params);
  }
  inputs.clear();
  params.clear();
  TORCH_CHECK(out.size() == node.outputs.size(), "node '", node.name,
              "' returned ", out.size(), " tensors for its ",
              node.outputs.size(), " outputs");
  // Placed (and what no later node reads dropped) before the node's memory
  // is measured: what it leaves allocated is what the next nodes see.
  if (place) place(out);
  if (profiling) {
    profiler_.RecordNode(pos, Since(start));
    const OwnMemory own = meter_->NodeWindow();
    if (own.measured) last_rise_[pos] = own.rise_bytes;
    profiler_.RecordMemory(pos, memory_before, meter_->current_bytes(), own);
  }
  RunActions(pos, AnchorPosition::kAfter);
  return out;
}

void Executor::HookBoundary(
    int k, int i, bool trained_so_far,
    const std::function<
        void(const std::function<void(at::Tensor&, const std::string&)>&)>&
        crossing) {
  // Every value crossing the boundary that carries a gradient goes through
  // an identity with a hook; the boundary fires once all of them have
  // their gradient, i.e. when every later node's backward is done, even for
  // values that skip nodes.
  crossing([this, k, i](at::Tensor& value, const std::string& name) {
    if (!value.defined() || !value.requires_grad()) return;
    value = value.view_as(value);
    value.register_hook([this, k, i](at::Tensor) { OnBoundaryHook(k, i); });
    ++it_->boundary_pending[i];
    it_->boundary_values[i].push_back(name);
  });
  if (it_->boundary_pending[i] == 0 && !trained_so_far) {
    // A frozen prefix (e.g. a frozen embedding): backward does no work up
    // to here, so this boundary fires once loss.backward() returned.
    it_->boundary_pending[i] = kDeadBoundary;
  }
  TORCH_CHECK(it_->boundary_pending[i] != 0,
              "no value that carries a "
              "gradient flows ",
              BoundaryName(i),
              ", so backward has no point to run the actions anchored "
              "there; the nodes after it must read an output of a node "
              "with params");
}

std::vector<at::Tensor> Executor::RunGlue(int k, int g,
                                          std::vector<at::Tensor> inputs,
                                          bool* trained_so_far) {
  const ProgramGlue& glue = program_->glues[g];
  const int last = glue.first + glue.count - 1;
  int next = glue.first;
  auto name_of = [this](int i) {
    return i >= 0 && i < num_nodes_
               ? absl::StrCat(" ('", program_->nodes[i].name, "')")
               : std::string();
  };
  std::vector<at::Tensor> out;
  {
    GlueCallScope scope([&](int64_t unit, std::vector<at::Tensor> args) {
      TORCH_CHECK(unit == next && next <= last, "glue '", glue.name,
                  "' called node ", unit, name_of(static_cast<int>(unit)),
                  next <= last ? absl::StrCat(" where node ", next,
                                              name_of(next), " comes next")
                               : std::string(" after its last node"),
                  ": it must call each of its nodes once, in the order the "
                  "export recorded (control flow that picks other child "
                  "modules than on the example batch cannot run yet)");
      const int i = next++;
      std::vector<at::Tensor> o =
          RunForwardNode(k, i, std::move(args), trained_so_far, nullptr);
      // The boundary after a node inside the glue sits on the node's own
      // outputs, which the glue reads (the one after its last node on
      // what the glue returns, below).
      if (i < last) {
        const ProgramNode& node = program_->nodes[i];
        HookBoundary(k, i, *trained_so_far, [&](const auto& visit) {
          for (size_t o_i = 0; o_i < o.size(); ++o_i) {
            visit(o[o_i], node.outputs[o_i]);
          }
        });
      }
      return o;
    });
    out = glue.forward(inputs);
  }
  TORCH_CHECK(next == last + 1, "glue '", glue.name, "' called ",
              next - glue.first, " of its ", glue.count,
              " nodes: it must call each once per micro-batch (control flow "
              "that skips child modules cannot run yet)");
  TORCH_CHECK(out.size() == flow_.glue_outputs[g].size(), "glue '", glue.name,
              "' returned ", out.size(), " tensors for its ",
              flow_.glue_outputs[g].size(), " outputs");
  return out;
}

void Executor::RunMicroBatch(int k, const MicroBatch& batch) {
  const int n = num_nodes_;
  const int base = k * 2 * n;
  // The environment: every value alive in this micro-batch, by value id.
  std::vector<at::Tensor> env(flow_.values.size());
  for (size_t v = 0; v < program_->inputs.size(); ++v) {
    auto in = batch.tensors.find(flow_.values[v]);
    TORCH_CHECK(in != batch.tensors.end() && in->second.defined(),
                "micro-batch ", k, " has no tensor for input '",
                flow_.values[v], "' of model '", program_->name, "'");
    env[v] = in->second;
  }
  it_->boundary_pending.assign(std::max(n - 1, 0), 0);
  it_->boundary_values.assign(std::max(n - 1, 0), {});
  it_->next_boundary = n - 2;
  std::vector<at::Tensor> inputs;
  // Some node so far uses a trained param.
  bool trained_so_far = false;
  for (int i = 0; i < n; ++i) {
    const int g = flow_.glue_of[i];
    const std::vector<int32_t>& reads =
        g >= 0 ? flow_.glue_inputs[g] : flow_.node_inputs[i];
    const std::vector<int32_t>& writes =
        g >= 0 ? flow_.glue_outputs[g] : flow_.node_outputs[i];
    inputs.clear();
    for (int32_t v : reads) inputs.push_back(env[v]);
    if (g >= 0) i = program_->glues[g].first + program_->glues[g].count - 1;
    // The outputs into the environment; values no later node reads are
    // dropped (the loss is kept).
    auto place = [&](std::vector<at::Tensor>& out) {
      for (size_t o = 0; o < out.size(); ++o) {
        env[writes[o]] = std::move(out[o]);
      }
      for (size_t v = 0; v < env.size(); ++v) {
        if (env[v].defined() && flow_.last_reader[v] <= i &&
            static_cast<int32_t>(v) != flow_.loss) {
          env[v] = at::Tensor();
        }
      }
    };
    if (g >= 0) {
      std::vector<at::Tensor> out =
          RunGlue(k, g, std::move(inputs), &trained_so_far);
      place(out);
    } else {
      RunForwardNode(k, i, std::move(inputs), &trained_so_far, place);
    }
    inputs.clear();
    if (i + 1 == n) break;
    // Backward boundary i, on every value still read later.
    HookBoundary(k, i, trained_so_far, [&](const auto& visit) {
      for (size_t v = 0; v < env.size(); ++v) {
        if (static_cast<int32_t>(v) == flow_.loss) continue;
        visit(env[v], flow_.values[v]);
      }
    });
  }
  at::Tensor act = env[flow_.loss];
  env.clear();
  TORCH_CHECK(act.numel() == 1, "the loss '", program_->loss,
              "' must be a scalar, but it has ", act.numel(), " elements");
  // The reduce-scatter averages over ranks, so a weighted micro-batch's
  // loss is scaled by world * weight: its share of the global mean.
  // loss_sum holds this rank's loss (its micro-batches' sum when weighted),
  // which the exchange averages over ranks.
  const double weight = batch.loss_weight * comm_->world_size();
  it_->loss_sum +=
      batch.loss_weight > 0 ? act.item<double>() * weight : act.item<double>();
  at::Tensor loss = batch.loss_weight > 0      ? act * weight
                    : graph_.micro_batches > 1 ? act / graph_.micro_batches
                                               : act;
  act = at::Tensor();
  // GradScaler's scale(loss): in fp32, so that a 16-bit loss times the
  // scale does not overflow before backward starts.
  if (scaler_.enabled()) {
    loss = loss.to(at::kFloat) * static_cast<double>(scaler_.scale());
  }
  const int loss_backward = base + n;
  RunActions(loss_backward, AnchorPosition::kBefore);
  StartBackwardNode(loss_backward);
  loss.backward();
  // The boundaries of a frozen prefix, in backward order.
  while (it_->next_boundary >= 0 &&
         it_->boundary_pending[it_->next_boundary] == kDeadBoundary) {
    OnBackwardBoundary(k, it_->next_boundary--);
  }
  if (it_->next_boundary >= 0) {
    const int b = it_->next_boundary;
    std::vector<std::string> waiting;
    for (const std::string& v : it_->boundary_values[b]) {
      waiting.push_back(v);
    }
    TORCH_CHECK(false, "the backward boundary ", BoundaryName(b),
                " never fired: ", it_->boundary_pending[b], " of value(s) [",
                absl::StrJoin(waiting, ", "),
                "] got no gradient; every value a later node reads with "
                "requires_grad must reach the loss");
  }
  const int first_backward = base + 2 * n - 1;
  FinishBackwardNode(first_backward);
  RunActions(first_backward, AnchorPosition::kAfter);
}

absl::StatusOr<StepStats> Executor::RunStep(
    absl::Span<const MicroBatch> batches) {
  if (!broken_.ok()) return broken_;
  if (batches.size() != static_cast<size_t>(graph_.micro_batches)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunStep needs ", graph_.micro_batches,
                     " micro-batches, got ", batches.size()));
  }
  for (const MicroBatch& batch : batches) {
    if ((batch.loss_weight > 0) != (batches[0].loss_weight > 0)) {
      return absl::InvalidArgumentError(
          "every micro-batch of a step has a loss weight, or none has");
    }
  }
  StepStats stats;
  for (const MicroBatch& batch : batches) {
    for (const auto& [name, tensor] : batch.tensors)
      stats.work += tensor.numel();
  }
  absl::Status status = TorchCall(absl::StrCat("step ", step_),
                                  [&] { return RunStepImpl(batches, &stats); });
  it_.reset();
  if (!status.ok()) {
    broken_ = status;
    return status;
  }
  return stats;
}

absl::Status Executor::RunStepImpl(absl::Span<const MicroBatch> batches,
                                   StepStats* stats) {
  const SteadyTime start = Now();
  CpuWaitMeter cpu_wait;
  cpu_wait.Begin();
  meter_->ResetPeak();
  // Nodes run on this thread; their own memory is what it allocates.
  meter_->MarkComputeThread();
  it_ = std::make_unique<IterationState>();
  const int64_t version = active_->schedule.version;
  const bool least_memory = least_memory_active_;
  profiler_.BeginIteration(step_, version);

  const bool weighted = batches[0].loss_weight > 0;
  for (int k = 0; k < graph_.micro_batches; ++k) {
    RunMicroBatch(k, batches[k]);
  }

  const int optimizer = static_cast<int>(graph_.nodes.size()) - 1;
  RunActions(optimizer, AnchorPosition::kBefore);
  for (IterationState::Reduce& r : it_->reduces) {
    CollectiveTiming t;
    t.kind = CollectiveKind::kReduceScatter;
    t.param_ids = r.params;
    t.bytes = r.bytes;
    t.node_id = r.issued_at;
    WaitCounted(r.handle, std::move(t));
  }
  for (int id = 0; id < store_->num_params(); ++id) {
    if (store_->full(id).grad().defined()) {
      return absl::InternalError(absl::StrCat(
          "the gradient of '", store_->name(id),
          "' was produced after its reduce-scatter; the schedule reduces it "
          "too early"));
    }
  }
  if (!it_->gathers.empty()) {
    return absl::InternalError(
        absl::StrCat("gather group g", it_->gathers.begin()->first,
                     " is still gathered at the end of the iteration"));
  }

  // One exchange for the loss, the gradient norm and the schedule agreement.
  const SteadyTime optimizer_start = Now();
  const ScheduleReport report =
      slot_.Report(NearBudget(std::max(meter_->peak_bytes(), last_peak_)));
  constexpr int kFields = 5;
  const SteadyTime exchange_start = Now();
  ASSIGN_OR_RETURN(
      std::vector<double> all,
      comm_->AllGatherScalars(
          {weighted ? it_->loss_sum : it_->loss_sum / graph_.micro_batches,
           store_->ShardGradSquaredNorm(),
           static_cast<double>(report.pending_version),
           static_cast<double>(report.not_before),
           report.near_budget ? 1.0 : 0.0}));
  it_->exposed_s += Since(exchange_start);
  profiler_.RecordExchange("exchange (loss, grad norm, schedule)",
                           exchange_start, Now());
  const int world = comm_->world_size();
  double loss = 0;
  double squares = 0;
  std::vector<ScheduleReport> reports(world);
  for (int r = 0; r < world; ++r) {
    loss += all[r * kFields];
    squares += all[r * kFields + 1];
    reports[r].pending_version = static_cast<int64_t>(all[r * kFields + 2]);
    reports[r].not_before = static_cast<int64_t>(all[r * kFields + 3]);
    reports[r].near_budget = all[r * kFields + 4] != 0;
  }
  loss /= world;
  // Loss scaling: the gradients (and so the norm) carry the scale. A norm
  // that is not finite means some rank's gradients held an infinity or a
  // NaN; every rank sees the same sum, so every rank skips the step. The
  // scale is a power of two under the default factors, so unscaling the
  // norm, and the gradients below in the clip's one multiply, is exact.
  const float loss_scale = scaler_.scale();
  const bool skip = scaler_.enabled() && !std::isfinite(squares);
  const double norm = scaler_.enabled()
                          ? std::sqrt(squares) * scaler_.inv_scale()
                          : std::sqrt(squares);
  float factor = 1.0f;
  if (options_.adamw.grad_clip > 0 && !skip) {
    // As torch.nn.utils.clip_grad_norm_: an fp32 coefficient clamped at 1.
    factor = std::min(static_cast<float>(options_.adamw.grad_clip /
                                         (static_cast<float>(norm) + 1e-6)),
                      1.0f);
  }
  if (scaler_.enabled()) factor *= scaler_.inv_scale();
  // States a schedule left on the host (or a previous schedule did) come
  // back now; the step then waits, param by param, for what it updates.
  std::vector<int32_t> on_host;
  for (int id = 0; id < store_->num_params(); ++id) {
    if (store_->states_on_host(id)) on_host.push_back(id);
  }
  if (!on_host.empty()) {
    int64_t bytes = 0;
    for (int32_t id : on_host) bytes += store_->state_bytes(id);
    it_->copies.push_back({"reload (left on host)", bytes,
                           store_->ReloadStates(on_host, *host_)});
  }
  AdamWOptions adamw = options_.adamw;
  if (options_.lr_schedule) adamw.lr = options_.lr_schedule(step_);
  // AdamW counts the updates it made: a skipped step is none.
  const int64_t update = step_ + 1 - scaler_.state().skipped_steps;
  const double copy_wait_s =
      skip ? store_->SkipStep() : store_->AdamWStep(adamw, factor, update);
  scaler_.Update(skip);
  RunActions(optimizer, AnchorPosition::kAfter);
  if (profiler_.enabled()) {
    profiler_.RecordNode(optimizer, Since(optimizer_start));
  }
  ++step_;

  std::unique_ptr<Prepared> previous;
  if (const Schedule* next = slot_.Agree(reports, step_)) {
    previous = std::move(active_);
    RETURN_IF_ERROR(Activate(*next));
    if (slot_.fallback_active()) {
      std::vector<std::string> near;
      for (int r = 0; r < world; ++r) {
        if (reports[r].near_budget) near.push_back(absl::StrCat(r));
      }
      stats->memory_guard = true;
      stats->guard_reason = absl::StrCat(
          "memory guard: rank(s) ", absl::StrJoin(near, ", "),
          " came within the guard band of memory.budget_bytes ",
          options_.budget_bytes, " B under schedule v", version,
          " (this rank's peak so far ", meter_->peak_bytes(),
          " B); every rank runs the least-memory schedule from step ", step_);
    }
  }
  RefreshPersistent(previous != nullptr ? previous.get() : active_.get());

  stats->step = step_ - 1;
  stats->loss = loss;
  stats->grad_norm = norm;
  stats->loss_scale = loss_scale;
  stats->skipped = skip;
  stats->loss_scaling = scaler_.enabled();
  stats->iteration_s = Since(start);
  stats->cpu_wait_share = cpu_wait.EndShare(stats->iteration_s);
  stats->exposed_comm_s = it_->exposed_s;
  stats->peak_bytes = meter_->peak_bytes();
  stats->schedule_version = version;
  stats->exposed_copy_s = copy_wait_s;
  stats->memory_hold_s = it_->memory_hold_s;
  stats->offloaded_bytes = it_->max_offloaded_bytes;
  for (const IterationState::Copy& c : it_->copies) {
    // Copies still running (an offload issued late) belong to no span yet.
    if (c.handle != nullptr && c.handle->done()) {
      profiler_.RecordCopy(c.label, c.bytes, c.handle->started_at(),
                           c.handle->finished_at());
    }
  }
  profiler_.EndIteration(stats->iteration_s, stats->peak_bytes, stats->work);
  if (options_.budget_bytes <= 0) return absl::OkStatus();
  const bool switched = previous != nullptr;
  if (switched) {
    // The boundary gathered the new schedule's persistent params, so this
    // step's peak includes the switch: over the budget, it is the new
    // schedule's, and the new schedule's first exchange reports it (a
    // switch does not clear the signal).
    last_peak_ =
        stats->peak_bytes > options_.budget_bytes ? stats->peak_bytes : 0;
  } else {
    last_peak_ = stats->peak_bytes;
  }
  if (stats->peak_bytes <= options_.budget_bytes) return absl::OkStatus();
  if (least_memory) {
    // Rounded up to a MiB: a value to paste into the spec.
    const int64_t mib = int64_t{1} << 20;
    return absl::ResourceExhaustedError(absl::StrCat(
        "step ", stats->step, ": peak memory ", stats->peak_bytes,
        " B exceeds memory.budget_bytes ", options_.budget_bytes,
        " B under the least-memory schedule (every optimizer state "
        "offloaded), the smallest peak any schedule reaches: no schedule "
        "fits this budget; set memory.budget_bytes: ",
        (stats->peak_bytes + mib - 1) / mib,
        "MiB or more, or shard over more ranks"));
  }
  // A plan (or the baseline) went over: the next boundary's report says so
  // and every rank switches to the least-memory schedule there.
  return absl::OkStatus();
}

bool Executor::NearBudget(int64_t peak) const {
  if (options_.budget_bytes <= 0 || !slot_.has_fallback() ||
      least_memory_active_) {
    return false;
  }
  // The band alone: a spread of the step peaks widened it once, and
  // counted a spike that recurs at one value twice, as the peak and as the
  // spread (worker/README.md, "Memory guard").
  return peak >= options_.budget_bytes - GuardBand();
}

int64_t Executor::GuardBand() const {
  return static_cast<int64_t>(options_.guard_band *
                              static_cast<double>(options_.budget_bytes));
}

absl::StatusOr<std::vector<double>> Executor::ParamDigests() {
  if (!broken_.ok()) return broken_;
  ASSIGN_OR_RETURN(const std::vector<double> local,
                   TorchCallOr<std::vector<double>>("param digests", [&] {
                     return store_->ShardDigests();
                   }));
  ASSIGN_OR_RETURN(const std::vector<double> all,
                   comm_->AllGatherScalars(local));
  std::vector<double> digests(local.size(), 0.0);
  for (size_t r = 0; r < all.size() / std::max<size_t>(local.size(), 1); ++r) {
    for (size_t i = 0; i < local.size(); ++i) {
      digests[i] += all[r * local.size() + i];
    }
  }
  return digests;
}

}  // namespace tandem
