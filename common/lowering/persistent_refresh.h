// The persistent refresh in chunks. After each optimizer step the updated
// shards of the persistent params are all-gathered again; issued as one
// collective, the next step's first node waits for all of it. Cut into
// chunks in the order the next step's forward first uses the params, its
// first node waits for the first chunk only and the rest arrives while
// forward computes. The worker issues these chunks (in this order, on every
// rank alike) and the simulator times them, so both cut them here.
#ifndef TANDEM_COMMON_LOWERING_PERSISTENT_REFRESH_H_
#define TANDEM_COMMON_LOWERING_PERSISTENT_REFRESH_H_

#include <cstdint>
#include <vector>

#include "common/ir/graph.h"

namespace tandem {

// A chunk is at least this many bytes (the padded full tensors it gathers),
// unless it is the last: smaller ones cost a collective's latency each.
inline constexpr int64_t kRefreshChunkBytes = int64_t{1} << 20;

// `params` (ids of `graph`'s params; the ones to refresh) in chunks: ordered
// by the first forward node that uses each (params no forward node uses go
// last, in id order), cut at node boundaries once a chunk holds at least
// kRefreshChunkBytes of padded full bytes at graph.world_size. Every id of
// `params` is in exactly one chunk; ids the graph does not have are dropped.
std::vector<std::vector<int32_t>> PersistentRefreshChunks(
    const Graph& graph, const std::vector<int32_t>& params);

}  // namespace tandem

#endif  // TANDEM_COMMON_LOWERING_PERSISTENT_REFRESH_H_
