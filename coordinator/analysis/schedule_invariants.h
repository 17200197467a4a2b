// The invariants every schedule keeps (DESIGN.md, "Passes"), as read-only
// analyses and as the pipeline's checkers:
//   - gather-before-use: every use of a non-persistent param happens while
//     its group is gathered and waited for (ALLGATHER, then WAIT), no group is
//     waited for without a gather, released while in flight, gathered twice or
//     left gathered at the end of the iteration;
//   - no-use-after-release: no param is used after its group's RELEASE
//     unless it is gathered again;
//   - reduce-once: every param that gets a gradient is reduce-scattered
//     exactly once per iteration, after the last backward node producing it;
//   - memory-budget: the simulated peak is within the budget (a pass that
//     starts over budget may not raise the peak; the plan as a whole must end
//     within it).
// Program order is what counts: actions before a node, the node, actions
// after it. The simulator checks timing; these check meaning.
#ifndef TANDEM_COORDINATOR_ANALYSIS_SCHEDULE_INVARIANTS_H_
#define TANDEM_COORDINATOR_ANALYSIS_SCHEDULE_INVARIANTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/ir/graph.h"
#include "common/ir/schedule.h"
#include "coordinator/passes/pass_interface.h"

namespace tandem {

enum class ViolationKind {
  kUseBeforeGather,
  kUseAfterRelease,
  kGatherMisuse,
  kReduceCount,
  kReduceTooEarly,
};

struct Violation {
  ViolationKind kind;
  std::string message;
};

// Walks the schedule in program order. Assumes ValidateSchedule passed.
std::vector<Violation> FindGatherViolations(const Graph& graph,
                                            const Schedule& schedule);
std::vector<Violation> FindReduceViolations(const Graph& graph,
                                            const Schedule& schedule);

// All semantic invariants but memory, as one status (InvalidArgument naming
// the first few violations). The worker runs this before executing a schedule.
absl::Status CheckScheduleSemantics(const Graph& graph,
                                    const Schedule& schedule);

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

class MemoryBudgetChecker : public InvariantChecker {
 public:
  absl::string_view name() const override { return "memory-budget"; }
  absl::Status Check(const PlanningContext& context) const override;
};

// Describes a byte count for messages, e.g. "81.3 GiB (87294562304 B)".
std::string FormatBytes(int64_t bytes);

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_ANALYSIS_SCHEDULE_INVARIANTS_H_
