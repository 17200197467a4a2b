#include "coordinator/policies/deepspeed_prefetch_pass.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "coordinator/policies/program_memory.h"

namespace tandem {
namespace {

// One ALLGATHER of the incoming plan: a fetch in DeepSpeed's trace.
struct Fetch {
  int slot = 0;
  int32_t group = 0;  // position in Schedule::groups
  // Gathered earlier by a prefetch.
  bool prefetched = false;
  // Still gathered from an earlier fetch: no gather, no wait.
  bool kept = false;
};

// Whether two nodes belong to one DeepSpeed step (a micro-batch's forward
// and backward).
bool SameStep(const Node& a, const Node& b) {
  return a.micro_batch == b.micro_batch && a.phase != Phase::kOptimizer &&
         b.phase != Phase::kOptimizer;
}

}  // namespace

absl::StatusOr<bool> DeepSpeedPrefetchPass::RunImpl(PlanningContext& context) {
  const Graph& graph = context.graph();
  const GraphIndex& index = context.index();
  Schedule& schedule = context.schedule();
  if (schedule.mode != ShardingMode::kZero3 || schedule.groups.empty()) {
    return false;
  }
  const size_t num_groups = schedule.groups.size();
  absl::flat_hash_map<int32_t, int32_t> group_pos;
  absl::flat_hash_map<int32_t, int32_t> group_of_param;
  std::vector<int64_t> numel(num_groups);
  for (size_t g = 0; g < num_groups; ++g) {
    group_pos[schedule.groups[g].id] = static_cast<int32_t>(g);
    for (int32_t p : schedule.groups[g].param_ids) {
      group_of_param[p] = static_cast<int32_t>(g);
    }
    numel[g] = GroupNumel(graph, index, schedule.groups[g]);
  }
  std::vector<int64_t> node_numel(graph.nodes.size(), 0);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    for (int32_t p : graph.nodes[i].param_ids) {
      const int pos = index.ParamPos(p);
      if (pos >= 0) node_numel[i] += graph.params[pos].numel();
    }
  }

  const AnchoredSchedule in(graph, index, schedule);
  // The trace, and each group's fetches not yet reached in the walk.
  std::vector<Fetch> trace;
  std::vector<std::deque<int>> unreached(num_groups);
  for (int s = 0; s < in.num_slots(); ++s) {
    for (const Action& a : in.slot(s)) {
      if (a.kind != ActionKind::kAllGather) continue;
      auto it = group_pos.find(a.group_id);
      if (it == group_pos.end()) continue;
      unreached[it->second].push_back(static_cast<int>(trace.size()));
      trace.push_back({s, it->second});
    }
  }

  // Whether group g, released after node `pos`, is used again within the
  // reuse window: the params of the nodes that follow in this step.
  auto reused_soon = [&](int32_t g, int pos) {
    int64_t traversed = 0;
    for (size_t j = pos + 1; j < graph.nodes.size(); ++j) {
      if (traversed >= max_reuse_numel_) break;
      if (!SameStep(graph.nodes[pos], graph.nodes[j])) break;
      for (int32_t p : graph.nodes[j].param_ids) {
        auto it = group_of_param.find(p);
        if (it != group_of_param.end() && it->second == g) return true;
      }
      traversed += node_numel[j];
    }
    return false;
  };

  AnchoredSchedule out = in;
  std::vector<bool> live(num_groups, false);
  std::vector<int> last_reached(num_groups, -1);
  int64_t live_numel = 0;
  size_t next = 0;  // head of the trace queue
  bool changed = false;

  for (int s = 0; s < in.num_slots(); ++s) {
    const int pos = s / 2;
    std::vector<Action>& actions = out.slot(s);
    actions.clear();
    for (const Action& a : in.slot(s)) {
      auto it = group_pos.find(a.group_id);
      const bool group_action = a.kind == ActionKind::kAllGather ||
                                a.kind == ActionKind::kWait ||
                                a.kind == ActionKind::kRelease;
      if (!group_action || it == group_pos.end()) {
        actions.push_back(a);
        continue;
      }
      const int32_t g = it->second;
      switch (a.kind) {
        case ActionKind::kAllGather: {
          const int fetch = unreached[g].front();
          unreached[g].pop_front();
          last_reached[g] = fetch;
          if (trace[fetch].prefetched || trace[fetch].kept) {
            changed = true;
            continue;
          }
          if (!live[g]) live_numel += numel[g];
          live[g] = true;
          break;
        }
        case ActionKind::kWait:
          if (last_reached[g] >= 0 && trace[last_reached[g]].kept) {
            changed = true;
            continue;
          }
          break;
        case ActionKind::kRelease: {
          const int following =
              unreached[g].empty() ? -1 : unreached[g].front();
          if (following >= 0 &&
              (trace[following].kept || reused_soon(g, pos))) {
            trace[following].kept = true;
            changed = true;
            continue;
          }
          if (live[g]) live_numel -= numel[g];
          live[g] = false;
          break;
        }
        default:
          break;
      }
      actions.push_back(a);
    }

    // A module fetch happens before each forward and backward node.
    const Node& node = graph.nodes[pos];
    if (s % 2 != 0 || node.phase == Phase::kOptimizer) continue;
    // The module's own fetches leave the queue.
    while (next < trace.size() && trace[next].slot <= s) ++next;
    const int64_t limit = std::min(max_live_numel_ - live_numel, bucket_numel_);
    int64_t prefetching = 0;
    while (next < trace.size() && prefetching < limit) {
      const int f = static_cast<int>(next);
      Fetch& fetch = trace[f];
      if (!SameStep(node, graph.nodes[fetch.slot / 2])) break;
      ++next;
      const int32_t g = fetch.group;
      if (fetch.prefetched || fetch.kept) continue;
      if (live[g]) {
        // Popped while gathered: keep the param until this use.
        fetch.kept = true;
        continue;
      }
      if (unreached[g].front() != f) continue;
      fetch.prefetched = true;
      live[g] = true;
      live_numel += numel[g];
      prefetching += numel[g];
      Action gather;
      gather.kind = ActionKind::kAllGather;
      gather.group_id = schedule.groups[g].id;
      actions.push_back(gather);
      changed = true;
    }
  }
  if (!changed) return false;
  out.WriteTo(schedule);
  return true;
}

}  // namespace tandem
