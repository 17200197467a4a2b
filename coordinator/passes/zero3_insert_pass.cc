#include "coordinator/passes/zero3_insert_pass.h"

#include <utility>

namespace tandem {

absl::StatusOr<bool> Zero3InsertPass::RunImpl(PlanningContext& context) {
  Schedule& schedule = context.schedule();
  Schedule lowered = LowerZero3(context.graph(), schedule.persistent_param_ids,
                                grouping_, reduction_);
  const bool changed =
      schedule.mode != lowered.mode || !(schedule.groups == lowered.groups) ||
      !(schedule.actions == lowered.actions) || !schedule.offloads.empty();
  schedule.mode = lowered.mode;
  schedule.groups = std::move(lowered.groups);
  schedule.actions = std::move(lowered.actions);
  schedule.offloads.clear();
  return changed;
}

}  // namespace tandem
