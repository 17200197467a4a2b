#include "worker/runtime/standard_schedules.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sim/hardware_model.h"
#include "common/sim/simulator.h"
#include "common/status_macros.h"
#include "coordinator/analysis/schedule_invariants.h"
#include "coordinator/passes/planning_context.h"
#include "coordinator/passes/zero1_pass.h"
#include "coordinator/passes/zero3_insert_pass.h"
#include "coordinator/planner/planner.h"

namespace tandem {
namespace {

absl::StatusOr<Schedule> Zero3(const Graph& graph, bool all_persistent,
                               int64_t version) {
  PlanningContext context(graph, HardwareModel::H100(graph.world_size));
  if (all_persistent) {
    for (const Param& p : graph.params) {
      context.schedule().persistent_param_ids.push_back(p.id);
    }
  }
  Zero3InsertPass pass(Zero3InsertPass::Grouping::kPerNode);
  RETURN_IF_ERROR(pass.Run(context).status());
  Schedule schedule = context.schedule();
  schedule.version = version;
  schedule.provenance.passes = {"zero3-insert"};
  schedule.provenance.reason = all_persistent ? "all-persistent" : "baseline";
  return schedule;
}

}  // namespace

absl::StatusOr<Schedule> OnDemandSchedule(const Graph& graph, int64_t version) {
  return Zero3(graph, /*all_persistent=*/false, version);
}

absl::StatusOr<Schedule> AllPersistentSchedule(const Graph& graph,
                                               int64_t version) {
  return Zero3(graph, /*all_persistent=*/true, version);
}

absl::StatusOr<Schedule> HoistGathers(const Graph& graph, Schedule schedule,
                                      int distance) {
  RETURN_IF_ERROR(CheckScheduleSemantics(graph, schedule));
  const GraphIndex index(graph);
  for (Action& action : schedule.actions) {
    if (action.kind != ActionKind::kAllGather ||
        action.position != AnchorPosition::kBefore) {
      continue;
    }
    for (int step = 0; step < distance; ++step) {
      const int pos = index.NodePos(action.node_id);
      if (pos <= 0) break;
      const int32_t original = action.node_id;
      action.node_id = graph.nodes[pos - 1].id;
      if (!CheckScheduleSemantics(graph, schedule).ok()) {
        action.node_id = original;
        break;
      }
    }
  }
  schedule.provenance.passes.push_back("hoist-gathers");
  return schedule;
}

absl::StatusOr<Schedule> Zero1Schedule(const Graph& graph, int64_t version,
                                       int64_t bucket_bytes) {
  PlanningContext context(graph, HardwareModel::H100(graph.world_size));
  Zero1Pass pass(bucket_bytes);
  RETURN_IF_ERROR(pass.Run(context).status());
  Schedule schedule = context.schedule();
  schedule.version = version;
  schedule.provenance.passes = {"zero1"};
  schedule.provenance.reason = "baseline";
  return schedule;
}

absl::StatusOr<Schedule> BaselineSchedule(const Graph& graph, int zero_stage,
                                          int64_t version) {
  ASSIGN_OR_RETURN(
      Schedule schedule,
      StartingSchedule(graph, zero_stage == 1 ? ShardingMode::kZero1
                                              : ShardingMode::kZero3));
  schedule.version = version;
  return schedule;
}

absl::StatusOr<Schedule> OffloadStates(const Graph& graph, Schedule schedule,
                                       absl::Span<const int32_t> param_ids,
                                       int reload_lead) {
  const GraphIndex index(graph);
  const int n = static_cast<int>(graph.nodes.size());
  int first_forward = -1;
  int optimizer = -1;
  for (int j = 0; j < n; ++j) {
    if (graph.nodes[j].phase == Phase::kForward && first_forward < 0) {
      first_forward = j;
    }
    if (graph.nodes[j].phase == Phase::kOptimizer) optimizer = j;
  }
  if (first_forward < 0 || optimizer < 0) {
    return absl::InvalidArgumentError(
        "offloading needs a graph with forward nodes and an optimizer node");
  }
  const int reload_at =
      std::clamp(optimizer - reload_lead, first_forward + 1, optimizer);
  schedule.offloads.clear();
  std::vector<Action> kept;
  for (const Action& a : schedule.actions) {
    if (a.kind != ActionKind::kOffload && a.kind != ActionKind::kReload) {
      kept.push_back(a);
    }
  }
  std::vector<Action> offloads;
  std::vector<Action> reloads;
  const int world = std::max(graph.world_size, 1);
  for (int32_t id : param_ids) {
    const int pos = index.ParamPos(id);
    if (pos < 0) {
      return absl::InvalidArgumentError(absl::StrCat("no param p", id));
    }
    const Param& p = graph.params[pos];
    const int32_t entry = static_cast<int32_t>(schedule.offloads.size());
    schedule.offloads.push_back(
        {entry,
         {id},
         p.shard_numel(world) * OptimizerStateBytesPerElement(p.dtype)});
    Action off;
    off.kind = ActionKind::kOffload;
    off.node_id = graph.nodes[first_forward].id;
    off.position = AnchorPosition::kAfter;
    off.offload_id = entry;
    offloads.push_back(off);
    Action re = off;
    re.kind = ActionKind::kReload;
    re.node_id = graph.nodes[reload_at].id;
    re.position = AnchorPosition::kBefore;
    reloads.push_back(re);
  }
  // Offloads after the first forward node's own actions; reloads first in
  // their slot, so a wait there does not delay the copies.
  std::vector<std::vector<Action>> slots(2 * n);
  for (const Action& a : kept) {
    const int pos = index.NodePos(a.node_id);
    slots[2 * pos + (a.position == AnchorPosition::kAfter ? 1 : 0)].push_back(
        a);
  }
  std::vector<Action>& after_first = slots[2 * first_forward + 1];
  after_first.insert(after_first.end(), offloads.begin(), offloads.end());
  std::vector<Action>& before_reload = slots[2 * reload_at];
  before_reload.insert(before_reload.begin(), reloads.begin(), reloads.end());
  std::vector<Action> actions;
  for (const std::vector<Action>& slot : slots) {
    actions.insert(actions.end(), slot.begin(), slot.end());
  }
  schedule.actions = std::move(actions);
  schedule.provenance.passes.push_back("offload-states");
  return schedule;
}

}  // namespace tandem
