#include "worker/runtime/standard_schedules.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/lowering/anchored_schedule.h"
#include "common/lowering/lowering.h"
#include "common/lowering/schedule_semantics.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

absl::StatusOr<Schedule> Zero3(const Graph& graph, bool all_persistent,
                               int64_t version) {
  std::vector<int32_t> persistent;
  if (all_persistent) {
    for (const Param& p : graph.params) persistent.push_back(p.id);
  }
  Schedule schedule = LowerZero3(graph, persistent);
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
  Schedule schedule = LowerZero1(graph, bucket_bytes);
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
  std::vector<StateCopy> copies;
  for (int32_t id : param_ids) {
    const int pos = index.ParamPos(id);
    if (pos < 0) {
      return absl::InvalidArgumentError(absl::StrCat("no param p", id));
    }
    if (!graph.params[pos].trainable) {
      return absl::InvalidArgumentError(
          absl::StrCat("param p", id, " '", graph.params[pos].name,
                       "' is frozen and has no optimizer state to offload; "
                       "offload trained params only"));
    }
    copies.push_back({{id},
                      ParamStateBytes(graph.params[pos], graph.world_size),
                      AnchoredSchedule::AfterSlot(first_forward),
                      AnchoredSchedule::BeforeSlot(reload_at)});
  }
  SpliceStateOffloads(graph, index, copies, schedule);
  schedule.provenance.passes.push_back("offload-states");
  return schedule;
}

}  // namespace tandem
