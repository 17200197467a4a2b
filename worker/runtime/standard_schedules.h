// Schedules the worker can run without a coordinator, built with the
// planner's own passes so they are exactly what the coordinator would
// publish: the ZeRO-3 baseline (gather on demand), everything persistent,
// and a prefetching variant of a schedule made by hoisting its gathers.
// No libtorch.
#ifndef TANDEM_WORKER_RUNTIME_STANDARD_SCHEDULES_H_
#define TANDEM_WORKER_RUNTIME_STANDARD_SCHEDULES_H_

#include <cstdint>

#include "absl/status/statusor.h"
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

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_STANDARD_SCHEDULES_H_
