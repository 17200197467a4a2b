// Replays a schedule against a graph's node times and a hardware model, on
// three streams, and reports time and memory (common/README.md, "Simulator").
//
// Streams and timing rules, walking the nodes in order:
//   - compute runs the nodes back to back; a node starts when compute is free
//     and every WAIT before it is satisfied. A transfer takes a share of
//     compute while both run: a collective or copy of B bytes taking d
//     seconds alone takes min(c·B/(k·d), 0.95), c the hardware model's
//     compute_s_per_{allgather,reduce_scatter,copy}_byte and k its
//     {allgather,reduce_scatter,copy}_stretch (the shares of the running
//     collective and copy add, capped at 0.95), so a node's work (its time)
//     stretches by what they take while it runs (0 on a GPU);
//   - a transfer moves at 1/k of its alone rate while a node runs and at its
//     alone rate while compute waits or is done (k = 1 on a GPU): its end
//     depends on compute and compute's on it, and both streams are run
//     together with compute from one rate change to the next (a transfer's
//     start or end, a node's end, a WAIT), which is exact for these rules.
//     Actions at one anchor run in list order at the compute stream's current
//     time, so a WAIT delays the actions listed after it;
//   - communication runs collectives one at a time in issue order: ALLGATHER
//     and REDUCE_SCATTER are issued at the compute stream's current time and
//     start when the communication stream is free. A collective moves the
//     padded buffer (shard_numel·world·dtype per param) and takes
//     hw.AllGatherSeconds / ReduceScatterSeconds alone (0 at world size 1);
//   - copy runs OFFLOAD and RELOAD one at a time in issue order, at
//     host_bytes_per_s alone;
//   - WAIT(g) holds compute until g's latest gather is done; the wait is
//     exposed communication, attributed to g. A WAIT with no ALLGATHER of g
//     since g's last RELEASE (or ever) fails;
//   - the optimizer nodes implicitly wait (after their own "before" actions)
//     for every REDUCE_SCATTER and every RELOAD issued before them (they need
//     the gradient shards and states); the part spent on REDUCE_SCATTERs is
//     exposed communication;
//   - in ZeRO-3 mode, persistent params are re-gathered after the optimizer
//     (their shards were just updated): one fused all-gather of all of them
//     but the frozen ones (never updated), issued when compute ends
//     (CollectiveTimelineEntry::action_index -1);
//   - the iteration ends when all three streams are idle; communication
//     still running after the last node is exposed too.
//
// Memory per rank (bytes), as a timeline of allocations and frees:
//   - sharded params: Σ shard_numel·dtype, always (shards use
//     graph.world_size; collective times use hw.world_size). ZeRO-1
//     (Schedule::mode): params are replicated, so this is Σ full bytes and
//     neither persistent nor gathered params add anything; its ALLGATHERs
//     (after the optimizer) still cost communication time;
//   - persistent params: their full bytes, always, besides their shard;
//   - gathered params: a group's full (unpadded) bytes from its ALLGATHER's
//     issue until its RELEASE. A group gathered again before its RELEASE is
//     allocated again (that schedule really holds two buffers) and one
//     RELEASE frees all of them; a RELEASE of an ungathered group frees
//     nothing;
//   - activations: a forward node's activation_bytes from its end until its
//     backward twin ends (the whole iteration when it has none);
//     workspace_bytes while a node runs;
//   - what a profile measured beyond these (Node::measured_extra_bytes and
//     measured_carry_bytes, from CalibrateMemory): the extra while the node
//     runs, and the running sum of the carries, when positive, from a
//     node's end on (e.g. the gradient a backward node hands to the next,
//     or a forward node's outputs beyond its saved activations);
//   - gradients (param dtype): a gradient shard per param (shard_numel·dtype;
//     fp32, shard_numel·4, for a param reduced per micro-batch, i.e. named
//     by more than one REDUCE_SCATTER: its sharded accumulator) always, and
//     a full-size gradient (full bytes) from the start of the
//     first backward node that produces it since its last REDUCE_SCATTER was
//     issued, until that REDUCE_SCATTER is done (with hw.collective_buffers:
//     until it starts, when the worker copies it into the collective's
//     buffer and frees it). With gradient accumulation it therefore lives
//     across micro-batches until reduced (reduced once), or within one
//     micro-batch (reduced per micro-batch); one never
//     reduced lives to the end of the iteration. A REDUCE_SCATTER of a param
//     with no live full gradient frees nothing (it still costs time). A
//     frozen param (Param::trainable false) has neither gradient;
//   - optimizer states: per param shard, fp32 Adam moments (8 bytes/elem)
//     plus fp32 master weights when the param dtype is not f32 (4 more;
//     none for a frozen param), except while an offload entry holding them is
//     on the host: from its OFFLOAD's end until its RELOAD's start. An entry
//     moves min(OffloadEntry::bytes, its params' states) each way (entries are
//     assumed disjoint); an OFFLOAD of an entry already on the host or a
//     RELOAD of one on the device costs copy time and moves no memory;
//   - collective buffers, with hw.collective_buffers (the Tandem worker's
//     runtime): a collective runs on one flat buffer, its padded
//     full bytes plus this rank's shard of them, and the scratch the
//     communicator holds beyond them (hw.allgather_scratch,
//     reduce_scatter_scratch), from its start to its end (for a
//     REDUCE_SCATTER starting at the instant its gradients are freed, both
//     count: the copy holds both for a moment);
//   - unmodeled: hw.unmodeled_bytes, always (what the runtime was measured to
//     hold beyond the rules above: autograd temporaries, the loss's buffers;
//     see CalibrateMemory in coordinator/planner).
// At one instant the compute stream's own events (a node's start and end,
// the actions anchored around it) count in program order, so "release g0,
// then gather g1" never holds both; events of the other streams at that
// instant (a REDUCE_SCATTER or OFFLOAD finishing, a delayed RELOAD starting)
// count allocations before and frees after them, so the peak is never
// underestimated. A forward node's activations appear before its workspace
// is freed.
#ifndef TANDEM_COMMON_SIM_SIMULATOR_H_
#define TANDEM_COMMON_SIM_SIMULATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/ir/graph.h"
#include "common/ir/schedule.h"
#include "common/sim/hardware_model.h"

