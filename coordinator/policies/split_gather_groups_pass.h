// split-groups: one gather group per param. DeepSpeed ZeRO-3 and DeepCompile
// gather parameter by parameter (DeepSpeed coalesces a module's params into
// one call, but prefetches, counts and releases them one by one;
// DeepCompile's zero3 pass inserts one all-gather node per param), so their
// rules are modelled at param granularity. Each group of the incoming plan
// becomes one group per param, in the group's param order, and each of its
// ALLGATHER, WAIT and RELEASE actions becomes one action per param at the
// same anchor. Groups are renumbered 0.. in the new order.
#ifndef TANDEM_COORDINATOR_POLICIES_SPLIT_GATHER_GROUPS_PASS_H_
#define TANDEM_COORDINATOR_POLICIES_SPLIT_GATHER_GROUPS_PASS_H_

#include "coordinator/passes/pass_interface.h"

namespace tandem {

class SplitGatherGroupsPass : public PlanningPass {
 public:
  absl::string_view name() const override { return "split-groups"; }

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_POLICIES_SPLIT_GATHER_GROUPS_PASS_H_
