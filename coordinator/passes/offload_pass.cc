#include "coordinator/passes/offload_pass.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/bytes.h"
#include "common/lowering/anchored_schedule.h"
#include "common/sim/simulator.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

// Grow / move-reload rounds: each one simulation.
constexpr int kMaxRounds = 16;

struct Candidate {
  int32_t param_id = 0;
  int64_t bytes = 0;
  // Earliest node position its reload may go before (memory repair).
  int reload_floor = 0;
};

bool LargerFirst(const Candidate& a, const Candidate& b) {
  return a.bytes > b.bytes;
}

double GiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

// Builds schedules that offload a prefix-chosen set of params' states.
class OffloadPlanner {
 public:
  OffloadPlanner(const PlanningContext& context, const Schedule& base)
      : context_(context), graph_(context.graph()), base_(base) {
    const int n = static_cast<int>(graph_.nodes.size());
    // Stall-free compute clock at the slot before each node.
    start_.assign(n + 1, 0.0);
    for (int j = 0; j < n; ++j) {
      start_[j + 1] = start_[j] + graph_.nodes[j].time_s;
    }
    first_forward_ = 0;
    for (int j = 0; j < n; ++j) {
      if (graph_.nodes[j].phase == Phase::kForward) {
        first_forward_ = j;
        break;
      }
    }
    optimizer_ = n - 1;
    for (int j = 0; j < n; ++j) {
      if (graph_.nodes[j].phase == Phase::kOptimizer) {
        optimizer_ = j;
        break;
      }
    }
    for (const Param& p : graph_.params) {
      const int64_t bytes = ParamStateBytes(p, graph_.world_size);
      if (bytes > 0) candidates_.push_back({p.id, bytes});
    }
    std::stable_sort(candidates_.begin(), candidates_.end(), LargerFirst);
  }

  // Chains reloads on the simulated clock of the current plan (compute
  // reaches the slot before node j when node j−1 ends, stalls included)
  // instead of the stall-free one, each copy counted `stretch` times.
  void UseSimulatedClock(const SimResult& sim, double stretch) {
    const int n = static_cast<int>(graph_.nodes.size());
    start_.assign(n + 1, 0.0);
    for (int j = 1; j <= n; ++j) start_[j] = sim.nodes[j - 1].end_s;
    stretch_ = stretch;
  }

  const std::vector<Candidate>& candidates() const { return candidates_; }
  int optimizer_pos() const { return optimizer_; }

  // Node position before which each of `chosen` is reloaded: chained back
  // from the optimizer's start so the copies end by it, and no earlier than
  // each entry's reload_floor.
  std::vector<int> LatestReloads(const std::vector<Candidate>& chosen) const {
    std::vector<int> anchors(chosen.size());
    double end = start_[optimizer_];
    const int lowest = std::min(first_forward_ + 1, optimizer_);
    for (size_t i = chosen.size(); i-- > 0;) {
      end -= stretch_ * context_.hw().HostCopySeconds(chosen[i].bytes);
      auto it = std::upper_bound(start_.begin(),
                                 start_.begin() + optimizer_ + 1, end);
      int j =
          it == start_.begin() ? 0 : static_cast<int>(it - start_.begin()) - 1;
      anchors[i] = std::clamp(j, lowest, optimizer_);
    }
    // Issue order is list order: keep the anchors non-decreasing.
    for (size_t i = 0; i < anchors.size(); ++i) {
      anchors[i] = std::max(anchors[i], chosen[i].reload_floor);
      if (i > 0) anchors[i] = std::max(anchors[i], anchors[i - 1]);
      anchors[i] = std::min(anchors[i], optimizer_);
    }
    return anchors;
  }

  Schedule Build(const std::vector<Candidate>& chosen,
                 const std::vector<int>& reload_before) const {
    Schedule out = base_;
    std::vector<StateCopy> copies;
    copies.reserve(chosen.size());
    for (size_t i = 0; i < chosen.size(); ++i) {
      copies.push_back({{chosen[i].param_id},
                        chosen[i].bytes,
                        AnchoredSchedule::AfterSlot(first_forward_),
                        AnchoredSchedule::BeforeSlot(reload_before[i])});
    }
    SpliceStateOffloads(graph_, context_.index(), copies, out);
    return out;
  }

 private:
  const PlanningContext& context_;
  const Graph& graph_;
  Schedule base_;
  std::vector<double> start_;
  double stretch_ = 1;
  int first_forward_ = 0;
  int optimizer_ = 0;
  std::vector<Candidate> candidates_;
};

// Relative iteration-time difference treated as a tie.
constexpr double kTie = 1e-9;
// Lending: reloads are chained back from the optimizer with each copy
// counted this many times, as later passes shorten the timeline.
constexpr double kLendStretch = 3.0;
// Returning: halvings of the set of entries tried.
constexpr int kMaxReturnTrials = 12;

