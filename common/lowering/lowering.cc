#include "common/lowering/lowering.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/ir/validate.h"
#include "common/lowering/gradient_reduction.h"
#include "common/status_macros.h"

namespace tandem {

Schedule LowerZero3(const Graph& graph,
                    absl::Span<const int32_t> persistent_param_ids,
                    GatherGrouping grouping, GradientReduction reduction) {
  const GraphIndex index(graph);
  const absl::flat_hash_set<int32_t> persistent(persistent_param_ids.begin(),
                                                persistent_param_ids.end());
  Schedule schedule;
  schedule.graph_hash = graph.StructuralHash();
  schedule.mode = ShardingMode::kZero3;
  schedule.persistent_param_ids.assign(persistent_param_ids.begin(),
                                       persistent_param_ids.end());

  // Groups, in first-use order.
  absl::flat_hash_map<int32_t, int32_t> group_of;  // param -> group id
  absl::flat_hash_map<std::string, int32_t> group_of_unit;
  for (const Node& node : graph.nodes) {
    if (node.phase != Phase::kForward) continue;
    int32_t node_group = -1;
    for (int32_t p : node.param_ids) {
      if (persistent.contains(p) || group_of.contains(p)) continue;
      int32_t g;
      if (grouping == GatherGrouping::kPerUnit) {
        const Param& param = graph.params[index.ParamPos(p)];
        auto [it, inserted] = group_of_unit.emplace(
            param.unit, static_cast<int32_t>(schedule.groups.size()));
        if (inserted) schedule.groups.push_back({it->second, {}});
        g = it->second;
      } else {
        if (node_group < 0) {
          node_group = static_cast<int32_t>(schedule.groups.size());
          schedule.groups.push_back({node_group, {}});
        }
        g = node_group;
      }
      schedule.groups[g].param_ids.push_back(p);
      group_of[p] = g;
    }
  }
  // Params only backward nodes use (none in well-formed graphs, but a graph
  // from outside may have them) get a group of their own.
  for (const Node& node : graph.nodes) {
    for (int32_t p : node.param_ids) {
      if (persistent.contains(p) || group_of.contains(p)) continue;
      const int32_t g = static_cast<int32_t>(schedule.groups.size());
      schedule.groups.push_back({g, {p}});
      group_of[p] = g;
    }
  }

  // The groups each node needs, deduplicated in param order.
  const size_t n = graph.nodes.size();
  std::vector<std::vector<int32_t>> needs(n);
  for (size_t i = 0; i < n; ++i) {
    for (int32_t p : graph.nodes[i].param_ids) {
      auto it = group_of.find(p);
      if (it == group_of.end()) continue;
      std::vector<int32_t>& v = needs[i];
      if (std::find(v.begin(), v.end(), it->second) == v.end()) {
        v.push_back(it->second);
      }
    }
  }
  auto same_segment = [&](size_t a, size_t b) {
    return graph.nodes[a].phase == graph.nodes[b].phase &&
           graph.nodes[a].micro_batch == graph.nodes[b].micro_batch;
  };
  // last_use[i] lists the groups whose last use in i's segment is node i.
  std::vector<std::vector<int32_t>> last_use(n);
  {
    absl::flat_hash_set<int32_t> seen;
    for (size_t k = n; k-- > 0;) {
      if (k + 1 < n && !same_segment(k, k + 1)) seen.clear();
      for (int32_t g : needs[k]) {
        if (seen.insert(g).second) last_use[k].push_back(g);
      }
    }
  }
  // The backward nodes after which each param's gradient is reduced: the
  // last producing it, or with per-micro-batch reduction the last of each
  // micro-batch (gradient_reduction.h).
  absl::flat_hash_set<std::pair<int32_t, size_t>> reduce_after;
  {
    const std::vector<std::vector<GradientProduction>> productions =
        GradientProductions(graph);
    for (size_t p = 0; p < graph.params.size(); ++p) {
      const std::vector<GradientProduction>& runs = productions[p];
      if (runs.empty()) continue;
      if (reduction == GradientReduction::kPerMicroBatch) {
        for (const GradientProduction& run : runs) {
          reduce_after.insert({graph.params[p].id, run.last_pos});
        }
      } else {
        reduce_after.insert({graph.params[p].id, runs.back().last_pos});
      }
    }
  }

  std::vector<bool> gathered(schedule.groups.size(), false);
  for (size_t i = 0; i < n; ++i) {
    const Node& node = graph.nodes[i];
    for (int32_t g : needs[i]) {
      if (gathered[g]) continue;
      schedule.actions.push_back(
          {ActionKind::kAllGather, node.id, AnchorPosition::kBefore, g, {}, 0});
      schedule.actions.push_back(
          {ActionKind::kWait, node.id, AnchorPosition::kBefore, g, {}, 0});
      gathered[g] = true;
    }
    for (int32_t g : last_use[i]) {
      schedule.actions.push_back(
          {ActionKind::kRelease, node.id, AnchorPosition::kAfter, g, {}, 0});
      gathered[g] = false;
    }
    if (node.phase == Phase::kBackward) {
      std::vector<int32_t> done;
      for (int32_t p : node.param_ids) {
        if (reduce_after.contains({p, i}) &&
            std::find(done.begin(), done.end(), p) == done.end()) {
          done.push_back(p);
        }
      }
      if (!done.empty()) {
        schedule.actions.push_back({ActionKind::kReduceScatter, node.id,
                                    AnchorPosition::kAfter, 0, done, 0});
      }
    }
  }
  return schedule;
}

Schedule LowerZero1(const Graph& graph, int64_t bucket_bytes) {
  const GraphIndex index(graph);
  if (bucket_bytes <= 0) bucket_bytes = kDefaultZero1BucketBytes;
  Schedule schedule;
  schedule.graph_hash = graph.StructuralHash();
  schedule.mode = ShardingMode::kZero1;
  for (const Param& p : graph.params) {
    schedule.persistent_param_ids.push_back(p.id);
  }
  if (graph.nodes.empty()) return schedule;

  // The backward node that completes each param's gradient.
  const size_t n = graph.nodes.size();
  // Frozen params have none: they are neither reduced nor gathered after the
  // optimizer (it does not update them).
  absl::flat_hash_map<int32_t, size_t> last_grad;
  for (size_t i = 0; i < n; ++i) {
    if (graph.nodes[i].phase != Phase::kBackward) continue;
    for (int32_t p : graph.nodes[i].param_ids) {
      const int pos = index.ParamPos(p);
      if (pos >= 0 && !graph.params[pos].trainable) continue;
      last_grad[p] = i;
    }
  }

  // Buckets in gradient-completion order, each reduced after the node that
  // completes its last gradient.
  std::vector<std::vector<int32_t>> buckets;
  std::vector<int32_t> bucket;
  int64_t filled = 0;
  auto flush = [&](size_t node_pos) {
    schedule.actions.push_back({ActionKind::kReduceScatter,
                                graph.nodes[node_pos].id,
                                AnchorPosition::kAfter, 0, bucket, 0});
    buckets.push_back(std::move(bucket));
    bucket.clear();
    filled = 0;
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
      if (pos >= 0) filled += graph.params[pos].bytes();
      last_pos = i;
    }
    if (filled >= bucket_bytes) flush(i);
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
  return schedule;
}

absl::StatusOr<Schedule> StartingSchedule(const Graph& graph,
                                          ShardingMode mode) {
  RETURN_IF_ERROR(ValidateGraph(graph));
  const bool zero1 = mode == ShardingMode::kZero1;
  Schedule schedule = zero1 ? LowerZero1(graph) : LowerZero3(graph, {});
  schedule.provenance.passes = {zero1 ? "zero1" : "zero3-insert"};
  schedule.provenance.reason = "baseline";
  return schedule;
}

}  // namespace tandem
