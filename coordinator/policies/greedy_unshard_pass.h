// greedy-unshard: DeepCompile's selective unsharding (arXiv 2504.09983,
// Sec. 4.3; deepspeed/compile/passes/selective_gather.py). Keeping a param
// gathered for the whole iteration saves all its all-gathers at the cost of
// its full bytes. DeepCompile ranks the params by all-gather time per byte
// (the profiled time of all of a param's gathers over its size), takes them
// in that order while their bytes fit the headroom, usable memory
// (1 − 10%) minus the profiled peak, and stops at the first that does not
// fit. Here the profile is the simulation of the incoming plan (its peak
// counts whatever the earlier prefetch already hoisted) and a candidate is a
// gather group (one param after split-groups); chosen params become
// persistent and their gather actions go.
#ifndef TANDEM_COORDINATOR_POLICIES_GREEDY_UNSHARD_PASS_H_
#define TANDEM_COORDINATOR_POLICIES_GREEDY_UNSHARD_PASS_H_

#include "coordinator/passes/pass_interface.h"

namespace tandem {

class GreedyUnshardPass : public PlanningPass {
 public:
  // selective_gather.py's MEM_MARGIN.
  static constexpr double kMemoryMargin = 0.1;

  absl::string_view name() const override { return "greedy-unshard"; }

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_POLICIES_GREEDY_UNSHARD_PASS_H_