bool NoSlower(const SimResult& a, const SimResult& b) {
  return a.iteration_s <= b.iteration_s * (1 + kTie) + 1e-12;
}

// `schedule` without the offload entries `dropped` and their copies.
Schedule WithoutEntries(const Schedule& schedule,
                        const absl::flat_hash_set<int32_t>& dropped) {
  Schedule out = schedule;
  out.offloads.clear();
  for (const OffloadEntry& entry : schedule.offloads) {
    if (!dropped.contains(entry.id)) out.offloads.push_back(entry);
  }
  out.actions.clear();
  for (const Action& a : schedule.actions) {
    const bool copy =
        a.kind == ActionKind::kOffload || a.kind == ActionKind::kReload;
    if (copy && dropped.contains(a.offload_id)) continue;
    out.actions.push_back(a);
  }
  return out;
}

// "optimizer states of layers.0.wq (96MiB) to the host after n0 x, back
// before n9 y".
std::string DescribeEntry(const PlanningContext& context,
                          const Schedule& schedule, const OffloadEntry& entry) {
  std::string out = absl::StrCat(
      "optimizer states of ",
      ParamsLabel(context.graph(), context.index(), entry.param_ids), " (",
      FormatBytesShort(entry.bytes), ")");
  for (const Action& a : schedule.actions) {
    if (a.offload_id != entry.id) continue;
    if (a.kind == ActionKind::kOffload) {
      absl::StrAppend(&out, " to the host ", AnchorPositionName(a.position),
                      " ",
                      NodeLabel(context.graph(), context.index(), a.node_id));
    } else if (a.kind == ActionKind::kReload) {
      absl::StrAppend(&out, ", back ", AnchorPositionName(a.position), " ",
                      NodeLabel(context.graph(), context.index(), a.node_id));
    }
  }
  return out;
}

// One kOffload decision per entry `after` has and `before` does not, added
// one at a time (the others stripped from `after`) and priced by
// simulation; the last state is `after` itself.
absl::Status ExplainAddedEntries(PlanningContext& context,
                                 const Schedule& before, const Schedule& after,
                                 const Binding& binding) {
  if (!context.explaining()) return absl::OkStatus();
  absl::flat_hash_set<int32_t> pending;
  for (const OffloadEntry& entry : after.offloads) {
    if (before.FindOffload(entry.id) == nullptr) pending.insert(entry.id);
  }
  for (const OffloadEntry& entry : after.offloads) {
    if (!pending.contains(entry.id)) continue;
    pending.erase(entry.id);
    Decision d;
    d.kind = DecisionKind::kOffload;
    d.offload_ids = {entry.id};
    d.param_ids = entry.param_ids;
    d.held_bytes = entry.bytes;
    d.binding = binding;
    d.what = DescribeEntry(context, after, entry);
    RETURN_IF_ERROR(
        context.Explain(std::move(d), WithoutEntries(after, pending)));
  }
  return absl::OkStatus();
}

// Role::kLend: every optimizer state offloaded during forward, reloaded
// during backward on the current plan's clock, when the plan is
// communication-bound and the copies cost no time.
absl::StatusOr<bool> Lend(PlanningContext& context,
                          const OffloadPass::LendOptions& options) {
  const SimResult& now = context.sim();
  const Schedule& schedule = context.schedule();
  if (schedule.mode != ShardingMode::kZero3 || schedule.groups.empty() ||
      options.fraction <= 0 ||
      (options.only_when_it_pays && now.comm_s <= now.compute_s)) {
    return false;
  }
  OffloadPlanner planner(context, schedule);
  if (planner.candidates().empty()) return false;
  planner.UseSimulatedClock(now, kLendStretch);
  // The largest params' states first, up to the fraction of all of them.
  std::vector<Candidate> all = planner.candidates();
  if (options.fraction < 1) {
    int64_t total = 0;
    for (const Candidate& c : all) total += c.bytes;
    const double want = options.fraction * static_cast<double>(total);
    int64_t bytes = 0;
    size_t count = 0;
    while (count < all.size() && static_cast<double>(bytes) < want) {
      bytes += all[count++].bytes;
    }
    all.resize(count);
  }
  Schedule plan = planner.Build(all, planner.LatestReloads(all));
  ASSIGN_OR_RETURN(SimResult sim,
                   Simulate(context.graph(), plan, context.hw()));
  if (options.only_when_it_pays &&
      (sim.peak_bytes >= now.peak_bytes || !NoSlower(sim, now))) {
    return false;
  }
  if (context.explaining()) {
    Decision d;
    d.kind = DecisionKind::kOffload;
    for (const OffloadEntry& entry : plan.offloads) {
      d.offload_ids.push_back(entry.id);
      d.held_bytes += entry.bytes;
    }
    d.what = absl::StrCat(
        options.fraction < 1 ? "the largest optimizer states ("
                             : "every optimizer state (",
        plan.offloads.size(), " entries, ", FormatBytesShort(d.held_bytes),
        ") lent to the host between forward and backward: ",
        options.only_when_it_pays ? "the plan is communication-bound, so " : "",
        "unshard may spend that memory on params");
    context.decisions().Record(std::move(d), sim);
  }
  context.schedule() = std::move(plan);
  RETURN_IF_ERROR(context.Resimulate());
  return true;
}

