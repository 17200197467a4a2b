#include "coordinator/passes/prefetch_pass.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/bytes.h"
#include "common/lowering/anchored_schedule.h"
#include "common/lowering/schedule_semantics.h"
#include "common/sim/simulator.h"
#include "common/status_macros.h"
#include "coordinator/analysis/group_sizes.h"

namespace tandem {
namespace {

// Re-anchoring rounds (each one simulation plus repairs), memory repairs per
// round, and fusions tried: together they bound the pass to a few dozen
// simulations on any graph.
constexpr int kMaxRounds = 8;
constexpr int kMaxRepairs = 24;
constexpr int kMaxFusionTrials = 48;
// Relative iteration-time difference treated as a tie.
constexpr double kTie = 1e-9;

constexpr double kInf = std::numeric_limits<double>::infinity();

// One gather of a group: its ALLGATHER, the first WAIT after it and the
// RELEASE that ends it (indices into Schedule::actions, -1 when missing).
struct Occurrence {
  int group_pos = 0;
  int gather = -1;
  int wait = -1;
  int release = -1;
  // Slot key of the WAIT, and its rank in program order.
  int wait_slot = 0;
  int64_t wait_seq = 0;
  // The gather may be anchored before any node in [min_node, max_node]: after
  // the group's previous RELEASE, at the latest at the front of its WAIT's
  // slot.
  int min_node = 0;
  int max_node = 0;
  bool movable = false;
};

// The latest time, at most `want`, at which the gather at queue position f
// could be issued so that it starts by `l`: it still follows the gather
// before it, but overtakes the reduce-scatters issued after that time
// (their times as simulated). -1 when even the gather before it ends after
// `l`.
double LatestIssueAhead(const std::vector<CollectiveTimelineEntry>& queue,
                        size_t f, double l, double want) {
  double busy = 0;
  std::vector<std::pair<double, double>> scatters;  // issue, end
  for (size_t p = f; p-- > 0;) {
    const CollectiveTimelineEntry& q = queue[p];
    if (q.kind == ActionKind::kAllGather) {
      busy = q.end_s;
      break;
    }
    scatters.push_back({q.issue_s, q.end_s});
  }
  if (busy > l) return -1;
  std::sort(scatters.begin(), scatters.end());
  for (const auto& [issue, end] : scatters) {
    // Here what it would wait for (busy) ends by l.
    if (issue > want) return want;
    busy = std::max(busy, end);
    if (busy > l) return std::nextafter(issue, -kInf);
  }
  return want;
}

// A schedule's actions bucketed by anchor slot (2·node position, +1 for
// after), in list order, with each action's program-order rank and the
// gather occurrences found walking them.
struct Layout {
  std::vector<std::vector<int>> slots;
  std::vector<int64_t> seq;
  std::vector<int> slot_of;
  std::vector<int> pos_in_slot;
  // Every occurrence, in program order of its gather.
  std::vector<Occurrence> occurrences;
};

Layout BuildLayout(const Graph& graph, const GraphIndex& index,
                   const Schedule& schedule) {
  const int n = static_cast<int>(graph.nodes.size());
  Layout layout;
  layout.slots = ActionIndicesBySlot(graph, index, schedule);
  layout.seq.assign(schedule.actions.size(), -1);
  layout.slot_of.assign(schedule.actions.size(), -1);
  layout.pos_in_slot.assign(schedule.actions.size(), -1);
  for (int s = 0; s < 2 * n; ++s) {
    for (size_t k = 0; k < layout.slots[s].size(); ++k) {
      layout.slot_of[layout.slots[s][k]] = s;
      layout.pos_in_slot[layout.slots[s][k]] = static_cast<int>(k);
    }
  }
  absl::flat_hash_map<int32_t, int> group_pos;
  for (size_t g = 0; g < schedule.groups.size(); ++g) {
    group_pos[schedule.groups[g].id] = static_cast<int>(g);
  }
  std::vector<int> open(schedule.groups.size(), -1);
  std::vector<int> last_release_slot(schedule.groups.size(), -1);
  std::vector<bool> broken(schedule.groups.size(), false);
  int64_t seq = 0;
  for (int s = 0; s < 2 * n; ++s) {
    for (int i : layout.slots[s]) {
      layout.seq[i] = seq++;
      const Action& a = schedule.actions[i];
      if (a.kind != ActionKind::kAllGather && a.kind != ActionKind::kWait &&
          a.kind != ActionKind::kRelease) {
        continue;
      }
      auto it = group_pos.find(a.group_id);
      if (it == group_pos.end()) continue;
      const int g = it->second;
      switch (a.kind) {
        case ActionKind::kAllGather: {
          // A second gather before a release: leave this group alone.
          if (open[g] >= 0) broken[g] = true;
          Occurrence occ;
          occ.group_pos = g;
          occ.gather = i;
          occ.min_node =
              last_release_slot[g] < 0 ? 0 : last_release_slot[g] / 2 + 1;
          open[g] = static_cast<int>(layout.occurrences.size());
          layout.occurrences.push_back(occ);
          break;
        }
        case ActionKind::kWait:
          if (open[g] >= 0 && layout.occurrences[open[g]].wait < 0) {
            Occurrence& occ = layout.occurrences[open[g]];
            occ.wait = i;
            occ.wait_slot = s;
            occ.wait_seq = layout.seq[i];
          }
          break;
        case ActionKind::kRelease:
          if (open[g] >= 0) layout.occurrences[open[g]].release = i;
          open[g] = -1;
          last_release_slot[g] = s;
          break;
        default:
          break;
      }
    }
  }
  for (Occurrence& occ : layout.occurrences) {
    occ.max_node = AnchoredSchedule::NodePosOf(occ.wait_slot);
    occ.movable =
        occ.wait >= 0 && !broken[occ.group_pos] && occ.min_node <= occ.max_node;
  }
  return layout;
}

// Re-anchors the movable gathers of the base schedule's layout.
class Reanchorer {
 public:
  Reanchorer(const PlanningContext& context, const Schedule& base)
      : context_(context),
        graph_(context.graph()),
        base_(base),
        layout_(BuildLayout(graph_, context.index(), base)) {
    for (const Occurrence& occ : layout_.occurrences) {
      if (occ.movable) movable_.push_back(occ);
    }
    std::sort(movable_.begin(), movable_.end(),
              [](const Occurrence& a, const Occurrence& b) {
                return a.wait_seq < b.wait_seq;
              });
    floor_.assign(movable_.size(), 0);
    for (size_t k = 0; k < movable_.size(); ++k) {
      floor_[k] = movable_[k].min_node;
    }
    memory_bound_.resize(movable_.size());
    group_full_bytes_.reserve(base.groups.size());
    for (const GatherGroup& g : base.groups) {
      group_full_bytes_.push_back(GroupBytes(graph_, context.index(), g));
    }
  }