namespace tandem {

struct NodeTimelineEntry {
  int32_t node_id = 0;
  double start_s = 0;
  double end_s = 0;
  // Time compute waited for communication, copies or gradients before it.
  double stall_s = 0;
  // Memory in use at end_s after the node and the actions anchored after it
  // (in program order; see the memory rules above).
  int64_t memory_after_bytes = 0;
  // What the model (without the measured extra and carry) puts on top of
  // the memory at the node's start while it runs (its workspace, the
  // gradients it allocates, a forward node's activations), and by how much
  // the node leaves the memory higher at its end (its activations or new
  // gradients, less the activations its backward frees): CalibrateMemory
  // compares these with the profile's rise and net.
  int64_t modeled_rise_bytes = 0;
  int64_t modeled_net_bytes = 0;
};

struct CollectiveTimelineEntry {
  // Index into Schedule::actions.
  int action_index = 0;
  ActionKind kind = ActionKind::kAllGather;
  double issue_s = 0;
  double start_s = 0;
  double end_s = 0;
  int64_t bytes = 0;
};

// Peak memory split by kind, at the moment of the peak; total() is the peak.
// Node workspace counts as activations.
struct MemoryBreakdown {
  int64_t sharded_params = 0;
  int64_t persistent_params = 0;
  int64_t gathered_params = 0;
  int64_t activations = 0;
  int64_t gradients = 0;
  int64_t optimizer_states = 0;
  // Flat buffers of the collectives running.
  int64_t collective_buffers = 0;
  // HardwareModel::unmodeled_bytes: what the runtime was measured to hold
  // beyond this model.
  int64_t unmodeled = 0;
  int64_t total() const {
    return sharded_params + persistent_params + gathered_params + activations +
           gradients + optimizer_states + collective_buffers + unmodeled;
  }
};

struct SimResult {
  double iteration_s = 0;
  double compute_s = 0;
  // The collectives' and copies' times alone (what compute stretched them
  // by is in their timeline entries, not here).
  double comm_s = 0;
  double copy_s = 0;
  // Compute time lost to transfers running alongside (the hardware model's
  // compute_s_per_*_byte): the nodes' timeline durations less their times.
  double interference_s = 0;
  // Σ group_exposed_s + the optimizer's waits on REDUCE_SCATTERs + the
  // communication tail after the last node.
  double exposed_comm_s = 0;
  // 1 - exposed/comm (1 when there is no communication).
  double overlap_ratio = 1;
  // max(compute_s, comm_s, copy_s): no schedule of these actions is faster.
  double lower_bound_s = 0;
  int64_t peak_bytes = 0;
  // Node running when the peak was reached: the last one started before it
  // in program order (so a peak at a node's end, before the next one starts,
  // names that node); the first node when the peak precedes every start.
  int32_t peak_node_id = 0;
  MemoryBreakdown peak_breakdown;
  // Bytes held on the host tier at most (summed in copy-issue order).
  int64_t offloaded_bytes = 0;
  std::vector<NodeTimelineEntry> nodes;
  // ALLGATHER and REDUCE_SCATTER actions, in issue order.
  std::vector<CollectiveTimelineEntry> collectives;
  // OFFLOAD and RELOAD actions on the copy stream, in issue order.
  std::vector<CollectiveTimelineEntry> copies;
  // Exposed wait attributed to each gather group, indexed like
  // Schedule::groups.
  std::vector<double> group_exposed_s;
};

// Fails (InvalidArgument) only on schedules that cannot be replayed at all:
// a WAIT without a preceding ALLGATHER of its group (the message names the
// action index, node and group), or ids the schedule or graph does not
// define (groups, offload entries, nodes, params, backward twins). Semantic
// violations (use after release and the like) are the invariant checkers'
// business; the simulator times what it is given.
absl::StatusOr<SimResult> Simulate(const Graph& graph, const Schedule& schedule,
                                   const HardwareModel& hw);

}  // namespace tandem

#endif  // TANDEM_COMMON_SIM_SIMULATOR_H_
