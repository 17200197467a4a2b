#include "coordinator/planner/planner.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ir/validate.h"
#include "common/status_macros.h"
#include "coordinator/analysis/schedule_invariants.h"
#include "coordinator/passes/offload_pass.h"
#include "coordinator/passes/prefetch_pass.h"
#include "coordinator/passes/unshard_pass.h"
#include "coordinator/passes/zero1_pass.h"
#include "coordinator/passes/zero3_insert_pass.h"
#include "coordinator/policies/anchored_schedule.h"
#include "coordinator/policies/deepspeed_persistence_pass.h"
#include "coordinator/policies/deepspeed_prefetch_pass.h"
#include "coordinator/policies/fsdp_prefetch_pass.h"
#include "coordinator/policies/greedy_prefetch_pass.h"
#include "coordinator/policies/greedy_unshard_pass.h"
#include "coordinator/policies/memory_only_offload_pass.h"
#include "coordinator/policies/split_gather_groups_pass.h"

namespace tandem {
namespace {

constexpr Policy kAllPolicies[] = {Policy::kOnDemand, Policy::kDeepSpeedZero3,
                                   Policy::kFsdp, Policy::kDeepCompile,
                                   Policy::kTandem};

// The policy's passes, in order, with the four invariant checkers; the
// memory checker is left out when `check_memory` is false.
std::unique_ptr<PassPipeline> BuildPipeline(Policy policy, ShardingMode mode,
                                            PassRecordSink* sink,
                                            bool check_memory) {
  auto pipeline =
      std::make_unique<PassPipeline>(std::string(PolicyName(policy)), sink);
  pipeline->AddInvariantChecker<GatherBeforeUseChecker>();
  pipeline->AddInvariantChecker<NoUseAfterReleaseChecker>();
  pipeline->AddInvariantChecker<ReduceOnceChecker>();
  if (check_memory) pipeline->AddInvariantChecker<MemoryBudgetChecker>();
  switch (policy) {
    case Policy::kOnDemand:
      pipeline->AddPass<Zero3InsertPass>();
      break;
    case Policy::kDeepSpeedZero3:
      pipeline->AddPass<DeepSpeedPersistencePass>();
      pipeline->AddPass<Zero3InsertPass>();
      pipeline->AddPass<SplitGatherGroupsPass>();
      pipeline->AddPass<DeepSpeedPrefetchPass>();
      break;
    case Policy::kFsdp:
      pipeline->AddPass<Zero3InsertPass>(Zero3InsertPass::Grouping::kPerUnit);
      pipeline->AddPass<FsdpPrefetchPass>();
      break;
    case Policy::kDeepCompile:
      // DeepCompile runs on ZeRO-3 (small params persistent), gathers param
      // by param, and schedules offloading before profiling the passes that
      // follow.
      pipeline->AddPass<DeepSpeedPersistencePass>();
      pipeline->AddPass<Zero3InsertPass>();
      pipeline->AddPass<SplitGatherGroupsPass>();
      pipeline->AddPass<MemoryOnlyOffloadPass>();
      pipeline->AddPass<GreedyPrefetchPass>();
      pipeline->AddPass<GreedyUnshardPass>();
      break;
    case Policy::kTandem:
      // coordinator/passes/README.md.
      if (mode == ShardingMode::kZero1) {
        pipeline->AddPass<Zero1Pass>();
        pipeline->AddPass<OffloadPass>();
      } else {
        pipeline->AddPass<Zero3InsertPass>();
        pipeline->AddPass<OffloadPass>();
        pipeline->AddPass<PrefetchPass>();
        pipeline->AddPass<OffloadPass>(OffloadPass::Role::kLend);
        pipeline->AddPass<UnshardPass>();
        pipeline->AddPass<OffloadPass>(OffloadPass::Role::kReturn);
        pipeline->AddPass<PrefetchPass>();
      }
      break;
  }
  return pipeline;
}

// Holds pass records until the run they belong to is the one returned.
class BufferedSink : public PassRecordSink {
 public:
  void Record(const PassRecord& record) override { records_.push_back(record); }
  void Clear() { records_.clear(); }
  void ForwardTo(PassRecordSink* sink) const {
    if (sink == nullptr) return;
    for (const PassRecord& record : records_) sink->Record(record);
  }

