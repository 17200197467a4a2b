#include "coordinator/passes/unshard_pass.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/lowering/anchored_schedule.h"
#include "common/sim/simulator.h"
#include "common/status_macros.h"
#include "coordinator/analysis/group_sizes.h"

namespace tandem {
namespace {

// Knapsack-and-verify rounds (each refills the headroom the last one left)
// and back-off steps per round: a handful of simulations in all.
constexpr int kFillRounds = 3;
constexpr int kMaxBackoffs = 12;
constexpr int kExactItems = 16;
// A group is made persistent rather than kept only when that is worth this
// many times the value of keeping it. Both cost the same bytes at the turn
// from forward to backward, but a persistent group holds them all
// iteration, next to optimizer states that are only lent to the host tier
// between forward and backward. With one gather each way (latency L,
// transfer time B) keeping saves L + B and persistence 2L + B (the refresh
// after the step adds B, its latency shared), so 1.5 picks persistence
// exactly for latency-bound groups (L > B): small params such as norms.
constexpr double kPersistentGain = 1.5;

enum class Hold {
  // Gathered from its first gather to its last release: every gather and
  // release in between is dropped.
  kKeep,
  // Persistent: no gather, wait or release at all; refreshed after the step.
  kPersistent,
};

struct Item {
  int group_pos = 0;
  Hold hold = Hold::kKeep;
  double value = 0;
  int64_t cost = 0;
};

// The base schedule with the chosen groups (positions into base.groups)
// kept gathered from their first gather to their last release, or
// persistent. `seq` is ProgramOrder(base).
Schedule Unshard(const Schedule& base, const std::vector<int64_t>& seq,
                 const std::vector<Item>& chosen) {
  Schedule out = base;
  if (chosen.empty()) return out;
  absl::flat_hash_set<int32_t> dropped_ids;
  absl::flat_hash_set<int32_t> kept_ids;
  std::vector<int32_t> params;
  for (const Item& item : chosen) {
    const GatherGroup& g = base.groups[item.group_pos];
    if (item.hold == Hold::kKeep) {
      kept_ids.insert(g.id);
      continue;
    }
    dropped_ids.insert(g.id);
    params.insert(params.end(), g.param_ids.begin(), g.param_ids.end());
  }
  std::sort(params.begin(), params.end());
  out.persistent_param_ids.insert(out.persistent_param_ids.end(),
                                  params.begin(), params.end());
  out.groups.clear();
  for (const GatherGroup& g : base.groups) {
    if (!dropped_ids.contains(g.id)) out.groups.push_back(g);
  }
  // Kept groups: the first ALLGATHER and WAIT and the last RELEASE in
  // program order survive.
  absl::flat_hash_map<int32_t, std::array<int, 3>> keep;  // gather, wait, rel
  for (int32_t id : kept_ids) keep[id] = {-1, -1, -1};
  for (size_t i = 0; i < base.actions.size(); ++i) {
    const Action& a = base.actions[i];
    auto it = keep.find(a.group_id);
    if (it == keep.end() || seq[i] < 0) continue;
    int slot = -1;
    bool first = true;
    switch (a.kind) {
      case ActionKind::kAllGather:
        slot = 0;
        break;
      case ActionKind::kWait:
        slot = 1;
        break;
      case ActionKind::kRelease:
        slot = 2;
        first = false;
        break;
      default:
        continue;
    }
    int& best = it->second[slot];
    if (best < 0 || (first ? seq[i] < seq[best] : seq[i] > seq[best])) {
      best = static_cast<int>(i);
    }
  }
  out.actions.clear();
  for (size_t i = 0; i < base.actions.size(); ++i) {
    const Action& a = base.actions[i];
    const bool group_action = a.kind == ActionKind::kAllGather ||
                              a.kind == ActionKind::kWait ||
                              a.kind == ActionKind::kRelease;
    if (group_action && dropped_ids.contains(a.group_id)) continue;
    if (group_action && seq[i] >= 0) {
      auto it = keep.find(a.group_id);
      if (it != keep.end()) {
        const std::array<int, 3>& survivors = it->second;
        if (static_cast<int>(i) != survivors[0] &&
            static_cast<int>(i) != survivors[1] &&
            static_cast<int>(i) != survivors[2]) {
          continue;
        }
      }
    }
    out.actions.push_back(a);
  }
  return out;
}

// Among items of equal cost and value the knapsack is indifferent, and
// breaks ties by order, picking a contiguous run of layers. A run of
// persistent groups lets backward compute race ahead of the reduce-scatters
// queued on the communication stream, and every full gradient it leaves
// behind lives until its reduce-scatter is done. Spreading the picks evenly
// over each class of equals (items are in first-use order) keeps the same
// value and cost but leaves a gather, whose WAIT holds compute back, between
// them.
//
// UnshardPass::Arrangement::kBackwardFirst picks the last members of each
// class instead (the groups the backward uses first): each one's gradient
// then appears while its own bytes are about to be released, so little
// memory is left to gradients queued at the turn; the price is a run of
// layers with no gathers to keep the link busy in early backward.
std::vector<int> SpreadAcrossEquals(const std::vector<double>& values,
                                    const std::vector<int64_t>& costs,
                                    const std::vector<int>& picked,
                                    UnshardPass::Arrangement arrangement) {
  std::map<std::pair<int64_t, double>, std::vector<int>> classes;
  for (size_t i = 0; i < values.size(); ++i) {
    classes[{costs[i], values[i]}].push_back(static_cast<int>(i));
  }
  std::vector<bool> is_picked(values.size(), false);
  for (int p : picked) is_picked[p] = true;
  std::vector<int> out;
  for (const auto& [key, members] : classes) {
    size_t count = 0;
    for (int m : members) count += is_picked[m] ? 1 : 0;
    const size_t total = members.size();
    for (size_t i = 0; i < count; ++i) {
      out.push_back(arrangement == UnshardPass::Arrangement::kBackwardFirst
                        ? members[total - 1 - i]
                        : members[(2 * i + 1) * total / (2 * count)]);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

double Density(const Item& item) {
  return item.value / static_cast<double>(std::max<int64_t>(item.cost, 1));
}

}  // namespace

std::vector<int> SolveKnapsack(const std::vector<double>& values,
                               const std::vector<int64_t>& costs,
                               int64_t capacity, int buckets) {
  std::vector<int> usable;
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] > 0 && costs[i] >= 0 && costs[i] <= capacity) {
      usable.push_back(static_cast<int>(i));
    }
  }
  std::vector<int> chosen;
  if (usable.empty() || capacity < 0) return chosen;

