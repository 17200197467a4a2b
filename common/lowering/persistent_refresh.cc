#include "common/lowering/persistent_refresh.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_map.h"

namespace tandem {

std::vector<std::vector<int32_t>> PersistentRefreshChunks(
    const Graph& graph, const std::vector<int32_t>& params) {
  const int world = std::max(graph.world_size, 1);
  absl::flat_hash_map<int32_t, const Param*> by_id;
  for (const Param& p : graph.params) by_id[p.id] = &p;
  // The forward position that first uses each wanted param.
  constexpr int kUnused = std::numeric_limits<int>::max();
  absl::flat_hash_map<int32_t, int> first_use;
  for (int32_t id : params) {
    if (by_id.contains(id)) first_use[id] = kUnused;
  }
  for (size_t pos = 0; pos < graph.nodes.size(); ++pos) {
    const Node& n = graph.nodes[pos];
    if (n.phase != Phase::kForward) continue;
    for (int32_t id : n.param_ids) {
      auto it = first_use.find(id);
      if (it != first_use.end() && it->second == kUnused) {
        it->second = static_cast<int>(pos);
      }
    }
  }
  std::vector<std::pair<int, int32_t>> order;  // (first use, id)
  order.reserve(first_use.size());
  for (const auto& [id, pos] : first_use) order.emplace_back(pos, id);
  std::sort(order.begin(), order.end());

  std::vector<std::vector<int32_t>> chunks;
  int64_t bytes = 0;
  int last_pos = -1;
  for (const auto& [pos, id] : order) {
    // Cut only between nodes: a node's params arrive together.
    if (!chunks.empty() && pos != last_pos && bytes >= kRefreshChunkBytes) {
      chunks.emplace_back();
      bytes = 0;
    }
    if (chunks.empty()) chunks.emplace_back();
    const Param& p = *by_id.at(id);
    chunks.back().push_back(id);
    bytes += p.shard_numel(world) * world * DTypeBytes(p.dtype);
    last_pos = pos;
  }
  return chunks;
}

}  // namespace tandem
