// zero3-insert: the ZeRO-3 baseline (LowerZero3 in
// common/lowering/lowering.h, which the worker starts every job on).
// Params already in the schedule's persistent set stay out of the groups;
// everything else in the plan (groups, actions, offloads) is replaced.
// With gradient accumulation, gradients are accumulated unsharded and
// reduced once (kOnce, the worker's starting schedule) or reduce-scattered
// after every micro-batch into the sharded accumulator (kPerMicroBatch: what
// FSDP and DeepSpeed do, so their policies lower with it).
#ifndef TANDEM_COORDINATOR_PASSES_ZERO3_INSERT_PASS_H_
#define TANDEM_COORDINATOR_PASSES_ZERO3_INSERT_PASS_H_

#include "common/lowering/lowering.h"
#include "coordinator/passes/pass_interface.h"

namespace tandem {

class Zero3InsertPass : public PlanningPass {
 public:
  explicit Zero3InsertPass(
      GatherGrouping grouping = GatherGrouping::kPerNode,
      GradientReduction reduction = GradientReduction::kOnce)
      : grouping_(grouping), reduction_(reduction) {}

  absl::string_view name() const override { return "zero3-insert"; }

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override;

 private:
  GatherGrouping grouping_;
  GradientReduction reduction_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PASSES_ZERO3_INSERT_PASS_H_