 private:
  std::vector<PassRecord> records_;
};

// A context holding the plan the job starts from: the on-demand baseline for
// ZeRO-3 (what workers run before any plan, so the memory checker judges
// every pass against it), an empty ZeRO-1 plan otherwise.
absl::StatusOr<std::unique_ptr<PlanningContext>> SeededContext(
    const Graph& graph, const HardwareModel& hw, const PlanOptions& options) {
  auto context = std::make_unique<PlanningContext>(graph, hw, options.planner);
  context->schedule().mode = options.mode;
  if (options.mode == ShardingMode::kZero3) {
    Zero3InsertPass baseline;
    RETURN_IF_ERROR(baseline.Run(*context).status());
  }
  RETURN_IF_ERROR(context->Resimulate());
  return context;
}

// The least-memory plan: the baseline of `mode` with every optimizer state
// offloaded before the first node and reloaded after the last backward node.
absl::StatusOr<PlanResult> LeastMemoryPlan(const Graph& graph,
                                           const HardwareModel& hw,
                                           ShardingMode mode) {
  PlanningContext context(graph, hw);
  context.schedule().mode = mode;
  if (mode == ShardingMode::kZero1) {
    Zero1Pass zero1;
    RETURN_IF_ERROR(zero1.Run(context).status());
  } else {
    Zero3InsertPass baseline;
    RETURN_IF_ERROR(baseline.Run(context).status());
  }
  Schedule& schedule = context.schedule();
  schedule.provenance.passes = {"zero3-insert", "offload-all-states"};
  if (mode == ShardingMode::kZero1) schedule.provenance.passes[0] = "zero1";
  int last_backward = -1;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (graph.nodes[i].phase == Phase::kBackward) {
      last_backward = static_cast<int>(i);
    }
  }
  if (!graph.nodes.empty()) {
    AnchoredSchedule plan(graph, context.index(), schedule);
    std::vector<Action> offloads;
    for (const Param& param : graph.params) {
      const int64_t bytes = ParamStateBytes(param, graph.world_size);
      if (bytes <= 0) continue;
      const int32_t id = static_cast<int32_t>(schedule.offloads.size());
      schedule.offloads.push_back({id, {param.id}, bytes});
      Action offload;
      offload.kind = ActionKind::kOffload;
      offload.offload_id = id;
      offloads.push_back(offload);
    }
    std::vector<Action>& first = plan.slot(AnchoredSchedule::BeforeSlot(0));
    first.insert(first.begin(), offloads.begin(), offloads.end());
    // Without a backward the states come back after the last node.
    const int reload_at = last_backward >= 0
                              ? last_backward
                              : static_cast<int>(graph.nodes.size()) - 1;
    for (const OffloadEntry& entry : schedule.offloads) {
      Action reload;
      reload.kind = ActionKind::kReload;
      reload.offload_id = entry.id;
      plan.slot(AnchoredSchedule::AfterSlot(reload_at)).push_back(reload);
    }
    plan.WriteTo(schedule);
  }
  RETURN_IF_ERROR(context.Resimulate());
  PlanResult result;
  result.schedule = schedule;
  result.sim = context.sim();
  result.feasible = result.sim.peak_bytes <= hw.budget();
  return result;
}

absl::Status Infeasible(const Graph& graph, const HardwareModel& hw,
                        ShardingMode mode, absl::string_view why) {
  absl::StatusOr<PlanResult> least = LeastMemoryPlan(graph, hw, mode);
  if (!least.ok()) return least.status();
  return absl::ResourceExhaustedError(absl::StrCat(
      "no plan fits the budget of ", FormatBytes(hw.budget()),
      " per rank: the smallest feasible budget is ",
      FormatBytes(least->sim.peak_bytes),
      mode == ShardingMode::kZero1
          ? " (the ZeRO-1 plan with every optimizer state offloaded). "
          : " (the on-demand baseline with every optimizer state offloaded). ",
      "Raise the budget to at least that, or shard over more ranks. (", why,
      ")"));
}

}  // namespace

absl::string_view PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kOnDemand:
      return "on-demand";
    case Policy::kDeepSpeedZero3:
      return "deepspeed-zero3";
    case Policy::kFsdp:
      return "fsdp";
    case Policy::kDeepCompile:
      return "deepcompile";
    case Policy::kTandem:
      return "tandem";
  }
  return "?";
}

std::optional<Policy> ParsePolicy(absl::string_view name) {
  for (Policy policy : kAllPolicies) {
    if (PolicyName(policy) == name) return policy;
  }
  return std::nullopt;
}

std::vector<Policy> AllPolicies() {
  return std::vector<Policy>(std::begin(kAllPolicies), std::end(kAllPolicies));
}

absl::StatusOr<Graph> ApplyProfile(const Graph& graph, const Profile& profile) {
  RETURN_IF_ERROR(ValidateProfile(profile, graph));
  Graph out = graph;
  const GraphIndex index(out);
  for (const NodeTiming& timing : profile.nodes) {
    const int pos = index.NodePos(timing.node_id);
    if (pos >= 0) out.nodes[pos].time_s = timing.time_s;
  }
  return out;
}

absl::Status FitCollectives(const Profile& profile, HardwareModel& hw) {
  std::vector<std::pair<int64_t, double>> allgather;
  std::vector<std::pair<int64_t, double>> reduce_scatter;
  for (const CollectiveTiming& c : profile.collectives) {
    if (c.kind == CollectiveKind::kAllGather) {
      allgather.emplace_back(c.bytes,
                             c.run_s > 0 ? c.run_s : c.issue_to_done_s);
    } else if (c.kind == CollectiveKind::kReduceScatter) {
      reduce_scatter.emplace_back(c.bytes,
                                  c.run_s > 0 ? c.run_s : c.issue_to_done_s);
    }
  }
  if (!allgather.empty()) {
    absl::StatusOr<PiecewiseLinear> fit =
        PiecewiseLinear::Fit(std::move(allgather));
    if (!fit.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "profile: all-gather timings: ", fit.status().message()));
    }
    hw.allgather_fit = *std::move(fit);
  }
  if (!reduce_scatter.empty()) {
    absl::StatusOr<PiecewiseLinear> fit =
        PiecewiseLinear::Fit(std::move(reduce_scatter));
    if (!fit.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "profile: reduce-scatter timings: ", fit.status().message()));
    }
    hw.reduce_scatter_fit = *std::move(fit);
  }
  return absl::OkStatus();
}

