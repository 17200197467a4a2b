// greedy-prefetch: DeepCompile's prefetch pass (arXiv 2504.09983, Sec. 4.2;
// deepspeed/compile/passes/prefetch.py), which hoists each all-gather as
// early as memory allows. Read from the published pass, per forward or
// backward graph (here: per phase segment), walking its nodes from last to
// first with a list of pending gathers that are being hoisted:
//   - each on-demand gather met joins the current fusion bucket when one
//     fused collective is not much dearer than the larger of the two apart,
//     max(t(bucket), t(gather))·1.2 > t(bucket + gather), and the fused size
//     stays under 1e9 bytes; otherwise the bucket is closed and a new one
//     starts;
//   - before the pending gathers may move above a node, its profiled memory
//     plus the pending bytes must stay under (1 − 10%) of device memory (here
//     the budget), and the pending bytes under 4e9; while either fails, the
//     oldest closed bucket (the one used latest) is issued right after that
//     node;
//   - at the first node of the graph everything still pending is issued.
// Each gather keeps its WAIT before its use. The memory profile is the
// program-order estimate of the incoming plan (anchored_schedule.h), as
// DeepCompile profiles the previous schedule. A fused bucket is issued as
// back-to-back gathers of its members at one anchor: the IR's gather groups
// are fixed for the whole iteration, so the simulator charges each member its
// own latency. Run it on per-param groups (split-groups), as DeepCompile
// gathers param by param.
#ifndef TANDEM_COORDINATOR_POLICIES_GREEDY_PREFETCH_PASS_H_
#define TANDEM_COORDINATOR_POLICIES_GREEDY_PREFETCH_PASS_H_

#include <cstdint>

#include "coordinator/passes/pass_interface.h"

namespace tandem {

class GreedyPrefetchPass : public PlanningPass {
 public:
  // DeepCompile's constants (prefetch.py): MARGIN, MAX_FUSE_SIZE,
  // MAX_BUFFERED_SIZE and the fusion factor.
  static constexpr double kMemoryMargin = 0.1;
  static constexpr double kMaxFuseBytes = 1e9;
  static constexpr double kMaxBufferedBytes = 4e9;
  static constexpr double kFuseFactor = 1.2;

  absl::string_view name() const override { return "greedy-prefetch"; }

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_POLICIES_GREEDY_PREFETCH_PASS_H_
