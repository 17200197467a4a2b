#include "coordinator/passes/zero1_pass.h"

#include <utility>

namespace tandem {

absl::StatusOr<bool> Zero1Pass::RunImpl(PlanningContext& context) {
  Schedule& schedule = context.schedule();
  Schedule lowered = LowerZero1(context.graph(), bucket_bytes_);
  const bool changed =
      schedule.mode != lowered.mode || !(schedule.groups == lowered.groups) ||
      !(schedule.actions == lowered.actions) ||
      schedule.persistent_param_ids != lowered.persistent_param_ids ||
      !schedule.offloads.empty();
  schedule.mode = lowered.mode;
  schedule.groups = std::move(lowered.groups);
  schedule.actions = std::move(lowered.actions);
  schedule.persistent_param_ids = std::move(lowered.persistent_param_ids);
  schedule.offloads.clear();
  return changed;
}

}  // namespace tandem
