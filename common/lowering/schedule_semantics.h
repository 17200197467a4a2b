// What makes a schedule runnable: the contract the planner and the worker
// share (the planner's invariant checkers run these after every pass; the
// worker runs CheckScheduleSemantics before executing a schedule):
//   - gather-before-use: every use of a non-persistent param happens while
//     its group is gathered and waited for (ALLGATHER, then WAIT), no group is
//     waited for without a gather, released while in flight, gathered twice or
//     left gathered at the end of the iteration;
//   - no-use-after-release: no param is used after its group's RELEASE
//     unless it is gathered again;
//   - reduce-once: every micro-batch's contribution to a gradient is reduced
//     exactly once: a param that gets a gradient is reduce-scattered either
//     once per iteration, after the last backward node producing it
//     (accumulated unsharded), or once per micro-batch that produces it, each
//     after that micro-batch's last producer and before the next one's first
//     (into the sharded accumulator; gradient_reduction.h). A frozen param
//     (Param::trainable false) gets no gradient: reducing it is an error.
// Program order is what counts: actions before a node, the node, actions
// after it. The simulator checks timing; these check meaning.
#ifndef TANDEM_COMMON_LOWERING_SCHEDULE_SEMANTICS_H_
#define TANDEM_COMMON_LOWERING_SCHEDULE_SEMANTICS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/ir/graph.h"
#include "common/ir/schedule.h"

namespace tandem {

enum class ViolationKind {
  kUseBeforeGather,
  kUseAfterRelease,
  kGatherMisuse,
  kReduceCount,
  kReduceTooEarly,
  // A per-micro-batch reduce-scatter after the next micro-batch started
  // producing the gradient.
  kReduceMixesMicroBatches,
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

// One invariant each, as a status (InvalidArgument naming the first few
// violations and what to fix): the planner's invariant checkers run these.
absl::Status CheckGatherBeforeUse(const Graph& graph, const Schedule& schedule);
absl::Status CheckNoUseAfterRelease(const Graph& graph,
                                    const Schedule& schedule);
absl::Status CheckReduceOnce(const Graph& graph, const Schedule& schedule);

}  // namespace tandem

#endif  // TANDEM_COMMON_LOWERING_SCHEDULE_SEMANTICS_H_
