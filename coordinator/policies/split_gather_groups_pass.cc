#include "coordinator/policies/split_gather_groups_pass.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace tandem {

absl::StatusOr<bool> SplitGatherGroupsPass::RunImpl(PlanningContext& context) {
  Schedule& schedule = context.schedule();
  bool renumbered = false;
  // Old group id -> the ids of its per-param groups.
  absl::flat_hash_map<int32_t, std::vector<int32_t>> split;
  std::vector<GatherGroup> groups;
  for (const GatherGroup& g : schedule.groups) {
    std::vector<int32_t>& ids = split[g.id];
    for (int32_t p : g.param_ids) {
      const int32_t id = static_cast<int32_t>(groups.size());
      ids.push_back(id);
      groups.push_back({id, {p}});
    }
    renumbered = renumbered || g.param_ids.size() != 1 || ids.front() != g.id;
  }
  if (!renumbered) return false;

  std::vector<Action> actions;
  actions.reserve(schedule.actions.size());
  for (const Action& a : schedule.actions) {
    const bool group_action = a.kind == ActionKind::kAllGather ||
                              a.kind == ActionKind::kWait ||
                              a.kind == ActionKind::kRelease;
    auto it = split.find(a.group_id);
    if (!group_action || it == split.end()) {
      actions.push_back(a);
      continue;
    }
    for (int32_t id : it->second) {
      Action one = a;
      one.group_id = id;
      actions.push_back(std::move(one));
    }
  }
  schedule.groups = std::move(groups);
  schedule.actions = std::move(actions);
  return true;
}

}  // namespace tandem
