// offload-unshard-search: plans offloading and unsharding jointly.
// Optimizer states lent to the host free memory at the turn from forward to
// backward that unshard can spend on params kept gathered, and which groups
// unshard keeps decides where the backward's memory and link time go. The
// fixed order (offload-lend, which lends only on communication-bound plans,
// then unshard, which spreads its picks over the model) finds one point of
// that space; this pass searches a few. For each variant it plans the rest
// of Tandem's pipeline on a copy of the plan:
//
//   offload-lend → micro-batch-reduce-lend → unshard →
//     micro-batch-reduce-return → offload-return → prefetch
//
// with offload-lend lending {by the pipeline's rule, nothing, the largest
// half of the optimizer states, all of them} (the last two even when the
// plan is not communication-bound: exposed gathers of a compute-bound plan
// are worth memory too) and unshard arranging its picks {spread,
// backward-first} (unshard_pass.h). A lend level whose lent plan equals one
// already tried is skipped. It keeps the finished plan that simulates
// fastest (ties: the lower peak) among those within the budget (or, for a
// plan that started over it, not above its starting peak). The pipeline's
// own order is the first variant, so the result is never slower than it:
// a 1-D search over lent bytes with unshard's knapsack inside, and
// offload-return takes back whatever the chosen plan does not use.
//
// About 8 plannings of those six passes at most; each variant runs without
// explaining. When the context explains, the chosen variant is planned again
// on the context itself (the passes are deterministic), so the inner passes
// record their decisions (decision_log.h), under this pass's name (the
// schedule's provenance names it, not them), followed by one kPass
// decision naming the variant chosen against the pipeline's order.
// Only ZeRO-3 schedules are touched.
#ifndef TANDEM_COORDINATOR_PASSES_OFFLOAD_UNSHARD_SEARCH_PASS_H_
#define TANDEM_COORDINATOR_PASSES_OFFLOAD_UNSHARD_SEARCH_PASS_H_

#include "coordinator/passes/offload_pass.h"
#include "coordinator/passes/pass_interface.h"
#include "coordinator/passes/unshard_pass.h"

namespace tandem {

class OffloadUnshardSearchPass : public PlanningPass {
 public:
  // One point of the search.
  struct Variant {
    OffloadPass::LendOptions lend;
    UnshardPass::Arrangement arrangement = UnshardPass::Arrangement::kSpread;
  };

  OffloadUnshardSearchPass() = default;

  absl::string_view name() const override { return "offload-unshard-search"; }

  // The variants tried, in order; the first is the pipeline's fixed order.
  static std::vector<Variant> Variants();

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PASSES_OFFLOAD_UNSHARD_SEARCH_PASS_H_
