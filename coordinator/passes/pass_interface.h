// The interface every planning pass implements, after XLA's
// HloPassInterface: a short kebab-case name and Run(), which forwards to the
// protected RunImpl() and reports whether the plan changed.
#ifndef TANDEM_COORDINATOR_PASSES_PASS_INTERFACE_H_
#define TANDEM_COORDINATOR_PASSES_PASS_INTERFACE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/passes/planning_context.h"

namespace tandem {

class PlanningPass {
 public:
  virtual ~PlanningPass() = default;
  virtual absl::string_view name() const = 0;

  // Returns true when the schedule changed.
  absl::StatusOr<bool> Run(PlanningContext& context) {
    return RunImpl(context);
  }

 protected:
  virtual absl::StatusOr<bool> RunImpl(PlanningContext& context) = 0;
};

// A read-only check run after every pass; a failure is reported as
// "<checker> failed after <pass>: ...".
class InvariantChecker {
 public:
  virtual ~InvariantChecker() = default;
  virtual absl::string_view name() const = 0;
  virtual absl::Status Check(const PlanningContext& context) const = 0;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PASSES_PASS_INTERFACE_H_
