// Lowering: the baseline schedules every job can run, built from the graph
// alone. They are the contract both sides share: the coordinator's
// zero3-insert and zero1 passes call these, and the worker starts every job
// on StartingSchedule() before the coordinator has planned anything, so the
// schedule the profile is measured under is exactly the one the planner
// calibrates against.
//
//   LowerZero3: the ZeRO-3 baseline. Builds the gather groups and, walking
//     the nodes in order, gathers and waits for a group right before its
//     first use, releases it after its last use in each phase segment (a run
//     of nodes of one phase and micro-batch), and reduce-scatters each
//     gradient right after the backward node that completes it: with
//     gradient accumulation, after the last micro-batch's (accumulated
//     unsharded, kOnce) or after each micro-batch's (into the sharded
//     accumulator, kPerMicroBatch; gradient_reduction.h). Every later
//     pass only moves, fuses or drops its actions, so the baseline is what
//     makes a plan correct; the others make it fast.
//   LowerZero1: the plan of a ZeRO-1 job, which shards only the optimizer
//     states. Every param is replicated (persistent), so forward and backward
//     gather nothing. Gradients are reduced in buckets of about bucket_bytes,
//     filled in the order backward completes them; each bucket is
//     reduce-scattered right after the backward node that completes its last
//     gradient, overlapping the rest of backward (DDP's bucketing, with
//     reduce-scatter instead of all-reduce). After the optimizer node every
//     rank all-gathers the updated params in groups of bucket size, all
//     issued before any is waited for so they run back to back.
#ifndef TANDEM_COMMON_LOWERING_LOWERING_H_
#define TANDEM_COMMON_LOWERING_LOWERING_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/ir/graph.h"
#include "common/ir/schedule.h"
#include "common/lowering/gradient_reduction.h"

namespace tandem {

enum class GatherGrouping {
  // One group per forward node's params (finest; what Tandem starts from).
  kPerNode,
  // One group per wrapping unit (Param::unit), as FSDP wraps blocks.
  kPerUnit,
};

// The ZeRO-3 baseline (above). `persistent_param_ids` stay out of the groups
// and become the schedule's persistent set. The result is for `graph`'s
// structural hash, with mode ZeRO-3, no offloads, version 0 and empty
// provenance. `reduction` applies to every gradient (kNone counts as kOnce).
Schedule LowerZero3(const Graph& graph,
                    absl::Span<const int32_t> persistent_param_ids,
                    GatherGrouping grouping = GatherGrouping::kPerNode,
                    GradientReduction reduction = GradientReduction::kOnce);

// 32 MiB: DDP's 25 MB default pays a collective's latency more often on
// large models; past ~50 MB the last bucket overlaps too little.
inline constexpr int64_t kDefaultZero1BucketBytes = int64_t{32} << 20;

// The ZeRO-1 plan (above); bucket_bytes <= 0 means the default.
Schedule LowerZero1(const Graph& graph,
                    int64_t bucket_bytes = kDefaultZero1BucketBytes);

// The schedule a job starts with, before any profile: LowerZero3 with
// nothing persistent for ZeRO-3, LowerZero1 for ZeRO-1; version 0,
// provenance "baseline". InvalidArgument for an invalid graph.
absl::StatusOr<Schedule> StartingSchedule(const Graph& graph,
                                          ShardingMode mode);

}  // namespace tandem

#endif  // TANDEM_COMMON_LOWERING_LOWERING_H_
