#include "coordinator/passes/gradient_reduction_pass.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "common/lowering/gradient_reduction.h"
#include "common/sim/simulator.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

// The params whose gradients one backward node completes.
struct ReduceGroup {
  std::vector<int32_t> param_ids;
  // Full gradient bytes: held across micro-batches when reduced once.
  int64_t gradient_bytes = 0;
  // Link seconds the K−1 more reduce-scatters of per-micro-batch reduction
  // cost.
  double extra_s = 0;
  // Some of its params are reduced once / per micro-batch now.
  bool any_once = false;
  bool any_per_micro_batch = false;
  // Gradient bytes no longer held per extra link second.
  double BytesPerLinkSecond() const {
    return extra_s > 0 ? static_cast<double>(gradient_bytes) / extra_s
                       : static_cast<double>(gradient_bytes) * 1e18;
  }
};

std::vector<ReduceGroup> ReduceGroups(const PlanningContext& context) {
  const Graph& graph = context.graph();
  const int world = std::max(graph.world_size, 1);
  const std::vector<std::vector<GradientProduction>> productions =
      GradientProductions(graph);
  const std::vector<GradientReduction> modes =
      GradientReductions(graph, context.schedule());
  std::map<int, ReduceGroup> by_node;
  std::map<int, int64_t> padded;
  std::map<int, size_t> runs;
  for (size_t p = 0; p < graph.params.size(); ++p) {
    const std::vector<GradientProduction>& r = productions[p];
    if (r.size() < 2) continue;
    const Param& param = graph.params[p];
    const int at = r.back().last_pos;
    ReduceGroup& g = by_node[at];
    g.param_ids.push_back(param.id);
    g.gradient_bytes += param.bytes();
    padded[at] += graph.ReduceScatterBytes(param);
    runs[at] = std::max(runs[at], r.size());
    if (modes[p] == GradientReduction::kPerMicroBatch) {
      g.any_per_micro_batch = true;
    } else {
      g.any_once = true;
    }
  }
  std::vector<ReduceGroup> out;
  for (auto& [at, g] : by_node) {
    g.extra_s = static_cast<double>(runs[at] - 1) *
                context.hw().ReduceScatterSeconds(padded[at]);
    out.push_back(std::move(g));
  }
  return out;
}

// The current schedule with the first `count` of `groups` reduced as
// `reduction`.
Schedule Switched(const PlanningContext& context,
                  const std::vector<ReduceGroup>& groups, size_t count,
                  GradientReduction reduction) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < count; ++i) {
    ids.insert(ids.end(), groups[i].param_ids.begin(),
               groups[i].param_ids.end());
  }
  Schedule plan = context.schedule();
  SetGradientReduction(context.graph(), ids, reduction, plan);
  return plan;
}

int64_t Target(const PlanningContext& context) {
  return context.budget() -
         static_cast<int64_t>(context.options().memory_margin *
                              static_cast<double>(context.budget()));
}

absl::StatusOr<bool> Adopt(PlanningContext& context, Schedule plan) {
  context.schedule() = std::move(plan);
  RETURN_IF_ERROR(context.Resimulate());
  return true;
}

// Switches the fewest once-reduced groups to per-micro-batch reduction that
// bring the peak under the target.
absl::StatusOr<bool> Fit(PlanningContext& context) {
  const int64_t target = Target(context);
  if (context.sim().peak_bytes <= target) return false;
  std::vector<ReduceGroup> groups = ReduceGroups(context);
  groups.erase(std::remove_if(groups.begin(), groups.end(),
                              [](const ReduceGroup& g) { return !g.any_once; }),
               groups.end());
  if (groups.empty()) return false;
  std::stable_sort(groups.begin(), groups.end(),
                   [](const ReduceGroup& a, const ReduceGroup& b) {
                     return a.BytesPerLinkSecond() > b.BytesPerLinkSecond();
                   });
  const Graph& graph = context.graph();
  auto peak_with = [&](size_t count) -> absl::StatusOr<int64_t> {
    ASSIGN_OR_RETURN(SimResult sim,
                     Simulate(graph,
                              Switched(context, groups, count,
                                       GradientReduction::kPerMicroBatch),
                              context.hw()));
    return sim.peak_bytes;
  };
  ASSIGN_OR_RETURN(const int64_t all_peak, peak_with(groups.size()));
  if (all_peak > target) {
    // Even every gradient reduced per micro-batch does not fit: take the
    // least memory this pass can give and leave the rest to offload.
    if (all_peak >= context.sim().peak_bytes) return false;
    return Adopt(context, Switched(context, groups, groups.size(),
                                   GradientReduction::kPerMicroBatch));
  }
  // Smallest prefix that fits (the peak falls as the prefix grows).
  size_t lo = 1, hi = groups.size();
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    ASSIGN_OR_RETURN(const int64_t peak, peak_with(mid));
    if (peak <= target) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return Adopt(context, Switched(context, groups, lo,
                                 GradientReduction::kPerMicroBatch));
}

