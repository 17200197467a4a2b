// unshard: keeps chosen gather groups gathered across phases, spending the
// memory headroom budget − simulated peak − memory_margin·budget where it
// saves the most time. Each chosen group is held one of two ways:
//   - kept: gathered at its first gather and released at its last release;
//     every RELEASE, ALLGATHER and WAIT of it in between is dropped, so the
//     backward gather (the recompute's, under checkpointing) and every
//     later micro-batch's gathers are saved. It holds its bytes from its
//     first forward use to its last backward use;
//   - persistent: no ALLGATHER, WAIT or RELEASE at all, bytes held all
//     iteration, and re-gathered in the one fused all-gather that refreshes
//     persistent params after the optimizer (always exposed). Chosen only
//     for latency-bound groups (small params such as norms), where that
//     refresh costs next to nothing and the first gather's latency counts.
// Gradient accumulation makes both pay most.
//
// A group's value is the gather seconds it saves over all its occurrences,
// weighted by how much of them lies on the critical path: all of it when
// communication is the bottleneck (Σ communication >= Σ compute: every
// second saved shortens the iteration), otherwise the larger of the group's
// own exposed fraction and the schedule's; a persistent group's share of
// the refresh is subtracted. Its cost is its full bytes: either way they are
// live at the turn from forward to backward, where activations peak. The
// choice is a real 0/1 knapsack (exact for a few groups, else a dynamic
// program over the headroom in ~2000 buckets), not a greedy ratio order that
// stops at the first misfit. Among groups of equal cost and value (the same
// layer shape) the picks are spread evenly over the model instead of taking
// a run of consecutive layers: backward compute races through a run of held
// groups, and every full gradient it leaves queued behind the
// reduce-scatters stays alive. The real peak differs from the estimate both
// ways (a group gathered at the peak moment was already counted; gradients
// queue), so the pass simulates the choice, keeps the longest prefix that
// fits (binary search; groups used just before the peak dropped first, then
// the least valuable per byte), and refills the headroom the simulation
// reveals, a few rounds: about a dozen simulations in all.
//
// Among equals, which to pick is the Arrangement: spread (the default,
// above) or the groups the backward uses first (the last layers), whose
// releases make room for the gradients the backward produces; the
// offload-unshard-search pass tries both.
//
// Whole gather groups are held. Gathers of the remaining groups keep their
// anchors; the pipeline runs prefetch again afterwards to re-anchor them
// against the shorter timeline. Only ZeRO-3 schedules are touched.
#ifndef TANDEM_COORDINATOR_PASSES_UNSHARD_PASS_H_
#define TANDEM_COORDINATOR_PASSES_UNSHARD_PASS_H_

#include <cstdint>
#include <vector>

#include "coordinator/passes/pass_interface.h"

namespace tandem {

class UnshardPass : public PlanningPass {
 public:
  // Which of equally valued groups of one shape are held.
  enum class Arrangement {
    // Spread evenly over the model ("spread").
    kSpread,
    // The ones the backward uses first ("backward-first").
    kBackwardFirst,
  };

  explicit UnshardPass(Arrangement arrangement = Arrangement::kSpread)
      : arrangement_(arrangement) {}

  absl::string_view name() const override { return "unshard"; }
  Arrangement arrangement() const { return arrangement_; }

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override;

 private:
  Arrangement arrangement_;
};

// A 0/1 knapsack: the indices (ascending) of the items of largest total
// value whose costs sum to at most `capacity`. Exact for up to 16 items;
// beyond, a dynamic program over `capacity` split into `buckets` equal parts,
// each cost rounded up, so the choice always fits. Items with a non-positive
// value or a cost above the capacity are never chosen.
std::vector<int> SolveKnapsack(const std::vector<double>& values,
                               const std::vector<int64_t>& costs,
                               int64_t capacity, int buckets = 2000);

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PASSES_UNSHARD_PASS_H_
