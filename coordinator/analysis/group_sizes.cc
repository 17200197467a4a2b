#include "coordinator/analysis/group_sizes.h"

#include <algorithm>

namespace tandem {
namespace {

template <typename Fn>
int64_t SumOverParams(const Graph& graph, const GraphIndex& index,
                      const GatherGroup& group, Fn&& size) {
  int64_t total = 0;
  for (int32_t p : group.param_ids) {
    const int pos = index.ParamPos(p);
    if (pos >= 0) total += size(graph.params[pos]);
  }
  return total;
}

}  // namespace

int64_t GroupBytes(const Graph& graph, const GraphIndex& index,
                   const GatherGroup& group) {
  return SumOverParams(graph, index, group,
                       [](const Param& p) { return p.bytes(); });
}

int64_t GroupNumel(const Graph& graph, const GraphIndex& index,
                   const GatherGroup& group) {
  return SumOverParams(graph, index, group,
                       [](const Param& p) { return p.numel(); });
}

int64_t GroupPaddedBytes(const Graph& graph, const GraphIndex& index,
                         const GatherGroup& group) {
  const int world = std::max(graph.world_size, 1);
  return SumOverParams(graph, index, group, [world](const Param& p) {
    return p.shard_numel(world) * world * DTypeBytes(p.dtype);
  });
}

}  // namespace tandem