// Role::kReturn: drops the smallest offload entries the plan no longer
// needs (their bytes fit under budget − margin at the peak), keeping the
// rest where they are.
absl::StatusOr<bool> Return(PlanningContext& context) {
  const Schedule& schedule = context.schedule();
  if (schedule.offloads.empty()) return false;
  const int64_t budget = context.budget();
  const int64_t target =
      budget - static_cast<int64_t>(context.options().memory_margin *
                                    static_cast<double>(budget));
  const SimResult now = context.sim();
  if (now.peak_bytes >= target) return false;
  // Entries by bytes, smallest first (ties: later entries first).
  std::vector<int> order(schedule.offloads.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return schedule.offloads[a].bytes < schedule.offloads[b].bytes;
  });
  size_t count = 0;
  int64_t bytes = 0;
  while (count < order.size() &&
         bytes + schedule.offloads[order[count]].bytes <=
             target - now.peak_bytes) {
    bytes += schedule.offloads[order[count]].bytes;
    ++count;
  }
  for (int trial = 0; trial < kMaxReturnTrials && count > 0; ++trial) {
    std::vector<bool> drop(schedule.offloads.size(), false);
    absl::flat_hash_set<int32_t> dropped;
    for (size_t i = 0; i < count; ++i) {
      drop[order[i]] = true;
      dropped.insert(schedule.offloads[order[i]].id);
    }
    Schedule fewer = schedule;
    fewer.offloads.clear();
    for (size_t i = 0; i < schedule.offloads.size(); ++i) {
      if (!drop[i]) fewer.offloads.push_back(schedule.offloads[i]);
    }
    fewer.actions.clear();
    for (const Action& a : schedule.actions) {
      const bool copy =
          a.kind == ActionKind::kOffload || a.kind == ActionKind::kReload;
      if (copy && dropped.contains(a.offload_id)) continue;
      fewer.actions.push_back(a);
    }
    ASSIGN_OR_RETURN(SimResult sim,
                     Simulate(context.graph(), fewer, context.hw()));
    if (sim.peak_bytes <= target && NoSlower(sim, now)) {
      if (context.explaining()) {
        // One decision: the pass drops the entries as one set. Memory binds
        // what stays on the host.
        Decision d;
        d.kind = DecisionKind::kReturn;
        for (size_t i = 0; i < count; ++i) {
          const OffloadEntry& entry = schedule.offloads[order[i]];
          d.offload_ids.push_back(entry.id);
          d.param_ids.insert(d.param_ids.end(), entry.param_ids.begin(),
                             entry.param_ids.end());
          d.held_bytes += entry.bytes;
        }
        if (!fewer.offloads.empty()) d.binding = MemoryBinding(sim, target);
        d.what = absl::StrCat(
            "optimizer states of ",
            ParamsLabel(context.graph(), context.index(), d.param_ids), " (",
            count, " of ", schedule.offloads.size(), " entries, ",
            FormatBytesShort(d.held_bytes),
            ") kept on the device again: unshard left room for them");
        context.decisions().Record(std::move(d), sim);
      }
      context.schedule() = std::move(fewer);
      RETURN_IF_ERROR(context.Resimulate());
      return true;
    }
    count /= 2;
  }
  return false;
}

}  // namespace

absl::string_view OffloadPass::name() const {
  switch (role_) {
    case Role::kFit:
      break;
    case Role::kLend:
      return "offload-lend";
    case Role::kReturn:
      return "offload-return";
  }
  return "offload";
}

