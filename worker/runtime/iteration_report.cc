#include "worker/runtime/iteration_report.h"

#include <algorithm>
#include <vector>

namespace tandem {

double IterationReport::overlap_ratio() const {
  if (communication_s <= 0) return 1;
  return std::clamp(1 - exposed_communication_s / communication_s, 0.0, 1.0);
}

ScheduleFootprint ComputeScheduleFootprint(const Graph& graph,
                                           const Schedule& schedule) {
  auto param_bytes = [&](int32_t id) -> int64_t {
    return id >= 0 && id < static_cast<int32_t>(graph.params.size())
               ? graph.params[id].bytes()
               : 0;
  };
  ScheduleFootprint f;
  for (int32_t id : schedule.persistent_param_ids) {
    f.persistent_bytes += param_bytes(id);
  }
  // Actions in execution order: by node, those before it, then after it.
  std::vector<const Action*> ordered;
  ordered.reserve(schedule.actions.size());
  for (const Action& a : schedule.actions) ordered.push_back(&a);
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const Action* a, const Action* b) {
                     if (a->node_id != b->node_id) {
                       return a->node_id < b->node_id;
                     }
                     return a->position == AnchorPosition::kBefore &&
                            b->position != AnchorPosition::kBefore;
                   });
  int64_t gathered = 0, offloaded = 0;
  f.peak_gathered_bytes = f.persistent_bytes;
  for (const Action* a : ordered) {
    int64_t bytes = 0;
    if (a->kind == ActionKind::kAllGather || a->kind == ActionKind::kRelease) {
      if (const GatherGroup* g = schedule.FindGroup(a->group_id)) {
        for (int32_t id : g->param_ids) bytes += param_bytes(id);
      }
    } else if (a->kind == ActionKind::kOffload ||
               a->kind == ActionKind::kReload) {
      if (const OffloadEntry* o = schedule.FindOffload(a->offload_id)) {
        bytes = o->bytes;
      }
    }
    switch (a->kind) {
      case ActionKind::kAllGather:
        gathered += bytes;
        break;
      case ActionKind::kRelease:
        gathered = std::max<int64_t>(0, gathered - bytes);
        break;
      case ActionKind::kOffload:
        offloaded += bytes;
        break;
      case ActionKind::kReload:
        offloaded = std::max<int64_t>(0, offloaded - bytes);
        break;
      default:
        break;
    }
    f.peak_gathered_bytes =
        std::max(f.peak_gathered_bytes, gathered + f.persistent_bytes);
    f.peak_offloaded_bytes = std::max(f.peak_offloaded_bytes, offloaded);
  }
  return f;
}

}  // namespace tandem
