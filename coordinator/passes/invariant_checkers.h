// The pipeline's invariant checkers, run after every pass: the schedule
// semantics of common/lowering/schedule_semantics.h (what makes a schedule
// runnable, shared with the worker), and the memory budget, which only the
// planner's simulation can judge.
#ifndef TANDEM_COORDINATOR_PASSES_INVARIANT_CHECKERS_H_
#define TANDEM_COORDINATOR_PASSES_INVARIANT_CHECKERS_H_

#include "coordinator/passes/pass_interface.h"

namespace tandem {

class GatherBeforeUseChecker : public InvariantChecker {
 public:
  absl::string_view name() const override { return "gather-before-use"; }
  absl::Status Check(const PlanningContext& context) const override;
};

class NoUseAfterReleaseChecker : public InvariantChecker {
 public:
  absl::string_view name() const override { return "no-use-after-release"; }
  absl::Status Check(const PlanningContext& context) const override;
};

class ReduceOnceChecker : public InvariantChecker {
 public:
  absl::string_view name() const override { return "reduce-once"; }
  absl::Status Check(const PlanningContext& context) const override;
};

// The simulated peak is within the budget. A pass that starts over budget
// (before offload has run) may leave it there but never raise it; the plan
// as a whole must end within it.
class MemoryBudgetChecker : public InvariantChecker {
 public:
  absl::string_view name() const override { return "memory-budget"; }
  absl::Status Check(const PlanningContext& context) const override;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PASSES_INVARIANT_CHECKERS_H_