absl::StatusOr<bool> OffloadPass::RunImpl(PlanningContext& context) {
  if (!context.has_sim()) RETURN_IF_ERROR(context.Resimulate());
  if (role_ == Role::kLend) return Lend(context, lend_);
  if (role_ == Role::kReturn) return Return(context);
  const int64_t budget = context.budget();
  const int64_t margin = static_cast<int64_t>(context.options().memory_margin *
                                              static_cast<double>(budget));
  if (context.sim().peak_bytes <= budget - margin) return false;
  const Graph& graph = context.graph();
  if (graph.nodes.empty()) return false;
  OffloadPlanner planner(context, context.schedule());
  const std::vector<Candidate>& all = planner.candidates();

  // Everything offloaded, reloaded right before the optimizer: the least
  // memory offloading can reach.
  const std::vector<int> last(all.size(), planner.optimizer_pos());
  Schedule floor_plan = planner.Build(all, last);
  ASSIGN_OR_RETURN(SimResult floor_sim,
                   Simulate(graph, floor_plan, context.hw()));
  if (floor_sim.peak_bytes > budget) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "budget %.2f GiB is infeasible: even with all optimizer states "
        "offloaded the peak is %.2f GiB; the smallest feasible budget is "
        "%.2f GiB (use memory.budget_bytes >= %d)",
        GiB(budget), GiB(floor_sim.peak_bytes), GiB(floor_sim.peak_bytes),
        floor_sim.peak_bytes));
  }

  // Leave room for prefetch when offloading can: the margin and one group.
  // At world 1 a gather holds no memory (the full param is its shard), so
  // there is nothing to leave room for.
  int64_t largest_group = 0;
  for (const GatherGroup& g : context.schedule().groups) {
    if (graph.world_size <= 1) break;
    int64_t bytes = 0;
    for (int32_t p : g.param_ids) {
      const int pos = context.index().ParamPos(p);
      if (pos >= 0) bytes += graph.params[pos].bytes();
    }
    largest_group = std::max(largest_group, bytes);
  }
  int64_t target = budget - margin - largest_group;
  if (floor_sim.peak_bytes > target) target = budget - margin;
  if (floor_sim.peak_bytes > target) target = budget;
  // Over the margin, but offloading cannot get under it: leave it.
  if (context.sim().peak_bytes <= target) return false;

  // Grow: for what is still over, the smallest single param's states that
  // cover it, else the largest, and again (few entries, just enough bytes);
  // re-simulate; move reloads that fall before the peak after it.
  std::vector<Candidate> pool = all;
  std::vector<Candidate> chosen;
  int64_t excess = context.sim().peak_bytes - target;
  Schedule plan;
  SimResult sim;
  bool fits = false;
  bool grow = true;
  for (int round = 0; round < kMaxRounds; ++round) {
    int64_t added = 0;
    while (grow && !pool.empty() && (added < excess || added == 0)) {
      const int64_t need = std::max<int64_t>(excess - added, 1);
      size_t pick = 0;
      for (size_t i = 0; i < pool.size() && pool[i].bytes >= need; ++i) {
        pick = i;
      }
      added += pool[pick].bytes;
      chosen.push_back(pool[pick]);
      pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(pick));
    }
    std::stable_sort(chosen.begin(), chosen.end(), LargerFirst);
    const std::vector<int> reload = planner.LatestReloads(chosen);
    plan = planner.Build(chosen, reload);
    ASSIGN_OR_RETURN(sim, Simulate(graph, plan, context.hw()));
    if (sim.peak_bytes <= target) {
      fits = true;
      break;
    }
    const int peak_pos = context.index().NodePos(sim.peak_node_id);
    bool moved = false;
    if (peak_pos < planner.optimizer_pos()) {
      for (size_t i = 0; i < reload.size(); ++i) {
        if (reload[i] <= peak_pos) {
          chosen[i].reload_floor = peak_pos + 1;
          moved = true;
        }
      }
    }
    grow = !moved;
    excess = sim.peak_bytes - target;
    if (grow && pool.empty()) break;
  }
  if (!fits && sim.peak_bytes > budget) {
    // The floor plan fits; it only stalls the optimizer on the reloads.
    chosen = all;
    plan = std::move(floor_plan);
    sim = std::move(floor_sim);
  }

  // Just enough: drop the smallest entries while the slack covers them.
  while (chosen.size() > 1) {
    if (chosen.back().bytes > target - sim.peak_bytes) break;
    std::vector<Candidate> fewer(chosen.begin(), chosen.end() - 1);
    Schedule smaller = planner.Build(fewer, planner.LatestReloads(fewer));
    ASSIGN_OR_RETURN(SimResult smaller_sim,
                     Simulate(graph, smaller, context.hw()));
    if (smaller_sim.peak_bytes > target) break;
    chosen = std::move(fewer);
    plan = std::move(smaller);
    sim = std::move(smaller_sim);
  }

  // Memory binds every entry: the peak before offloading, against the target.
  RETURN_IF_ERROR(ExplainAddedEntries(context, context.schedule(), plan,
                                      MemoryBinding(context.sim(), target)));
  context.schedule() = std::move(plan);
  RETURN_IF_ERROR(context.Resimulate());
  return true;
}

}  // namespace tandem
