// micro-batch-reduce: with gradient accumulation (K > 1 micro-batches), picks
// per reduce group how each gradient is reduced
// (common/lowering/gradient_reduction.h): accumulated unsharded across the
// micro-batches and reduce-scattered once (fewer bytes on the link, the
// full-size gradient held from the first micro-batch's backward on), or
// reduce-scattered after every micro-batch into the sharded fp32
// accumulator (K times the bytes, the full gradient held within one
// micro-batch). A reduce group is the params whose gradients the same
// backward node completes (one REDUCE_SCATTER in the baseline). Its price
// is (K−1) more reduce-scatters of its bytes (hw.ReduceScatterSeconds); its
// gain is its full gradient bytes no longer held across micro-batches.
//
// Accumulating a whole large model's gradients does not fit next to its
// activations (Llama-3 70B on 32 ranks at grad_accum 4 would need 147 GiB),
// so the planner must choose, as FSDP and DeepSpeed never do (they always
// reduce per micro-batch). Three roles, like offload's:
//   - kFit ("micro-batch-reduce"), before offload: when the plan exceeds
//     budget − memory_margin·budget, switches groups to per-micro-batch
//     reduction, most gradient bytes saved per extra link second first, the
//     fewest that bring the simulated peak under that target (binary search
//     over the ordered prefix); when even all of them do not, all of them
//     (offload follows). Returns false when the plan fits or K = 1.
//   - kLend ("micro-batch-reduce-lend"), before unshard: per byte, a param
//     kept gathered saves K or more all-gathers while an accumulated gradient
//     saves K−1 reduce-scatters, so on a communication-bound plan (Σ
//     communication > Σ compute) every group is switched to per-micro-batch
//     reduction and its memory lent to unshard. Kept only when the simulated
//     peak drops.
//   - kReturn ("micro-batch-reduce-return"), after unshard: switches groups
//     back to reduce-once, most link seconds saved per byte first, the most
//     that keep the simulated peak within budget − memory_margin·budget (or
//     the peak it started at, when higher), so the memory unshard did not
//     use still goes to fewer bytes on the link. Kept only when the
//     simulated iteration is not slower.
// Only ZeRO-3 schedules are touched.
#ifndef TANDEM_COORDINATOR_PASSES_GRADIENT_REDUCTION_PASS_H_
#define TANDEM_COORDINATOR_PASSES_GRADIENT_REDUCTION_PASS_H_

#include "coordinator/passes/pass_interface.h"

namespace tandem {

class GradientReductionPass : public PlanningPass {
 public:
  enum class Role {
    // Make the plan fit; "micro-batch-reduce".
    kFit,
    // Lend gradient memory to unshard; "micro-batch-reduce-lend".
    kLend,
    // Take back what unshard did not use; "micro-batch-reduce-return".
    kReturn,
  };

  explicit GradientReductionPass(Role role = Role::kFit) : role_(role) {}

  absl::string_view name() const override;

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override;

 private:
  Role role_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PASSES_GRADIENT_REDUCTION_PASS_H_