// On a communication-bound plan, every group to per-micro-batch reduction.
absl::StatusOr<bool> Lend(PlanningContext& context) {
  const SimResult& sim = context.sim();
  if (sim.comm_s <= sim.compute_s) return false;
  std::vector<ReduceGroup> groups = ReduceGroups(context);
  groups.erase(std::remove_if(groups.begin(), groups.end(),
                              [](const ReduceGroup& g) { return !g.any_once; }),
               groups.end());
  if (groups.empty()) return false;
  Schedule plan = Switched(context, groups, groups.size(),
                           GradientReduction::kPerMicroBatch);
  ASSIGN_OR_RETURN(SimResult lent,
                   Simulate(context.graph(), plan, context.hw()));
  if (lent.peak_bytes >= sim.peak_bytes) return false;
  return Adopt(context, std::move(plan));
}

// Back to reduce-once, most link seconds saved per byte first, as many as
// fit.
absl::StatusOr<bool> Return(PlanningContext& context) {
  std::vector<ReduceGroup> groups = ReduceGroups(context);
  groups.erase(std::remove_if(
                   groups.begin(), groups.end(),
                   [](const ReduceGroup& g) { return !g.any_per_micro_batch; }),
               groups.end());
  if (groups.empty()) return false;
  std::stable_sort(groups.begin(), groups.end(),
                   [](const ReduceGroup& a, const ReduceGroup& b) {
                     return a.BytesPerLinkSecond() < b.BytesPerLinkSecond();
                   });
  const int64_t limit = std::max(Target(context), context.sim().peak_bytes);
  const Graph& graph = context.graph();
  auto simulate = [&](size_t count) -> absl::StatusOr<SimResult> {
    return Simulate(graph,
                    Switched(context, groups, count, GradientReduction::kOnce),
                    context.hw());
  };
  // Largest prefix that fits (the peak grows with the prefix).
  size_t lo = 0, hi = groups.size();
  while (lo < hi) {
    const size_t mid = lo + (hi - lo + 1) / 2;
    ASSIGN_OR_RETURN(const SimResult sim, simulate(mid));
    if (sim.peak_bytes <= limit) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  if (lo == 0) return false;
  ASSIGN_OR_RETURN(const SimResult returned, simulate(lo));
  if (returned.peak_bytes > limit ||
      returned.iteration_s > context.sim().iteration_s * (1 + 1e-9)) {
    return false;
  }
  return Adopt(context,
               Switched(context, groups, lo, GradientReduction::kOnce));
}

}  // namespace

absl::string_view GradientReductionPass::name() const {
  switch (role_) {
    case Role::kFit:
      return "micro-batch-reduce";
    case Role::kLend:
      return "micro-batch-reduce-lend";
    case Role::kReturn:
      return "micro-batch-reduce-return";
  }
  return "?";
}

absl::StatusOr<bool> GradientReductionPass::RunImpl(PlanningContext& context) {
  if (context.schedule().mode != ShardingMode::kZero3 ||
      context.graph().micro_batches < 2) {
    return false;
  }
  if (!context.has_sim()) RETURN_IF_ERROR(context.Resimulate());
  switch (role_) {
    case Role::kFit:
      return Fit(context);
    case Role::kLend:
      return Lend(context);
    case Role::kReturn:
      return Return(context);
  }
  return false;
}

}  // namespace tandem
