#include "common/lowering/anchored_schedule.h"

#include <algorithm>
#include <utility>

#include "common/ir/graph.h"

namespace tandem {

AnchoredSchedule::AnchoredSchedule(const Graph& graph, const GraphIndex& index,
                                   const Schedule& schedule)
    : graph_(&graph), slots_(2 * graph.nodes.size()) {
  const std::vector<std::vector<int>> indices =
      ActionIndicesBySlot(graph, index, schedule);
  for (size_t s = 0; s < indices.size(); ++s) {
    for (int i : indices[s]) slots_[s].push_back(schedule.actions[i]);
  }
}

void AnchoredSchedule::WriteTo(Schedule& schedule) const {
  schedule.actions.clear();
  for (size_t s = 0; s < slots_.size(); ++s) {
    for (Action action : slots_[s]) {
      action.node_id = graph_->nodes[NodePosOf(static_cast<int>(s))].id;
      action.position =
          s % 2 == 0 ? AnchorPosition::kBefore : AnchorPosition::kAfter;
      schedule.actions.push_back(std::move(action));
    }
  }
}

std::vector<std::vector<int>> ActionIndicesBySlot(const Graph& graph,
                                                  const GraphIndex& index,
                                                  const Schedule& schedule) {
  std::vector<std::vector<int>> slots(2 * graph.nodes.size());
  for (size_t i = 0; i < schedule.actions.size(); ++i) {
    const Action& a = schedule.actions[i];
    const int pos = index.NodePos(a.node_id);
    if (pos < 0) continue;
    slots[AnchoredSchedule::Slot(pos, a.position)].push_back(
        static_cast<int>(i));
  }
  return slots;
}

std::vector<int64_t> ProgramOrder(const Graph& graph, const GraphIndex& index,
                                  const Schedule& schedule) {
  std::vector<int64_t> seq(schedule.actions.size(), -1);
  int64_t next = 0;
  for (const std::vector<int>& slot :
       ActionIndicesBySlot(graph, index, schedule)) {
    for (int i : slot) seq[i] = next++;
  }
  return seq;
}

int64_t ParamStateBytes(const Param& param, int32_t world_size) {
  if (!param.trainable) return 0;
  return param.shard_numel(std::max(world_size, 1)) *
         OptimizerStateBytesPerElement(param.dtype);
}

void SpliceStateOffloads(const Graph& graph, const GraphIndex& index,
                         absl::Span<const StateCopy> copies,
                         Schedule& schedule) {
  schedule.offloads.clear();
  schedule.actions.erase(
      std::remove_if(schedule.actions.begin(), schedule.actions.end(),
                     [](const Action& a) {
                       return a.kind == ActionKind::kOffload ||
                              a.kind == ActionKind::kReload;
                     }),
      schedule.actions.end());
  AnchoredSchedule slots(graph, index, schedule);
  // Per slot, the copies to put in front of it and behind it.
  std::vector<std::vector<Action>> front(slots.num_slots());
  std::vector<std::vector<Action>> back(slots.num_slots());
  auto place = [&](int slot, Action action) {
    (slot % 2 == 0 ? front : back)[slot].push_back(std::move(action));
  };
  for (size_t i = 0; i < copies.size(); ++i) {
    const int32_t id = static_cast<int32_t>(i);
    schedule.offloads.push_back({id, copies[i].param_ids, copies[i].bytes});
    Action offload;
    offload.kind = ActionKind::kOffload;
    offload.offload_id = id;
    place(copies[i].offload_slot, offload);
    Action reload = offload;
    reload.kind = ActionKind::kReload;
    place(copies[i].reload_slot, reload);
  }
  for (int s = 0; s < slots.num_slots(); ++s) {
    std::vector<Action>& slot = slots.slot(s);
    slot.insert(slot.begin(), front[s].begin(), front[s].end());
    slot.insert(slot.end(), back[s].begin(), back[s].end());
  }
  slots.WriteTo(schedule);
}

}  // namespace tandem