  bool empty() const { return movable_.empty(); }
  size_t size() const { return movable_.size(); }
  const Occurrence& occurrence(size_t k) const { return movable_[k]; }
  int64_t group_bytes(size_t k) const {
    return group_full_bytes_[movable_[k].group_pos];
  }
  // The memory peak that last held occurrence k's gather back, if any.
  const std::optional<Binding>& memory_bound(size_t k) const {
    return memory_bound_[k];
  }

  // The anchors the base schedule has now (a gather after node x counts as
  // anchored before node x + 1, where it issues at the same time).
  std::vector<int> CurrentAnchors() const {
    std::vector<int> anchors(movable_.size());
    for (size_t k = 0; k < movable_.size(); ++k) {
      const int slot = layout_.slot_of[movable_[k].gather];
      anchors[k] = std::clamp((slot + 1) / 2, movable_[k].min_node,
                              movable_[k].max_node);
    }
    return anchors;
  }

  // Anchors from a simulation of the schedule Build() made for `gather_at`
  // (gather_at[k]: action index of occurrence k's gather in that schedule).
  // With `overtake`, a gather late only behind reduce-scatters queued ahead
  // of it is issued before them (LatestIssueAhead).
  std::vector<int> ProposeAnchors(const SimResult& sim,
                                  const std::vector<int>& gather_at,
                                  size_t num_actions, bool overtake) const {
    const int n = static_cast<int>(graph_.nodes.size());
    // tau[j]: when compute reaches the slot before node j.
    std::vector<double> tau(n + 1, 0.0);
    for (int j = 1; j <= n; ++j) tau[j] = sim.nodes[j - 1].end_s;

    std::vector<int> occ_of_action(num_actions, -1);
    for (size_t k = 0; k < gather_at.size(); ++k) {
      occ_of_action[gather_at[k]] = static_cast<int>(k);
    }
    const double slack = context_.options().prefetch_slack;
    std::vector<double> latest(movable_.size(), kInf);
    std::vector<double> free_at(movable_.size(), 0.0);
    std::vector<double> duration(movable_.size(), 0.0);
    double next = kInf;
    for (size_t f = sim.collectives.size(); f-- > 0;) {
      const CollectiveTimelineEntry& e = sim.collectives[f];
      const double dur = e.end_s - e.start_s;
      const int k = e.action_index >= 0 &&
                            static_cast<size_t>(e.action_index) < num_actions
                        ? occ_of_action[e.action_index]
                        : -1;
      double deadline = kInf;
      double earliest = e.issue_s;
      if (k >= 0) {
        deadline = tau[(movable_[k].wait_slot + 1) / 2];
        earliest = tau[movable_[k].min_node];
      }
      double l = std::min(deadline, next) - dur;
      // Nothing starts before it can be issued: what comes earlier in the
      // queue only has to be done by then.
      if (l < earliest) l = earliest;
      if (k >= 0) {
        latest[k] = l;
        duration[k] = dur;
        // When the stream gets to this gather anyway: after the gather
        // before it (use order is kept), and after the reduce-scatters
        // issued before this one would be. Issuing earlier than that only
        // holds memory; reduce-scatters issued later it may overtake.
        double free = 0;
        const double want = l - slack * dur;
        for (size_t p = f; p-- > 0;) {
          const CollectiveTimelineEntry& q = sim.collectives[p];
          if (q.kind == ActionKind::kAllGather) {
            free = std::max(free, q.end_s);
            break;
          }
          if (q.issue_s <= std::max(want, free - slack * dur)) {
            free = std::max(free, q.end_s);
          }
        }
        free_at[k] = free;
        if (overtake && free > l) {
          // Late only behind reduce-scatters queued ahead of it: issue it
          // before them instead.
          const double ahead = LatestIssueAhead(sim.collectives, f, l, want);
          if (ahead >= 0) {
            latest[k] = ahead + slack * dur;
            free_at[k] = 0;
          }
        }
      }
      next = l;
    }
    std::vector<int> anchors(movable_.size());
    for (size_t k = 0; k < movable_.size(); ++k) {
      const Occurrence& occ = movable_[k];
      if (latest[k] == kInf) {
        anchors[k] = occ.max_node;
        continue;
      }
      const double target =
          std::max(latest[k], free_at[k]) - slack * duration[k];
      auto it = std::upper_bound(tau.begin(), tau.begin() + n, target);
      const int j =
          it == tau.begin() ? 0 : static_cast<int>(it - tau.begin()) - 1;
      anchors[k] = std::clamp(j, occ.min_node, occ.max_node);
    }
    return anchors;
  }

