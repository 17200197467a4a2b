#include "coordinator/passes/invariant_checkers.h"

#include "absl/strings/str_cat.h"
#include "common/bytes.h"
#include "common/lowering/schedule_semantics.h"

namespace tandem {

absl::Status GatherBeforeUseChecker::Check(
    const PlanningContext& context) const {
  return CheckGatherBeforeUse(context.graph(), context.schedule());
}

absl::Status NoUseAfterReleaseChecker::Check(
    const PlanningContext& context) const {
  return CheckNoUseAfterRelease(context.graph(), context.schedule());
}

absl::Status ReduceOnceChecker::Check(const PlanningContext& context) const {
  return CheckReduceOnce(context.graph(), context.schedule());
}

absl::Status MemoryBudgetChecker::Check(const PlanningContext& context) const {
  const int64_t peak = context.sim().peak_bytes;
  const int64_t budget = context.budget();
  if (peak <= budget || peak <= context.peak_at_pass_start()) {
    return absl::OkStatus();
  }
  const MemoryBreakdown& b = context.sim().peak_breakdown;
  return absl::ResourceExhaustedError(absl::StrCat(
      "simulated peak ", FormatBytes(peak), " exceeds the budget ",
      FormatBytes(budget), " at n", context.sim().peak_node_id, " (params ",
      FormatBytes(b.sharded_params + b.persistent_params), ", gathered ",
      FormatBytes(b.gathered_params), ", activations ",
      FormatBytes(b.activations), ", gradients ", FormatBytes(b.gradients),
      ", optimizer states ", FormatBytes(b.optimizer_states),
      ") and the pass raised it from ",
      FormatBytes(context.peak_at_pass_start())));
}

}  // namespace tandem
