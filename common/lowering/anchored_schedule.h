// A schedule's actions bucketed by anchor slot, so that a pass (or the
// worker's standard schedules) can move and insert actions and write them
// back in program order: slot 2·i holds the actions anchored before the node
// at position i, slot 2·i + 1 those after it, each in list order. Every piece
// of code that edits actions by position goes through here.
//
// Also the one splice of an optimizer-state offload plan into a schedule,
// shared by the offload pass, the least-memory plan and the worker's
// standard schedules.
#ifndef TANDEM_COMMON_LOWERING_ANCHORED_SCHEDULE_H_
#define TANDEM_COMMON_LOWERING_ANCHORED_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/ir/graph.h"
#include "common/ir/schedule.h"

namespace tandem {

class AnchoredSchedule {
 public:
  // Actions naming an unknown node are dropped (ValidateSchedule first).
  AnchoredSchedule(const Graph& graph, const GraphIndex& index,
                   const Schedule& schedule);

  static int BeforeSlot(int node_pos) { return 2 * node_pos; }
  static int AfterSlot(int node_pos) { return 2 * node_pos + 1; }
  static int Slot(int node_pos, AnchorPosition position) {
    return position == AnchorPosition::kAfter ? AfterSlot(node_pos)
                                              : BeforeSlot(node_pos);
  }
  // The node position of a slot.
  static int NodePosOf(int slot) { return slot / 2; }
  int num_slots() const { return static_cast<int>(slots_.size()); }

  std::vector<Action>& slot(int s) { return slots_[s]; }
  const std::vector<Action>& slot(int s) const { return slots_[s]; }

  // Replaces schedule.actions with the slots' actions in program order,
  // re-anchoring each to its slot's node and position.
  void WriteTo(Schedule& schedule) const;

 private:
  const Graph* graph_;
  std::vector<std::vector<Action>> slots_;
};

// Indices into schedule.actions by anchor slot, each slot in list order;
// actions on an unknown node are left out. What AnchoredSchedule holds as
// copies, for code that only reads the actions.
std::vector<std::vector<int>> ActionIndicesBySlot(const Graph& graph,
                                                  const GraphIndex& index,
                                                  const Schedule& schedule);

// Each action's rank in program order (its slot, then list order within the
// slot); -1 for an action on an unknown node.
std::vector<int64_t> ProgramOrder(const Graph& graph, const GraphIndex& index,
                                  const Schedule& schedule);

// Optimizer-state bytes of a param's shard on this rank, as the simulator
// counts them; 0 for a frozen param (it has none).
int64_t ParamStateBytes(const Param& param, int32_t world_size);

// One entry of an offload plan: the states of `param_ids` copied to the host
// at `offload_slot` and back at `reload_slot` (AnchoredSchedule slots).
struct StateCopy {
  std::vector<int32_t> param_ids;
  int64_t bytes = 0;
  int offload_slot = 0;
  int reload_slot = 0;
};

// Replaces `schedule`'s offload plan (entries, OFFLOAD and RELOAD actions)
// with `copies`: entry i gets id i. Copies go to the outside of their slot,
// in list order: first among the actions before a node (a RELOAD ahead of
// the node's WAITs, so a stall does not delay the copy), last among those
// after it (an OFFLOAD once the node's own actions are issued).
void SpliceStateOffloads(const Graph& graph, const GraphIndex& index,
                         absl::Span<const StateCopy> copies,
                         Schedule& schedule);

}  // namespace tandem

#endif  // TANDEM_COMMON_LOWERING_ANCHORED_SCHEDULE_H_
