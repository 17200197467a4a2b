// Schedules the worker can run without a coordinator, built from the
// lowering both sides share (common/lowering), so they are exactly what the
// coordinator's baseline passes produce: the ZeRO-3 baseline (gather on
// demand), everything persistent, a prefetching variant of a schedule made by
// hoisting its gathers, the ZeRO-1 plan, and a schedule's variant that offloads
// chosen optimizer states. No libtorch.
#ifndef TANDEM_WORKER_RUNTIME_STANDARD_SCHEDULES_H_
#define TANDEM_WORKER_RUNTIME_STANDARD_SCHEDULES_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/ir/graph.h"
#include "common/ir/schedule.h"

namespace tandem {

// zero3-insert with one gather group per forward node: gather and wait right
// before each use, release after the last use in each phase, reduce-scatter
// each gradient once complete.
absl::StatusOr<Schedule> OnDemandSchedule(const Graph& graph,
                                          int64_t version = 0);

// Every param persistent (gathered for the whole iteration and refreshed
// after the optimizer); only the reduce-scatters remain.
absl::StatusOr<Schedule> AllPersistentSchedule(const Graph& graph,
                                               int64_t version = 0);

// Moves each ALLGATHER up to `distance` nodes earlier (its WAIT stays), as
// far as the schedule stays semantically valid (CheckScheduleSemantics), so
// gathers overlap the preceding nodes' compute.
absl::StatusOr<Schedule> HoistGathers(const Graph& graph, Schedule schedule,
                                      int distance);

// The zero1 pass's plan: every param replicated, gradients reduce-scattered
// in buckets of about `bucket_bytes` during backward, updated params
// all-gathered after the optimizer. 0: the pass's default bucket size.
absl::StatusOr<Schedule> Zero1Schedule(const Graph& graph, int64_t version = 0,
                                       int64_t bucket_bytes = 0);

// The schedule a job starts with: Zero1Schedule for `zero_stage` 1,
// OnDemandSchedule otherwise.
absl::StatusOr<Schedule> BaselineSchedule(const Graph& graph, int zero_stage,
                                          int64_t version = 0);

// `schedule` with the optimizer states of `param_ids` offloaded, one entry per
// param (bytes as the simulator counts them): each copied out after the
// first forward node and back before the node `reload_lead` nodes before the
// optimizer (0: right before it), in the order given. Replaces any offload
// plan `schedule` had. InvalidArgument for an unknown or a frozen param (it
// has no optimizer state).
absl::StatusOr<Schedule> OffloadStates(const Graph& graph, Schedule schedule,
                                       absl::Span<const int32_t> param_ids,
                                       int reload_lead = 0);

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_STANDARD_SCHEDULES_H_
