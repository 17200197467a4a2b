#include "coordinator/policies/fsdp_prefetch_pass.h"

#include <vector>

#include "absl/container/flat_hash_set.h"
#include "coordinator/policies/program_memory.h"

namespace tandem {
namespace {

// Groups gathered (issued and not released) just before action `index` of
// slot `slot`, in program order.
absl::flat_hash_set<int32_t> GatheredAt(const AnchoredSchedule& plan, int slot,
                                        size_t index) {
  absl::flat_hash_set<int32_t> gathered;
  for (int s = 0; s <= slot; ++s) {
    const std::vector<Action>& actions = plan.slot(s);
    const size_t end = s == slot ? index : actions.size();
    for (size_t i = 0; i < end; ++i) {
      if (actions[i].kind == ActionKind::kAllGather) {
        gathered.insert(actions[i].group_id);
      } else if (actions[i].kind == ActionKind::kRelease) {
        gathered.erase(actions[i].group_id);
      }
    }
  }
  return gathered;
}

// Position of the first action of `kind` on `group` in `actions`, or -1.
int FindAction(const std::vector<Action>& actions, ActionKind kind,
               int32_t group) {
  for (size_t i = 0; i < actions.size(); ++i) {
    if (actions[i].kind == kind && actions[i].group_id == group) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

}  // namespace

absl::StatusOr<bool> FsdpPrefetchPass::RunImpl(PlanningContext& context) {
  const Graph& graph = context.graph();
  Schedule& schedule = context.schedule();
  if (schedule.mode != ShardingMode::kZero3) return false;
  AnchoredSchedule plan(graph, context.index(), schedule);
  bool changed = false;

  for (const PhaseSegment& segment : PhaseSegments(graph)) {
    if (segment.phase != Phase::kBackward) continue;
    // The units' on-demand gathers in backward order: (slot, group).
    std::vector<std::pair<int, int32_t>> gathers;
    for (int pos = segment.first; pos <= segment.last; ++pos) {
      const int s = AnchoredSchedule::BeforeSlot(pos);
      for (const Action& a : plan.slot(s)) {
        if (a.kind == ActionKind::kAllGather)
          gathers.emplace_back(s, a.group_id);
      }
    }
    for (size_t k = 1; k < gathers.size(); ++k) {
      const auto [current_slot, current] = gathers[k - 1];
      const auto [next_slot, next] = gathers[k];
      if (next_slot == current_slot) continue;  // already issued together
      // Issue the next unit where the current one's backward starts: just
      // before the current unit's WAIT.
      std::vector<Action>& at = plan.slot(current_slot);
      int insert = FindAction(at, ActionKind::kWait, current);
      if (insert < 0) insert = static_cast<int>(at.size());
      const absl::flat_hash_set<int32_t> gathered =
          GatheredAt(plan, current_slot, insert);
      if (gathered.contains(next) ||
          static_cast<int>(gathered.size()) + 1 > max_gathered_units_) {
        continue;
      }
      std::vector<Action>& from = plan.slot(next_slot);
      const int old = FindAction(from, ActionKind::kAllGather, next);
      if (old < 0) continue;
      Action gather = from[old];
      from.erase(from.begin() + old);
      at.insert(at.begin() + insert, gather);
      changed = true;
    }
  }
  if (!changed) return false;
  plan.WriteTo(schedule);
  return true;
}

}  // namespace tandem
