#include "coordinator/policies/program_memory.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/sim/simulator.h"

namespace tandem {

std::vector<PhaseSegment> PhaseSegments(const Graph& graph) {
  std::vector<PhaseSegment> segments;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (!segments.empty() && segments.back().phase == node.phase &&
        segments.back().micro_batch == node.micro_batch) {
      segments.back().last = static_cast<int>(i);
      continue;
    }
    segments.push_back({static_cast<int>(i), static_cast<int>(i), node.phase,
                        node.micro_batch});
  }
  return segments;
}

bool MakePersistent(const std::vector<int32_t>& param_ids, Schedule& schedule) {
  absl::flat_hash_set<int32_t> added;
  std::vector<int32_t>& persistent = schedule.persistent_param_ids;
  const absl::flat_hash_set<int32_t> already(persistent.begin(),
                                             persistent.end());
  for (int32_t p : param_ids) {
    if (!already.contains(p) && added.insert(p).second) persistent.push_back(p);
  }
  std::sort(persistent.begin(), persistent.end());
  persistent.erase(std::unique(persistent.begin(), persistent.end()),
                   persistent.end());
  bool changed = !added.empty();

  const absl::flat_hash_set<int32_t> all(persistent.begin(), persistent.end());
  absl::flat_hash_set<int32_t> dropped_groups;
  std::vector<GatherGroup> kept;
  kept.reserve(schedule.groups.size());
  for (GatherGroup& g : schedule.groups) {
    const size_t size = g.param_ids.size();
    g.param_ids.erase(
        std::remove_if(g.param_ids.begin(), g.param_ids.end(),
                       [&](int32_t p) { return all.contains(p); }),
        g.param_ids.end());
    changed = changed || g.param_ids.size() != size;
    if (g.param_ids.empty()) {
      dropped_groups.insert(g.id);
    } else {
      kept.push_back(std::move(g));
    }
  }
  schedule.groups = std::move(kept);
  if (!dropped_groups.empty()) {
    schedule.actions.erase(
        std::remove_if(schedule.actions.begin(), schedule.actions.end(),
                       [&](const Action& a) {
                         return (a.kind == ActionKind::kAllGather ||
                                 a.kind == ActionKind::kWait ||
                                 a.kind == ActionKind::kRelease) &&
                                dropped_groups.contains(a.group_id);
                       }),
        schedule.actions.end());
  }
  return changed;
}

ProgramMemory EstimateProgramMemory(const Graph& graph,
                                    const Schedule& schedule) {
  const GraphIndex index(graph);
  const int world = std::max(graph.world_size, 1);
  const bool zero1 = schedule.mode == ShardingMode::kZero1;
  const size_t n = graph.nodes.size();

  int64_t level = 0;
  int64_t states = 0;
  std::vector<bool> persistent(graph.params.size(), false);
  for (int32_t id : schedule.persistent_param_ids) {
    const int pos = index.ParamPos(id);
    if (pos >= 0 && !persistent[pos] && !zero1) {
      persistent[pos] = true;
      level += graph.params[pos].bytes();
    }
  }
  for (const Param& p : graph.params) {
    const int64_t shard = p.shard_numel(world) * DTypeBytes(p.dtype);
    // The gradient shard: none for a frozen param (nor states).
    level += (zero1 ? p.bytes() : shard) +
             (p.trainable ? graph.GradShardBytes(p) : 0);
    states += ParamStateBytes(p, world);
  }
  level += states;

  absl::flat_hash_map<int32_t, int64_t> group_bytes;
  for (const GatherGroup& g : schedule.groups) {
    group_bytes[g.id] = zero1 ? 0 : GroupBytes(graph, index, g);
  }
  absl::flat_hash_map<int32_t, int64_t> offload_bytes;
  for (const OffloadEntry& o : schedule.offloads) {
    int64_t held = 0;
    for (int32_t p : o.param_ids) {
      const int pos = index.ParamPos(p);
      if (pos >= 0) held += ParamStateBytes(graph.params[pos], world);
    }
    offload_bytes[o.id] = std::clamp<int64_t>(o.bytes, 0, held);
  }

  const AnchoredSchedule anchored(graph, index, schedule);
  absl::flat_hash_map<int32_t, int> gathered;  // group -> outstanding gathers
  std::vector<bool> on_host(schedule.offloads.size(), false);
  absl::flat_hash_map<int32_t, size_t> offload_pos;
  for (size_t o = 0; o < schedule.offloads.size(); ++o) {
    offload_pos.emplace(schedule.offloads[o].id, o);
  }
  std::vector<bool> grad_live(graph.params.size(), false);
  std::vector<int64_t> live_activation(n, 0);

  auto run = [&](const std::vector<Action>& actions) {
    for (const Action& a : actions) {
      switch (a.kind) {
        case ActionKind::kAllGather:
          level += group_bytes[a.group_id];
          ++gathered[a.group_id];
          break;
        case ActionKind::kRelease:
          level -= gathered[a.group_id] * group_bytes[a.group_id];
          gathered[a.group_id] = 0;
          break;
        case ActionKind::kReduceScatter:
          for (int32_t p : a.param_ids) {
            const int pos = index.ParamPos(p);
            if (pos < 0 || !grad_live[pos]) continue;
            grad_live[pos] = false;
            level -= graph.params[pos].bytes();
          }
          break;
        case ActionKind::kOffload:
        case ActionKind::kReload: {
          auto it = offload_pos.find(a.offload_id);
          if (it == offload_pos.end()) break;
          const bool to_host = a.kind == ActionKind::kOffload;
          if (on_host[it->second] == to_host) break;
          on_host[it->second] = to_host;
          const int64_t bytes = offload_bytes[a.offload_id];
          level += to_host ? -bytes : bytes;
          states += to_host ? -bytes : bytes;
          break;
        }
        case ActionKind::kWait:
          break;
      }
    }
  };

  ProgramMemory out;
  out.during.assign(n, 0);
  out.states.assign(n, 0);
  // The running sum of the measured carries, and what of it is held.
  int64_t carry_sum = 0;
  int64_t carry_held = 0;
  for (size_t i = 0; i < n; ++i) {
    const Node& node = graph.nodes[i];
    run(anchored.slot(AnchoredSchedule::BeforeSlot(static_cast<int>(i))));
    if (node.phase == Phase::kBackward) {
      for (int32_t p : node.param_ids) {
        const int pos = index.ParamPos(p);
        if (pos < 0 || grad_live[pos] || !graph.params[pos].trainable) {
          continue;
        }
        grad_live[pos] = true;
        level += graph.params[pos].bytes();
      }
    }
    // Like the simulator, count the node's own activations at its end before
    // its workspace is freed, and what a profile measured beyond the model.
    out.during[i] = level + node.workspace_bytes + node.measured_extra_bytes +
                    (node.phase == Phase::kForward ? node.activation_bytes : 0);
    out.states[i] = states;
    if (node.phase == Phase::kForward) {
      level += node.activation_bytes;
      live_activation[i] = node.activation_bytes;
    } else if (node.phase == Phase::kBackward && node.forward_id.has_value()) {
      const int twin = index.NodePos(*node.forward_id);
      if (twin >= 0 && static_cast<size_t>(twin) < i) {
        level -= live_activation[twin];
        live_activation[twin] = 0;
      }
    }
    carry_sum += node.measured_carry_bytes;
    level += std::max<int64_t>(0, carry_sum) - carry_held;
    carry_held = std::max<int64_t>(0, carry_sum);
    run(anchored.slot(AnchoredSchedule::AfterSlot(static_cast<int>(i))));
  }
  return out;
}

}  // namespace tandem