  // Applies the floors and keeps issue order equal to use order.
  void Normalize(std::vector<int>& anchors) const {
    int previous = 0;
    for (size_t k = 0; k < movable_.size(); ++k) {
      int a = std::max({anchors[k], floor_[k], previous});
      a = std::min(a, movable_[k].max_node);
      anchors[k] = a;
      previous = a;
    }
  }

  // The base schedule with the movable gathers at `anchors` (at the front of
  // the slot before that node, in use order). gather_at receives each
  // occurrence's action index in the result.
  Schedule Build(const std::vector<int>& anchors,
                 std::vector<int>* gather_at) const {
    const int n = static_cast<int>(graph_.nodes.size());
    std::vector<bool> moved(base_.actions.size(), false);
    std::vector<std::vector<int>> at_node(n);
    for (size_t k = 0; k < movable_.size(); ++k) {
      moved[movable_[k].gather] = true;
      at_node[anchors[k]].push_back(static_cast<int>(k));
    }
    Schedule out = base_;
    out.actions.clear();
    out.actions.reserve(base_.actions.size());
    gather_at->assign(movable_.size(), -1);
    for (int s = 0; s < 2 * n; ++s) {
      if (s % 2 == 0) {
        for (int k : at_node[AnchoredSchedule::NodePosOf(s)]) {
          (*gather_at)[k] = static_cast<int>(out.actions.size());
          Action a = base_.actions[movable_[k].gather];
          a.node_id = graph_.nodes[AnchoredSchedule::NodePosOf(s)].id;
          a.position = AnchorPosition::kBefore;
          out.actions.push_back(std::move(a));
        }
      }
      for (int i : layout_.slots[s]) {
        if (!moved[i]) out.actions.push_back(base_.actions[i]);
      }
    }
    // Actions on unknown nodes (invalid schedules) are kept at the end.
    for (size_t i = 0; i < base_.actions.size(); ++i) {
      if (layout_.slot_of[i] < 0) out.actions.push_back(base_.actions[i]);
    }
    return out;
  }

