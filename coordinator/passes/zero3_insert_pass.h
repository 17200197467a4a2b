// zero3-insert: the ZeRO-3 baseline. Builds the gather groups and, walking the
// nodes in order, gathers and waits for a group right before its first use,
// releases it after its last use in each phase segment (a run of nodes of one
// phase and micro-batch), and reduce-scatters each gradient right after the
// backward node that completes it. Every later pass starts from this plan and
// only moves, fuses or drops its actions, so the baseline is what makes a plan
// correct; the others make it fast.
//
// Params already in the schedule's persistent set are left out of the groups.
// Everything else in the schedule (groups, actions, offloads) is replaced.
#ifndef TANDEM_COORDINATOR_PASSES_ZERO3_INSERT_PASS_H_
#define TANDEM_COORDINATOR_PASSES_ZERO3_INSERT_PASS_H_

#include "coordinator/passes/pass_interface.h"

namespace tandem {

class Zero3InsertPass : public PlanningPass {
 public:
  enum class Grouping {
    // One group per forward node's params (finest; what Tandem starts from).
    kPerNode,
    // One group per wrapping unit (Param::unit), as FSDP wraps blocks.
    kPerUnit,
  };
  explicit Zero3InsertPass(Grouping grouping = Grouping::kPerNode)
      : grouping_(grouping) {}

  absl::string_view name() const override { return "zero3-insert"; }

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override;

 private:
  Grouping grouping_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PASSES_ZERO3_INSERT_PASS_H_
