// fsdp-prefetch: PyTorch FSDP's default prefetching, on a plan of one gather
// group per wrapping unit (zero3-insert with Grouping::kPerUnit, as FSDP
// wraps each block into one flat parameter).
//   - backward_prefetch=BACKWARD_PRE: when a unit's backward starts (its
//     pre-backward hook, where its own all-gather is issued), the next unit
//     in backward order is all-gathered too, one unit ahead; the current
//     unit is waited for after that issue, as FSDP orders it;
//   - forward_prefetch=False: forward gathers stay on demand;
//   - limit_all_gathers=True: at most two units gathered at once (the rate
//     limiter holds the CPU back from issuing a third); a prefetch that would
//     make a third is left on demand.
// Prefetch stays within one backward pass. Reduce-scatters stay where
// zero3-insert put them (FSDP reduces a unit's flat gradient once after the
// unit's backward; per node is what the shared baseline does).
#ifndef TANDEM_COORDINATOR_POLICIES_FSDP_PREFETCH_PASS_H_
#define TANDEM_COORDINATOR_POLICIES_FSDP_PREFETCH_PASS_H_

#include "coordinator/passes/pass_interface.h"

namespace tandem {

class FsdpPrefetchPass : public PlanningPass {
 public:
  static constexpr int kDefaultMaxGatheredUnits = 2;

  explicit FsdpPrefetchPass(int max_gathered_units = kDefaultMaxGatheredUnits)
      : max_gathered_units_(max_gathered_units) {}

  absl::string_view name() const override { return "fsdp-prefetch"; }

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override;

 private:
  int max_gathered_units_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_POLICIES_FSDP_PREFETCH_PASS_H_
