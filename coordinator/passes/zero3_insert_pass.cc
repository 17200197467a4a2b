#include "coordinator/passes/zero3_insert_pass.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace tandem {

absl::StatusOr<bool> Zero3InsertPass::RunImpl(PlanningContext& context) {
  const Graph& graph = context.graph();
  Schedule& schedule = context.schedule();
  const Schedule before = schedule;
  const absl::flat_hash_set<int32_t> persistent(
      schedule.persistent_param_ids.begin(),
      schedule.persistent_param_ids.end());

  schedule.mode = ShardingMode::kZero3;
  schedule.groups.clear();
  schedule.actions.clear();
  schedule.offloads.clear();

  // Groups, in first-use order.
  absl::flat_hash_map<int32_t, int32_t> group_of;  // param -> group id
  absl::flat_hash_map<std::string, int32_t> group_of_unit;
  for (const Node& node : graph.nodes) {
    if (node.phase != Phase::kForward) continue;
    int32_t node_group = -1;
    for (int32_t p : node.param_ids) {
      if (persistent.contains(p) || group_of.contains(p)) continue;
      int32_t g;
      if (grouping_ == Grouping::kPerUnit) {
        const Param& param = graph.params[context.index().ParamPos(p)];
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
  // The backward node that completes each param's gradient.
  absl::flat_hash_map<int32_t, size_t> last_grad;
  for (size_t i = 0; i < n; ++i) {
    if (graph.nodes[i].phase != Phase::kBackward) continue;
    for (int32_t p : graph.nodes[i].param_ids) last_grad[p] = i;
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
        auto it = last_grad.find(p);
        if (it != last_grad.end() && it->second == i &&
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
  return !(schedule == before);
}

}  // namespace tandem