  // Raises the floors of the gathers prefetched across the peak node, most
  // speculative first, until they free `excess` bytes. Returns false when
  // no prefetched gather holds memory there.
  bool PullLater(const std::vector<int>& anchors, int peak_pos, int64_t excess,
                 const Binding& why) {
    std::vector<int> crossing;
    for (size_t k = 0; k < movable_.size(); ++k) {
      const Occurrence& occ = movable_[k];
      if (anchors[k] <= peak_pos + 1 && anchors[k] < occ.max_node &&
          occ.max_node >= peak_pos + 1) {
        crossing.push_back(static_cast<int>(k));
      }
    }
    if (crossing.empty()) return false;
    std::sort(crossing.begin(), crossing.end(), [&](int a, int b) {
      if (movable_[a].max_node != movable_[b].max_node) {
        return movable_[a].max_node > movable_[b].max_node;
      }
      return a > b;
    });
    int64_t freed = 0;
    for (int k : crossing) {
      floor_[k] =
          std::max(floor_[k], std::min(movable_[k].max_node, peak_pos + 2));
      memory_bound_[k] = why;
      freed += group_full_bytes_[movable_[k].group_pos];
      if (freed >= excess) break;
    }
    return true;
  }

 private:
  const PlanningContext& context_;
  const Graph& graph_;
  const Schedule& base_;
  Layout layout_;
  std::vector<Occurrence> movable_;
  std::vector<int> floor_;
  std::vector<std::optional<Binding>> memory_bound_;
  std::vector<int64_t> group_full_bytes_;
};

struct Candidate {
  Schedule schedule;
  SimResult sim;
};

// One kPrefetch decision per gather that moved, applied in use order on the
// start's schedule and priced by simulation (the last state is the
// re-anchored plan itself). What binds each: nothing when its group is no
// longer exposed in `final_sim`; else the memory peak that held it back, or
// the link.
absl::Status ExplainMoves(PlanningContext& context,
                          const Reanchorer& reanchorer,
                          const std::vector<int>& from,
                          const std::vector<int>& to,
                          const SimResult& final_sim) {
  const Graph& graph = context.graph();
  const GraphIndex& index = context.index();
  const Schedule& base = context.schedule();
  std::vector<int> anchors = from;
  std::vector<int> gather_at;
  for (size_t k = 0; k < from.size(); ++k) {
    if (from[k] == to[k]) continue;
    anchors[k] = to[k];
    const Occurrence& occ = reanchorer.occurrence(k);
    const GatherGroup& group = base.groups[occ.group_pos];
    Decision d;
    d.kind = DecisionKind::kPrefetch;
    d.group_ids = {group.id};
    d.node_id = graph.nodes[to[k]].id;
    d.held_bytes = reanchorer.group_bytes(k);
    d.what = absl::StrCat(
        GroupLabel(graph, index, group), " gathered before ",
        NodeLabel(graph, index, graph.nodes[to[k]].id), " instead of ",
        NodeLabel(graph, index, graph.nodes[from[k]].id), ", for its use at ",
        NodeLabel(graph, index, graph.nodes[occ.max_node].id));
    const bool exposed =
        static_cast<size_t>(occ.group_pos) < final_sim.group_exposed_s.size() &&
        final_sim.group_exposed_s[occ.group_pos] > 1e-12;
    if (exposed) {
      if (reanchorer.memory_bound(k).has_value()) {
        d.binding = *reanchorer.memory_bound(k);
      } else {
        d.binding.kind = BindingKind::kLink;
      }
    }
    RETURN_IF_ERROR(
        context.Explain(std::move(d), reanchorer.Build(anchors, &gather_at)));
  }
  return absl::OkStatus();
}

bool Better(const SimResult& a, const SimResult& b) {
  const double tie = kTie * std::max(a.iteration_s, b.iteration_s);
  if (a.iteration_s < b.iteration_s - tie) return true;
  if (a.iteration_s > b.iteration_s + tie) return false;
  return a.peak_bytes < b.peak_bytes;
}

// Re-anchoring rounds with memory repair; returns the best candidate found
// (the start when nothing beats it). `overtake`: ProposeAnchors'. With
// `explain`, records the moves of the candidate returned.
absl::StatusOr<Candidate> Reanchor(PlanningContext& context, Candidate start,
                                   int64_t limit, bool overtake, bool explain) {
  Reanchorer reanchorer(context, start.schedule);
  if (reanchorer.empty()) return start;
  Candidate best = start;

  std::vector<int> anchors = reanchorer.CurrentAnchors();
  const std::vector<int> start_anchors = anchors;
  std::vector<int> best_anchors = anchors;
  std::vector<int> gather_at;
  // Build() lists actions in slot order; the simulation of that listing
  // times exactly like the start and maps gathers to occurrences.
  Schedule current = reanchorer.Build(anchors, &gather_at);
  ASSIGN_OR_RETURN(SimResult current_sim,
                   Simulate(context.graph(), current, context.hw()));

  int stale_rounds = 0;
  for (int round = 0; round < kMaxRounds; ++round) {
    std::vector<int> proposed = reanchorer.ProposeAnchors(
        current_sim, gather_at, current.actions.size(), overtake);
    if (round > 0) {
      // Later rounds only hoist further: times shrink as stalls vanish, and
      // moving gathers both ways could oscillate.
      for (size_t k = 0; k < proposed.size(); ++k) {
        proposed[k] = std::min(proposed[k], anchors[k]);
      }
    }
    reanchorer.Normalize(proposed);
    if (round > 0 && proposed == anchors) break;

    Schedule candidate;
    SimResult sim;
    bool fits = false;
    for (int repair = 0; repair <= kMaxRepairs; ++repair) {
      candidate = reanchorer.Build(proposed, &gather_at);
      ASSIGN_OR_RETURN(sim, Simulate(context.graph(), candidate, context.hw()));
      if (sim.peak_bytes <= limit) {
        fits = true;
        break;
      }
      const int peak_pos = context.index().NodePos(sim.peak_node_id);
      if (!reanchorer.PullLater(proposed, peak_pos, sim.peak_bytes - limit,
                                MemoryBinding(sim, limit))) {
        break;
      }
      reanchorer.Normalize(proposed);
    }
    if (!fits) break;
    anchors = proposed;
    if (Better(sim, best.sim)) {
      best = {candidate, sim};
      best_anchors = anchors;
      stale_rounds = 0;
    } else if (++stale_rounds >= 2) {
      break;
    }
    current = std::move(candidate);
    current_sim = std::move(sim);
  }
  if (explain && context.explaining() && best_anchors != start_anchors) {
    RETURN_IF_ERROR(ExplainMoves(context, reanchorer, start_anchors,
                                 best_anchors, best.sim));
  }
  return best;
}

// Fuses neighbouring gathers issued together in every occurrence when the
// hardware model says one collective of the sum is cheaper by fusion_gain
// and the simulation confirms it.
absl::StatusOr<Candidate> Fuse(PlanningContext& context, Candidate best,
                               int64_t limit) {
  const Graph& graph = context.graph();
  const GraphIndex& index = context.index();
  const double gain = context.options().fusion_gain;
  absl::flat_hash_set<std::pair<int32_t, int32_t>> rejected;
  for (int trial = 0; trial < kMaxFusionTrials;) {
    const Schedule& s = best.schedule;
    const Layout layout = BuildLayout(graph, index, s);
    std::vector<std::vector<int>> occ_of_group(s.groups.size());
    std::vector<bool> complete(s.groups.size(), true);
    for (size_t o = 0; o < layout.occurrences.size(); ++o) {
      const Occurrence& occ = layout.occurrences[o];
      occ_of_group[occ.group_pos].push_back(static_cast<int>(o));
      if (!occ.movable || occ.release < 0) complete[occ.group_pos] = false;
    }
    absl::flat_hash_map<int32_t, int> group_pos;
    for (size_t g = 0; g < s.groups.size(); ++g) {
      group_pos[s.groups[g].id] = static_cast<int>(g);
    }
    auto adjacent = [&](int ga, int gb) {
      const int sa = layout.slot_of[ga];
      return sa >= 0 && sa == layout.slot_of[gb] &&
             std::abs(layout.pos_in_slot[ga] - layout.pos_in_slot[gb]) == 1;
    };
    // The first pair of groups, in program order, that may fuse.
    int fa = -1;
    int fb = -1;
    for (const std::vector<int>& slot : layout.slots) {
      for (size_t i = 0; i + 1 < slot.size() && fa < 0; ++i) {
        const Action& x = s.actions[slot[i]];
        const Action& y = s.actions[slot[i + 1]];
        if (x.kind != ActionKind::kAllGather ||
            y.kind != ActionKind::kAllGather || x.group_id == y.group_id) {
          continue;
        }
        const int a = group_pos.at(x.group_id);
        const int b = group_pos.at(y.group_id);
        if (!complete[a] || !complete[b] ||
            occ_of_group[a].size() != occ_of_group[b].size() ||
            rejected.contains({std::min(x.group_id, y.group_id),
                               std::max(x.group_id, y.group_id)})) {
          continue;
        }
        bool together = true;
        for (size_t t = 0; t < occ_of_group[a].size() && together; ++t) {
          together = adjacent(layout.occurrences[occ_of_group[a][t]].gather,
                              layout.occurrences[occ_of_group[b][t]].gather);
        }
        if (!together) continue;
        const double apart = context.hw().AllGatherSeconds(
                                 GroupPaddedBytes(graph, index, s.groups[a])) +
                             context.hw().AllGatherSeconds(
                                 GroupPaddedBytes(graph, index, s.groups[b]));
        const double fused = context.hw().AllGatherSeconds(
            GroupPaddedBytes(graph, index, s.groups[a]) +
            GroupPaddedBytes(graph, index, s.groups[b]));
        if (apart <= 0 || fused > (1 - gain) * apart) continue;
        fa = a;
        fb = b;
      }
      if (fa >= 0) break;
    }
    if (fa < 0) break;
    ++trial;

    // a absorbs b: one gather where the first of the two was, the earlier
    // WAIT and the later RELEASE of each occurrence pair.
    const int32_t a_id = s.groups[fa].id;
    const int32_t b_id = s.groups[fb].id;
    Schedule fused = s;
    std::vector<bool> drop(s.actions.size(), false);
    for (size_t t = 0; t < occ_of_group[fa].size(); ++t) {
      const Occurrence& oa = layout.occurrences[occ_of_group[fa][t]];
      const Occurrence& ob = layout.occurrences[occ_of_group[fb][t]];
      auto keep_first = [&](int x, int y) {
        const bool x_first = layout.seq[x] < layout.seq[y];
        fused.actions[x_first ? x : y].group_id = a_id;
        drop[x_first ? y : x] = true;
      };
      auto keep_last = [&](int x, int y) {
        const bool x_last = layout.seq[x] > layout.seq[y];
        fused.actions[x_last ? x : y].group_id = a_id;
        drop[x_last ? y : x] = true;
      };
      keep_first(oa.gather, ob.gather);
      keep_first(oa.wait, ob.wait);
      keep_last(oa.release, ob.release);
    }
    std::vector<Action> actions;
    actions.reserve(fused.actions.size());
    for (size_t i = 0; i < fused.actions.size(); ++i) {
      if (!drop[i]) actions.push_back(std::move(fused.actions[i]));
    }
    fused.actions = std::move(actions);
    std::vector<int32_t>& params = fused.groups[fa].param_ids;
    params.insert(params.end(), s.groups[fb].param_ids.begin(),
                  s.groups[fb].param_ids.end());
    fused.groups.erase(fused.groups.begin() + fb);

    bool accept = FindGatherViolations(graph, fused).empty();
    SimResult sim;
    if (accept) {
      ASSIGN_OR_RETURN(sim, Simulate(graph, fused, context.hw()));
      accept = sim.peak_bytes <= limit &&
               sim.iteration_s <= best.sim.iteration_s * (1 + kTie) + 1e-12;
    }
    if (accept) {
      if (context.explaining()) {
        Decision d;
        d.kind = DecisionKind::kFuse;
        d.group_ids = {a_id, b_id};
        d.held_bytes = GroupBytes(graph, index, s.groups[fb]);
        d.what = absl::StrCat(
            GroupLabel(graph, index, s.groups[fb]), " fused into ",
            GroupLabel(graph, index, s.groups[fa]), ": one all-gather of ",
            FormatBytesShort(GroupPaddedBytes(graph, index, s.groups[fa]) +
                             GroupPaddedBytes(graph, index, s.groups[fb])),
            " instead of two");
        context.decisions().Record(std::move(d), sim);
      }
      best = {std::move(fused), std::move(sim)};
    } else {
      rejected.insert({std::min(a_id, b_id), std::max(a_id, b_id)});
    }
  }
  return best;
}

}  // namespace

absl::StatusOr<bool> PrefetchPass::RunImpl(PlanningContext& context) {
  if (context.schedule().mode != ShardingMode::kZero3) return false;
  if (!context.has_sim()) RETURN_IF_ERROR(context.Resimulate());
  const Schedule before = context.schedule();
  const int64_t limit = std::max(context.budget(), context.sim().peak_bytes);

  // Re-anchored twice: gathers kept behind the reduce-scatters issued
  // before them, and allowed to overtake them. Neither wins everywhere
  // (overtaking hides backward gathers better; it also keeps gradients
  // alive longer), so the faster is kept, and when explaining planned again
  // to record its moves.
  const Candidate start{before, context.sim()};
  ASSIGN_OR_RETURN(Candidate in_order,
                   Reanchor(context, start, limit, /*overtake=*/false,
                            /*explain=*/false));
  ASSIGN_OR_RETURN(Candidate overtaking,
                   Reanchor(context, start, limit, /*overtake=*/true,
                            /*explain=*/false));
  const bool overtake = Better(overtaking.sim, in_order.sim);
  Candidate best = overtake ? std::move(overtaking) : std::move(in_order);
  if (context.explaining()) {
    ASSIGN_OR_RETURN(best, Reanchor(context, start, limit, overtake,
                                    /*explain=*/true));
  }
  ASSIGN_OR_RETURN(best, Fuse(context, std::move(best), limit));

  if (best.schedule == before) return false;
  context.schedule() = std::move(best.schedule);
  RETURN_IF_ERROR(context.Resimulate());
  return true;
}

}  // namespace tandem
