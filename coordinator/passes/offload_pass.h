// offload: when the simulated peak exceeds the budget (typically because the
// optimizer states of a large model do not fit next to its activations and
// gradients), moves just enough optimizer state to the host tier: whole
// params' states, largest first so that few entries do it. Each entry is
// copied out right after the first forward node, so the copy overlaps
// compute and is done long before the peak, and copied back during backward
// as late as the host link allows: the reloads are chained backwards from the
// optimizer's start using hw.HostCopySeconds, on the compute times without
// stalls (the tightest timeline later passes can produce), so the copy
// stream is done when the optimizer needs the states. The reference policy
// picks by memory alone; this one prices the host link.
//
// Entries hold one param's states each, bytes = shard elements ×
// OptimizerStateBytesPerElement. The pass re-simulates: it grows the set
// while the peak is still over the target (or moves reloads after a peak they
// fall before) and drops the smallest entries again when the plan is far
// under. The target is budget − memory_margin·budget, minus room for one
// gather group to be prefetched, when offloading can reach that; otherwise
// the budget itself.
//
// Does nothing (returns false) when the plan already fits within
// budget − memory_margin·budget: a plan squeezed into the last percent of the
// budget leaves prefetch no room to hide a single gather, and copies that
// overlap compute cost far less than exposed gathers. When even every
// state offloaded (reloaded right before the optimizer) cannot fit, fails
// with ResourceExhausted naming the smallest budget that would.
//
// Two more roles serve unshard in Tandem's pipeline (README.md):
//   - kLend ("offload-lend"): when the plan is communication-bound
//     (Σ communication > Σ compute), memory at the turn from forward to
//     backward is worth more as params kept gathered than as optimizer
//     states, which only the optimizer reads. Every param's states are
//     copied out after the first forward node and back during backward,
//     chained from the optimizer's start on the current plan's simulated
//     clock with each copy counted 3 times (the later passes shorten that
//     clock). Kept only when the simulation shows a lower peak and no
//     slower iteration: the copies overlap on the host link.
//   - kReturn ("offload-return"): after unshard, drops the smallest entries
//     whose bytes still fit under budget − memory_margin·budget at the peak
//     (halving the set while the simulation disagrees), so just enough
//     state stays on the host.
#ifndef TANDEM_COORDINATOR_PASSES_OFFLOAD_PASS_H_
#define TANDEM_COORDINATOR_PASSES_OFFLOAD_PASS_H_

#include "coordinator/passes/pass_interface.h"

namespace tandem {

class OffloadPass : public PlanningPass {
 public:
  enum class Role {
    // Make the plan fit (above); "offload".
    kFit,
    // Lend headroom to unshard; "offload-lend".
    kLend,
    // Take back what unshard did not use; "offload-return".
    kReturn,
  };

  // How Role::kLend lends.
  struct LendOptions {
    // Share of the optimizer-state bytes lent: whole params' states, largest
    // first, until they reach it (1: every state).
    double fraction = 1;
    // Lend only on a communication-bound plan, and keep it only when the
    // simulation shows a lower peak and no slower iteration (the pipeline's
    // rule). false lends regardless, for offload-unshard-search, which
    // judges the finished plan instead.
    bool only_when_it_pays = true;
  };

  explicit OffloadPass(Role role = Role::kFit) : role_(role) {}
  OffloadPass(Role role, LendOptions lend) : role_(role), lend_(lend) {}

  absl::string_view name() const override;

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override;

 private:
  Role role_;
  LendOptions lend_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PASSES_OFFLOAD_PASS_H_
