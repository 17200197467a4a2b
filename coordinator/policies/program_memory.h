// What the reference policies share: phase segments, the persistent-set edit,
// and the program-order memory estimate the real frameworks decide by (they
// move actions with common/lowering/anchored_schedule.h).
//
// DeepSpeed, FSDP and DeepCompile never see a simulator. They decide from a
// memory profile measured under the previous schedule, node by node, and
// from counters of what they have gathered. EstimateProgramMemory() stands in
// for that profile: it walks the schedule in program order, with no clock,
// so a collective's or a copy's memory changes at the anchor it is issued
// from. The simulator, which times every stream, judges the result.
#ifndef TANDEM_COORDINATOR_POLICIES_PROGRAM_MEMORY_H_
#define TANDEM_COORDINATOR_POLICIES_PROGRAM_MEMORY_H_

#include <cstdint>
#include <vector>

#include "common/ir/graph.h"
#include "common/ir/schedule.h"
#include "common/lowering/anchored_schedule.h"
#include "coordinator/analysis/group_sizes.h"

namespace tandem {

// A maximal run of nodes of one phase and micro-batch: what the frameworks
// trace as one forward or one backward graph.
struct PhaseSegment {
  int first = 0;  // node positions, inclusive
  int last = 0;
  Phase phase = Phase::kForward;
  int32_t micro_batch = 0;
};
std::vector<PhaseSegment> PhaseSegments(const Graph& graph);

// Adds `param_ids` to the persistent set (kept sorted, without duplicates)
// and takes them out of their gather groups; a group left empty is dropped
// with its ALLGATHER, WAIT and RELEASE actions. Returns true when anything
// changed.
bool MakePersistent(const std::vector<int32_t>& param_ids, Schedule& schedule);

struct ProgramMemory {
  // Bytes in use while each node runs (by node position): sharded and
  // persistent params, gathered groups, live activations, the node's
  // workspace (and a forward node's own activations, counted at its end
  // before the workspace is freed, as the simulator does), gradient shards
  // and full gradients not yet reduced, and optimizer states on the device.
  std::vector<int64_t> during;
  // The optimizer-state part of `during`.
  std::vector<int64_t> states;
};

// Memory in program order: an ALLGATHER allocates its group at its anchor, a
// RELEASE frees it, a REDUCE_SCATTER frees its full gradients, an OFFLOAD
// frees its states and a RELOAD brings them back, all at their anchors.
ProgramMemory EstimateProgramMemory(const Graph& graph,
                                    const Schedule& schedule);

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_POLICIES_PROGRAM_MEMORY_H_