absl::Status CalibrateMemory(const Graph& timed, const Schedule& profiled,
                             const Profile& profile, HardwareModel& hw) {
  hw.unmodeled_bytes = 0;
  if (profile.peak_bytes <= 0) return absl::OkStatus();
  // The profile comes from the Tandem worker, which packs collectives.
  hw.collective_buffers = true;
  absl::StatusOr<SimResult> sim = Simulate(timed, profiled, hw);
  if (!sim.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the schedule the profile was measured under (v", profiled.version,
        ") does not replay on the graph: ", sim.status().message()));
  }
  hw.unmodeled_bytes =
      std::max<int64_t>(0, profile.peak_bytes - sim->peak_bytes);
  return absl::OkStatus();
}

absl::StatusOr<Schedule> StartingSchedule(const Graph& graph,
                                          ShardingMode mode) {
  PlanningContext context(graph, HardwareModel::H100(graph.world_size));
  context.schedule().mode = mode;
  const bool zero1 = mode == ShardingMode::kZero1;
  if (zero1) {
    RETURN_IF_ERROR(Zero1Pass().Run(context).status());
  } else {
    RETURN_IF_ERROR(Zero3InsertPass().Run(context).status());
  }
  Schedule schedule = context.schedule();
  schedule.version = 0;
  schedule.provenance.passes = {zero1 ? "zero1" : "zero3-insert"};
  schedule.provenance.reason = "baseline";
  return schedule;
}

absl::StatusOr<PlanResult> Plan(const Graph& graph, const HardwareModel& hw,
                                const PlanOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(ValidateGraph(graph));
  if (hw.world_size != graph.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the hardware model is for ", hw.world_size, " ranks but graph '",
        graph.name, "' for ", graph.world_size,
        "; set the hardware's world=", graph.world_size));
  }
  if (options.policy != Policy::kTandem &&
      options.mode != ShardingMode::kZero3) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy ", PolicyName(options.policy),
                     " plans ZeRO-3 jobs only; use the tandem policy for "
                     "ZeRO-1"));
  }

  ASSIGN_OR_RETURN(std::unique_ptr<PlanningContext> context,
                   SeededContext(graph, hw, options));
  BufferedSink records;
  std::unique_ptr<PassPipeline> pipeline = BuildPipeline(
      options.policy, options.mode, &records, /*check_memory=*/true);
  absl::Status status = pipeline->Run(*context).status();

  PlanResult result;
  if (options.policy == Policy::kTandem) {
    if (status.ok() && context->sim().peak_bytes > hw.budget()) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("the plan's simulated peak is ",
                       FormatBytes(context->sim().peak_bytes)));
    }
    if (!status.ok() && status.code() == absl::StatusCode::kResourceExhausted) {
      // Tandem's passes found no plan within the budget. The least-memory
      // plan (what SmallestFeasibleBudget measures) may still fit: return
      // it rather than fail a budget the error message would call feasible.
      ASSIGN_OR_RETURN(PlanResult least,
                       LeastMemoryPlan(graph, hw, options.mode));
      if (!least.feasible) {
        return Infeasible(graph, hw, options.mode, status.message());
      }
      result = std::move(least);
      records.Clear();
    } else if (!status.ok()) {
      return status;
    } else {
      result.schedule = context->schedule();
      result.sim = context->sim();
    }
  } else {
    if (status.code() == absl::StatusCode::kResourceExhausted) {
      // The framework would run out of memory; plan it anyway, unchecked for
      // memory, and report it infeasible.
      ASSIGN_OR_RETURN(context, SeededContext(graph, hw, options));
      records.Clear();
      pipeline = BuildPipeline(options.policy, options.mode, &records,
                               /*check_memory=*/false);
      status = pipeline->Run(*context).status();
    }
    RETURN_IF_ERROR(status);
    result.schedule = context->schedule();
    result.sim = context->sim();
  }
  records.ForwardTo(options.sink);
  result.feasible = result.sim.peak_bytes <= hw.budget();
  result.plan_wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  result.schedule.budget_bytes = hw.budget();
  result.schedule.provenance.plan_wall_s = result.plan_wall_s;
  return result;
}

absl::StatusOr<int64_t> SmallestFeasibleBudget(const Graph& graph,
                                               const HardwareModel& hw) {
  RETURN_IF_ERROR(ValidateGraph(graph));
  HardwareModel unlimited = hw;
  unlimited.budget_bytes = 0;
  ASSIGN_OR_RETURN(PlanResult least,
                   LeastMemoryPlan(graph, unlimited, ShardingMode::kZero3));
  return least.sim.peak_bytes;
}

}  // namespace tandem
