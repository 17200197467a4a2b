#include "coordinator/passes/zero1_pass.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace tandem {

absl::StatusOr<bool> Zero1Pass::RunImpl(PlanningContext& context) {
  const Graph& graph = context.graph();
  const GraphIndex& index = context.index();
  Schedule& schedule = context.schedule();
  const Schedule before = schedule;

  schedule.mode = ShardingMode::kZero1;
  schedule.groups.clear();
  schedule.offloads.clear();
  schedule.actions.clear();
  schedule.persistent_param_ids.clear();
  for (const Param& p : graph.params) {
    schedule.persistent_param_ids.push_back(p.id);
  }
  if (graph.nodes.empty()) return !(schedule == before);

  // The backward node that completes each param's gradient.
  const size_t n = graph.nodes.size();
  absl::flat_hash_map<int32_t, size_t> last_grad;
  for (size_t i = 0; i < n; ++i) {
    if (graph.nodes[i].phase != Phase::kBackward) continue;
    for (int32_t p : graph.nodes[i].param_ids) last_grad[p] = i;
  }

  // Buckets in gradient-completion order, each reduced after the node that
  // completes its last gradient.
  std::vector<std::vector<int32_t>> buckets;
  std::vector<int32_t> bucket;
  int64_t bucket_bytes = 0;
  auto flush = [&](size_t node_pos) {
    schedule.actions.push_back({ActionKind::kReduceScatter,
                                graph.nodes[node_pos].id,
                                AnchorPosition::kAfter, 0, bucket, 0});
    buckets.push_back(std::move(bucket));
    bucket.clear();
    bucket_bytes = 0;
  };
  size_t last_pos = 0;
  for (size_t i = 0; i < n; ++i) {
    const Node& node = graph.nodes[i];
    if (node.phase != Phase::kBackward) continue;
    for (int32_t p : node.param_ids) {
      auto it = last_grad.find(p);
      if (it == last_grad.end() || it->second != i ||
          std::find(bucket.begin(), bucket.end(), p) != bucket.end()) {
        continue;
      }
      bucket.push_back(p);
      const int pos = index.ParamPos(p);
      if (pos >= 0) bucket_bytes += graph.params[pos].bytes();
      last_pos = i;
    }
    if (bucket_bytes >= bucket_bytes_) flush(i);
  }
  if (!bucket.empty()) flush(last_pos);

  // After the (last) optimizer node: gather the updated params.
  size_t optimizer = n - 1;
  for (size_t i = 0; i < n; ++i) {
    if (graph.nodes[i].phase == Phase::kOptimizer) optimizer = i;
  }
  const int32_t anchor = graph.nodes[optimizer].id;
  for (size_t b = 0; b < buckets.size(); ++b) {
    schedule.groups.push_back({static_cast<int32_t>(b), buckets[b]});
  }
  for (const GatherGroup& g : schedule.groups) {
    schedule.actions.push_back(
        {ActionKind::kAllGather, anchor, AnchorPosition::kAfter, g.id, {}, 0});
  }
  for (const GatherGroup& g : schedule.groups) {
    schedule.actions.push_back(
        {ActionKind::kWait, anchor, AnchorPosition::kAfter, g.id, {}, 0});
  }
  return !(schedule == before);
}

}  // namespace tandem
