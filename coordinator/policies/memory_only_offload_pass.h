// memory-only-offload: DeepCompile's adaptive optimizer-state offloading
// (arXiv 2504.09983, Sec. 4.4; deepspeed/compile/passes/offload_adam_states.py,
// offload_opt_states_inc), which plans by memory alone: it never prices the
// host link. Read from the published pass:
//   - usable memory is (1 − 20%) of device memory (here the budget);
//   - walking the nodes with a running peak of the profiled memory (profiled
//     with the states already on the host), it offloads states in optimizer
//     order, whole, until running peak + states still on the device fit;
//     every offload chosen is issued at the start of the first forward;
//   - in the backward, walking forward in program order, it reloads the next
//     state right after a node whenever the peak of the rest of the backward
//     plus what is already back plus that state fits; the rest reloads after
//     the last backward node, before the optimizer.
// One offload entry per param (Adam moments and the fp32 master of its
// shard), in param order. Two readings of ours: the running peak covers the
// backward too (DeepCompile sizes the offload from the forward graph's
// profile alone, which under activation checkpointing leaves the backward
// over budget), and the reload test counts the states that never left (the
// published test omits them). No-op when everything fits.
#ifndef TANDEM_COORDINATOR_POLICIES_MEMORY_ONLY_OFFLOAD_PASS_H_
#define TANDEM_COORDINATOR_POLICIES_MEMORY_ONLY_OFFLOAD_PASS_H_

#include "coordinator/passes/pass_interface.h"

namespace tandem {

class MemoryOnlyOffloadPass : public PlanningPass {
 public:
  // offload_adam_states.py's MARGIN.
  static constexpr double kMemoryMargin = 0.2;

  absl::string_view name() const override { return "memory-only-offload"; }

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_POLICIES_MEMORY_ONLY_OFFLOAD_PASS_H_
