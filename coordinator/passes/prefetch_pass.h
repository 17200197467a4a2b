// prefetch: moves each gather earlier so that it completes before the WAIT
// of its use, hoisting it only as far as needed to hide the transfer (plus
// PlannerOptions::prefetch_slack of its own transfer time), not as far as
// memory allows: the reference policy's rule spends on gathered buffers the
// memory that unshard could turn into saved communication.
//
// Collectives run one at a time in issue order, so each gather's latest start
// follows from the ones used after it: walking the communication stream's
// queue (gathers and reduce-scatters, as simulated) backwards,
// L_k = min(need_k, L_{k+1}) − dur_k. A gather then goes to the latest node
// boundary whose simulated time is at most max(L_k, free_k) − slack·dur_k,
// where free_k is when the stream gets to it anyway (issuing earlier than
// that only holds memory). Stalls shift every later time, so the pass
// re-simulates and, for a bounded number of rounds, moves late gathers
// earlier. This runs twice: once keeping each gather behind the
// reduce-scatters issued before it (the stream gets to it then anyway), and
// once letting a gather that would wait only behind such reduce-scatters be
// issued before them (LatestIssueAhead); the faster result is kept, since
// overtaking hides backward gathers but keeps full gradients alive longer.
// Issue order stays equal to use order, which the shared schedule makes the
// same on every rank. When the simulated peak would exceed the budget, the
// gathers prefetched across the peak are pulled later again (most speculative
// first); a plan that fitted keeps fitting, and one that did not never gets a
// higher peak.
//
// Finally neighbouring gathers issued at the same anchor in every occurrence
// are fused into one group when one collective of the sum is cheaper by at
// least PlannerOptions::fusion_gain (small, latency-bound params such as
// norms); the fused group is waited for at its first member's WAIT and
// released at its last member's RELEASE. A fusion is kept only when the
// simulation confirms it.
//
// Only ZeRO-3 schedules are touched; ZeRO-1 gathers run after the optimizer.
// The recommended pipeline order is in coordinator/passes/README.md.
#ifndef TANDEM_COORDINATOR_PASSES_PREFETCH_PASS_H_
#define TANDEM_COORDINATOR_PASSES_PREFETCH_PASS_H_

#include "coordinator/passes/pass_interface.h"

namespace tandem {

class PrefetchPass : public PlanningPass {
 public:
  PrefetchPass() = default;

  absl::string_view name() const override { return "prefetch"; }

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PASSES_PREFETCH_PASS_H_
