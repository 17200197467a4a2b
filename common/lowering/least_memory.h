// The least-memory schedule of a job: its starting schedule (StartingSchedule)
// with every optimizer state offloaded before the first node and reloaded
// after the last backward node, and (ZeRO-3 with gradient accumulation, at
// world > 1) every gradient reduced per micro-batch. It is the smallest peak
// any plan reaches (the planner's feasibility bound and the budget a job is
// refused below), and the fallback every worker holds from its first step: a
// rank whose peak comes within the guard band of memory.budget_bytes switches
// to it at an iteration boundary all ranks agree on (worker/README.md, "Memory
// guard"). Both sides build it from the graph alone, so they hold the same
// schedule.
#ifndef TANDEM_COMMON_LOWERING_LEAST_MEMORY_H_
#define TANDEM_COMMON_LOWERING_LEAST_MEMORY_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/ir/graph.h"
#include "common/ir/schedule.h"

namespace tandem {

// The version the least-memory fallback runs under on a worker: not a
// published plan, so outside the coordinator's versions (1, 2, ...) and the
// baseline's 0. Progress and profiles measured under it carry it.
inline constexpr int64_t kLeastMemoryVersion = -1;

// The worker's guard band, as a fraction of memory.budget_bytes: a step's
// peak within it of the budget trips the guard. Plans leave at least this
// much of the budget free, so a plan that peaks where it was predicted never
// trips the guard.
inline constexpr double kMemoryGuardBand = 0.02;

// The least-memory schedule (above) for `graph` in `mode`, with version
// kLeastMemoryVersion and provenance passes {zero3-insert|zero1,
// offload-all-states}. InvalidArgument for an invalid graph.
absl::StatusOr<Schedule> LeastMemorySchedule(const Graph& graph,
                                             ShardingMode mode);

}  // namespace tandem

#endif  // TANDEM_COMMON_LOWERING_LEAST_MEMORY_H_
