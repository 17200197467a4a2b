#include "common/lowering/least_memory.h"

#include <vector>

#include "common/lowering/anchored_schedule.h"
#include "common/lowering/gradient_reduction.h"
#include "common/lowering/lowering.h"
#include "common/status_macros.h"

namespace tandem {

absl::StatusOr<Schedule> LeastMemorySchedule(const Graph& graph,
                                             ShardingMode mode) {
  ASSIGN_OR_RETURN(Schedule schedule, StartingSchedule(graph, mode));
  if (mode == ShardingMode::kZero3 && graph.micro_batches > 1 &&
      graph.world_size > 1) {
    // Gradients reduced every micro-batch: no full gradient is held across
    // micro-batches (gradient_reduction.h). Alone, the sharded accumulator
    // is as large as the full gradient, so reducing once holds less.
    std::vector<int32_t> ids;
    for (const Param& param : graph.params) ids.push_back(param.id);
    SetGradientReduction(graph, ids, GradientReduction::kPerMicroBatch,
                         schedule);
  }
  schedule.version = kLeastMemoryVersion;
  schedule.provenance.passes = {
      mode == ShardingMode::kZero1 ? "zero1" : "zero3-insert",
      "offload-all-states"};
  schedule.provenance.reason = "least-memory";
  int last_backward = -1;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (graph.nodes[i].phase == Phase::kBackward) {
      last_backward = static_cast<int>(i);
    }
  }
  if (graph.nodes.empty()) return schedule;
  // Out before the first node, back after the last backward node (after the
  // last node without a backward).
  const int reload_at = last_backward >= 0
                            ? last_backward
                            : static_cast<int>(graph.nodes.size()) - 1;
  std::vector<StateCopy> copies;
  for (const Param& param : graph.params) {
    const int64_t bytes = ParamStateBytes(param, graph.world_size);
    if (bytes <= 0) continue;
    copies.push_back({{param.id},
                      bytes,
                      AnchoredSchedule::BeforeSlot(0),
                      AnchoredSchedule::AfterSlot(reload_at)});
  }
  const GraphIndex index(graph);
  SpliceStateOffloads(graph, index, copies, schedule);
  return schedule;
}

}  // namespace tandem
