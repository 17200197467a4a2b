#include "worker/runtime/standard_schedules.h"

#include <utility>

#include "common/sim/hardware_model.h"
#include "common/status_macros.h"
#include "coordinator/analysis/schedule_invariants.h"
#include "coordinator/passes/planning_context.h"
#include "coordinator/passes/zero3_insert_pass.h"

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

}  // namespace tandem
