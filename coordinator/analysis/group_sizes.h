// Sizes of a gather group, as passes and policies price it. Params the graph
// does not know are skipped (schedules are validated before planning).
#ifndef TANDEM_COORDINATOR_ANALYSIS_GROUP_SIZES_H_
#define TANDEM_COORDINATOR_ANALYSIS_GROUP_SIZES_H_

#include <cstdint>

#include "common/ir/graph.h"
#include "common/ir/schedule.h"

namespace tandem {

// Full (gathered) bytes of the group's params.
int64_t GroupBytes(const Graph& graph, const GraphIndex& index,
                   const GatherGroup& group);
// Elements of the group's params.
int64_t GroupNumel(const Graph& graph, const GraphIndex& index,
                   const GatherGroup& group);
// Bytes one collective of the group moves: padded shards times the world
// size, as the simulator prices it.
int64_t GroupPaddedBytes(const Graph& graph, const GraphIndex& index,
                         const GatherGroup& group);

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_ANALYSIS_GROUP_SIZES_H_