  if (usable.size() <= kExactItems) {
    const uint32_t subsets = uint32_t{1} << usable.size();
    double best_value = 0;
    uint32_t best_mask = 0;
    for (uint32_t mask = 1; mask < subsets; ++mask) {
      int64_t cost = 0;
      double value = 0;
      for (size_t b = 0; b < usable.size(); ++b) {
        if (mask & (uint32_t{1} << b)) {
          cost += costs[usable[b]];
          value += values[usable[b]];
        }
      }
      if (cost <= capacity && value > best_value) {
        best_value = value;
        best_mask = mask;
      }
    }
    for (size_t b = 0; b < usable.size(); ++b) {
      if (best_mask & (uint32_t{1} << b)) chosen.push_back(usable[b]);
    }
    return chosen;
  }

  buckets = std::max(buckets, 1);
  const int64_t unit = std::max<int64_t>(1, (capacity + buckets - 1) / buckets);
  const int cap = static_cast<int>(capacity / unit);
  const size_t m = usable.size();
  std::vector<int> weight(m);
  for (size_t i = 0; i < m; ++i) {
    weight[i] = static_cast<int>((costs[usable[i]] + unit - 1) / unit);
  }
  std::vector<double> best(cap + 1, 0.0);
  // take[i][c]: item i improves the best value at capacity c.
  std::vector<std::vector<bool>> take(m, std::vector<bool>(cap + 1, false));
  for (size_t i = 0; i < m; ++i) {
    const int w = weight[i];
    const double v = values[usable[i]];
    for (int c = cap; c >= w; --c) {
      if (best[c - w] + v > best[c]) {
        best[c] = best[c - w] + v;
        take[i][c] = true;
      }
    }
  }
  int c = cap;
  for (size_t i = m; i-- > 0;) {
    if (take[i][c]) {
      chosen.push_back(usable[i]);
      c -= weight[i];
    }
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

absl::StatusOr<bool> UnshardPass::RunImpl(PlanningContext& context) {
  if (context.schedule().mode != ShardingMode::kZero3) return false;
  if (!context.has_sim()) RETURN_IF_ERROR(context.Resimulate());
  const Graph& graph = context.graph();
  const GraphIndex& index = context.index();
  const Schedule base = context.schedule();
  const SimResult start = context.sim();
  const int64_t target =
      context.budget() -
      static_cast<int64_t>(context.options().memory_margin *
                           static_cast<double>(context.budget()));
  if (start.peak_bytes >= target || base.groups.empty()) return false;

  // Gather seconds per group over all its occurrences.
  absl::flat_hash_map<int32_t, int> group_pos;
  for (size_t g = 0; g < base.groups.size(); ++g) {
    group_pos[base.groups[g].id] = static_cast<int>(g);
  }
  // Priced by the hardware model rather than read off the timeline, so
  // groups of one shape get exactly equal values (SpreadAcrossEquals).
  std::vector<int> gathers(base.groups.size(), 0);
  for (const Action& a : base.actions) {
    if (a.kind != ActionKind::kAllGather) continue;
    auto it = group_pos.find(a.group_id);
    if (it != group_pos.end()) ++gathers[it->second];
  }
  std::vector<double> gather_s(base.groups.size(), 0.0);
  std::vector<double> refresh_s(base.groups.size(), 0.0);
  for (size_t g = 0; g < base.groups.size(); ++g) {
    const int64_t padded = GroupPaddedBytes(graph, index, base.groups[g]);
    gather_s[g] = gathers[g] * context.hw().AllGatherSeconds(padded);
    // A persistent param is still re-gathered once after the optimizer, in
    // one fused all-gather that nothing overlaps: its marginal cost there is
    // subtracted below. A frozen one is not (the step does not change it).
    int64_t refreshed = 0;
    for (int32_t p : base.groups[g].param_ids) {
      const int pos = index.ParamPos(p);
      if (pos < 0 || !graph.params[pos].trainable) continue;
      const Param& param = graph.params[pos];
      const int world = std::max(graph.world_size, 1);
      refreshed += param.shard_numel(world) * world * DTypeBytes(param.dtype);
    }
    refresh_s[g] = refreshed > 0
                       ? context.hw().AllGatherSeconds(2 * refreshed) -
                             context.hw().AllGatherSeconds(refreshed)
                       : 0.0;
  }
  const bool comm_bound = start.comm_s >= start.compute_s;
  const double exposed_ratio =
      start.comm_s > 0 ? start.exposed_comm_s / start.comm_s : 0.0;
  std::vector<Item> items;
  for (size_t g = 0; g < base.groups.size(); ++g) {
    if (gather_s[g] <= 0) continue;
    double weight = 1;
    if (!comm_bound) {
      const double own = g < start.group_exposed_s.size()
                             ? start.group_exposed_s[g] / gather_s[g]
                             : 0.0;
      weight = std::clamp(std::max(own, exposed_ratio), 0.0, 1.0);
    }
    Item item;
    item.group_pos = static_cast<int>(g);
    for (int32_t p : base.groups[g].param_ids) {
      const int pos = index.ParamPos(p);
      if (pos >= 0) item.cost += graph.params[pos].bytes();
    }
    // Kept: every gather but the first is saved. Persistent: every gather,
    // less the group's share of the refresh.
    const double one = gathers[g] > 0 ? gather_s[g] / gathers[g] : 0.0;
    const double keep = (gather_s[g] - one) * weight;
    const double persist = gather_s[g] * weight - refresh_s[g];
    if (kPersistentGain * keep >= persist) {
      item.hold = Hold::kKeep;
      item.value = keep;
    } else {
      item.hold = Hold::kPersistent;
      item.value = persist;
    }
    if (item.value > 0 && item.cost > 0) items.push_back(item);
  }
  if (items.empty()) return false;

  // Node positions using each group, ascending.
  std::vector<std::vector<int>> uses_of_group(base.groups.size());
  {
    absl::flat_hash_map<int32_t, int> group_of_param;
    for (size_t g = 0; g < base.groups.size(); ++g) {
      for (int32_t p : base.groups[g].param_ids) {
        group_of_param[p] = static_cast<int>(g);
      }
    }
    for (size_t pos = 0; pos < graph.nodes.size(); ++pos) {
      for (int32_t p : graph.nodes[pos].param_ids) {
        auto it = group_of_param.find(p);
        if (it == group_of_param.end()) continue;
        std::vector<int>& uses = uses_of_group[it->second];
        if (uses.empty() || uses.back() != static_cast<int>(pos)) {
          uses.push_back(static_cast<int>(pos));
        }
      }
    }
  }

  const std::vector<int64_t> order = ProgramOrder(graph, index, base);
  std::vector<Item> chosen;
  std::vector<bool> considered(items.size(), false);
  Schedule best = base;
  SimResult best_sim = start;
  for (int round = 0; round < kFillRounds; ++round) {
    const int64_t headroom = target - best_sim.peak_bytes;
    if (headroom <= 0) break;
    std::vector<int> open;
    std::vector<double> values;
    std::vector<int64_t> costs;
    for (size_t i = 0; i < items.size(); ++i) {
      if (considered[i]) continue;
      open.push_back(static_cast<int>(i));
      values.push_back(items[i].value);
      costs.push_back(items[i].cost);
    }
    const std::vector<int> picked = SpreadAcrossEquals(
        values, costs, SolveKnapsack(values, costs, headroom), arrangement_);
    if (picked.empty()) break;
    std::vector<Item> trial = chosen;
    for (int p : picked) {
      trial.push_back(items[open[p]]);
      considered[open[p]] = true;
    }

    // Simulate the whole pick; when it does not fit, keep the longest
    // prefix of the additions that does (binary search), ordered so that
    // the groups used closest before the peak go first: memory over the
    // target comes mostly from what compute, no longer held back by their
    // WAITs, ran ahead into (full gradients queued behind reduce-scatters,
    // gathers queued behind gathers). Then the least valuable per byte.
    auto evaluate = [&](const std::vector<Item>& set, Schedule* schedule,
                        SimResult* sim) -> absl::StatusOr<bool> {
      *schedule = Unshard(base, order, set);
      ASSIGN_OR_RETURN(*sim, Simulate(graph, *schedule, context.hw()));
      return sim->peak_bytes <= target &&
             sim->iteration_s <= best_sim.iteration_s * (1 + 1e-9) + 1e-12;
    };
    Schedule candidate;
    SimResult sim;
    ASSIGN_OR_RETURN(bool fits, evaluate(trial, &candidate, &sim));
    if (!fits) {
      const int peak_pos = index.NodePos(sim.peak_node_id);
      auto distance = [&](const Item& item) {
        const std::vector<int>& uses = uses_of_group[item.group_pos];
        auto it = std::upper_bound(uses.begin(), uses.end(), peak_pos);
        return it == uses.begin() ? static_cast<int>(graph.nodes.size())
                                  : peak_pos - *std::prev(it);
      };
      std::vector<Item> added(trial.begin() + chosen.size(), trial.end());
      std::sort(added.begin(), added.end(), [&](const Item& a, const Item& b) {
        const int da = distance(a);
        const int db = distance(b);
        if (da != db) return da > db;
        return Density(a) > Density(b);
      });
      size_t lo = 0;
      size_t hi = added.size();
      for (int step = 0; step < kMaxBackoffs && hi - lo > 1; ++step) {
        const size_t mid = (lo + hi) / 2;
        std::vector<Item> prefix = chosen;
        prefix.insert(prefix.end(), added.begin(), added.begin() + mid);
        Schedule mid_schedule;
        SimResult mid_sim;
        ASSIGN_OR_RETURN(bool mid_fits,
                         evaluate(prefix, &mid_schedule, &mid_sim));
        if (mid_fits) {
          lo = mid;
          trial = std::move(prefix);
          candidate = std::move(mid_schedule);
          sim = std::move(mid_sim);
          fits = true;
        } else {
          hi = mid;
        }
      }
    }
    const bool accepted = fits;
    if (fits) {
      chosen = std::move(trial);
      best = std::move(candidate);
      best_sim = std::move(sim);
    }
    if (!accepted) break;
  }
  if (chosen.empty()) return false;
  if (context.explaining()) {
    // One decision per held group, added in the order chosen, each priced
    // by simulating the base with the groups so far held; the last state is
    // the plan. Memory binds when a candidate was left out.
    Binding binding;
    if (chosen.size() < items.size()) {
      binding = MemoryBinding(best_sim, target);
    }
    std::vector<Item> so_far;
    for (const Item& item : chosen) {
      so_far.push_back(item);
      const GatherGroup& group = base.groups[item.group_pos];
      Decision d;
      d.kind = item.hold == Hold::kKeep ? DecisionKind::kKeep
                                        : DecisionKind::kPersist;
      d.group_ids = {group.id};
      d.held_bytes = item.cost;
      d.binding = binding;
      if (item.hold == Hold::kKeep) {
        d.what = absl::StrCat(GroupLabel(graph, index, group),
                              " kept gathered from its first gather to its "
                              "last release: ",
                              gathers[item.group_pos] - 1, " of ",
                              gathers[item.group_pos], " gathers saved");
      } else {
        d.param_ids = group.param_ids;
        d.what = absl::StrCat(
            GroupLabel(graph, index, group), " made persistent: none of its ",
            gathers[item.group_pos], " gathers, refreshed once after the step");
      }
      RETURN_IF_ERROR(
          context.Explain(std::move(d), Unshard(base, order, so_far)));
    }
  }
  context.schedule() = std::move(best);
  RETURN_IF_ERROR(context.Resimulate());
  return true;
}

}  // namespace tandem
