#include "coordinator/passes/offload_unshard_search_pass.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "coordinator/passes/gradient_reduction_pass.h"
#include "coordinator/passes/prefetch_pass.h"

namespace tandem {
namespace {

// Relative iteration-time difference treated as a tie.
constexpr double kTie = 1e-9;

// The passes after offload-lend, in the pipeline's order.
std::vector<std::unique_ptr<PlanningPass>> PassesAfterLend(
    UnshardPass::Arrangement arrangement) {
  std::vector<std::unique_ptr<PlanningPass>> passes;
  passes.push_back(std::make_unique<GradientReductionPass>(
      GradientReductionPass::Role::kLend));
  passes.push_back(std::make_unique<UnshardPass>(arrangement));
  passes.push_back(std::make_unique<GradientReductionPass>(
      GradientReductionPass::Role::kReturn));
  passes.push_back(std::make_unique<OffloadPass>(OffloadPass::Role::kReturn));
  passes.push_back(std::make_unique<PrefetchPass>());
  return passes;
}

// Runs `pass` on `context` as a pipeline would: re-simulates when it changed
// the plan and, when explaining, records what it changed beyond its own
// decisions. Decisions go under `record_as` (the search's name: the
// schedule's provenance names the search, not its inner passes).
absl::Status RunInner(PlanningPass& pass, PlanningContext& context,
                      absl::string_view record_as) {
  const size_t decisions_before = context.decisions().size();
  context.decisions().set_pass(record_as);
  absl::StatusOr<bool> changed = pass.Run(context);
  if (!changed.ok()) {
    return absl::Status(
        changed.status().code(),
        absl::StrCat(pass.name(), ": ", changed.status().message()));
  }
  if (*changed) RETURN_IF_ERROR(context.Resimulate());
  context.decisions().RecordRest(
      record_as, *changed, context.decisions().size() > decisions_before,
      context.sim(), RestBinding(context.sim(), context.memory_target()));
  return absl::OkStatus();
}

std::string VariantName(const OffloadUnshardSearchPass::Variant& v) {
  std::string lend;
  if (v.lend.only_when_it_pays) {
    lend = "by the pipeline's rule";
  } else if (v.lend.fraction <= 0) {
    lend = "nothing";
  } else if (v.lend.fraction >= 1) {
    lend = "every optimizer state";
  } else {
    lend = absl::StrFormat("the largest %.0f%% of the optimizer states",
                           100 * v.lend.fraction);
  }
  return absl::StrCat("lending ", lend, ", unshard ",
                      v.arrangement == UnshardPass::Arrangement::kSpread
                          ? "spread"
                          : "backward-first");
}

}  // namespace

std::vector<OffloadUnshardSearchPass::Variant>
OffloadUnshardSearchPass::Variants() {
  std::vector<Variant> variants;
  const OffloadPass::LendOptions levels[] = {
      {1, true}, {0, false}, {0.5, false}, {1, false}};
  for (const OffloadPass::LendOptions& lend : levels) {
    for (UnshardPass::Arrangement arrangement :
         {UnshardPass::Arrangement::kSpread,
          UnshardPass::Arrangement::kBackwardFirst}) {
      variants.push_back({lend, arrangement});
    }
  }
  return variants;
}

absl::StatusOr<bool> OffloadUnshardSearchPass::RunImpl(
    PlanningContext& context) {
  if (context.schedule().mode != ShardingMode::kZero3) return false;
  if (!context.has_sim()) RETURN_IF_ERROR(context.Resimulate());
  const Schedule start = context.schedule();
  const int64_t start_peak = context.sim().peak_bytes;
  const int64_t limit = std::max(context.budget(), start_peak);

  // Lent plans already tried (by lend level), to skip repeats.
  std::vector<Schedule> lent_plans;
  std::vector<bool> lent_repeat;
  const std::vector<Variant> variants = Variants();
  std::optional<size_t> best;
  Schedule best_schedule;
  SimResult best_sim;
  double pipeline_iteration_s = 0;
  for (size_t v = 0; v < variants.size(); ++v) {
    const Variant& variant = variants[v];
    PlanningContext trial(context.graph(), context.hw(), context.options());
    trial.schedule() = start;
    RETURN_IF_ERROR(trial.Resimulate());
    OffloadPass lend(OffloadPass::Role::kLend, variant.lend);
    RETURN_IF_ERROR(RunInner(lend, trial, name()));
    // Variants come in pairs per lend level: check the level once.
    if (variant.arrangement == UnshardPass::Arrangement::kSpread) {
      bool repeat = false;
      for (const Schedule& s : lent_plans)
        repeat = repeat || s == trial.schedule();
      lent_plans.push_back(trial.schedule());
      lent_repeat.push_back(repeat);
    }
    if (lent_repeat.back() && v >= 2) continue;
    for (const std::unique_ptr<PlanningPass>& pass :
         PassesAfterLend(variant.arrangement)) {
      RETURN_IF_ERROR(RunInner(*pass, trial, name()));
    }
    const SimResult& sim = trial.sim();
    if (v == 0) pipeline_iteration_s = sim.iteration_s;
    if (sim.peak_bytes > limit) continue;
    const double tie = kTie * std::max(sim.iteration_s, best_sim.iteration_s);
    const bool better = !best.has_value() ||
                        sim.iteration_s < best_sim.iteration_s - tie ||
                        (sim.iteration_s <= best_sim.iteration_s + tie &&
                         sim.peak_bytes < best_sim.peak_bytes);
    if (better) {
      best = v;
      best_schedule = trial.schedule();
      best_sim = sim;
    }
  }
  if (!best.has_value()) return false;

  if (context.explaining()) {
    // Plan the chosen variant again here, so its passes record their
    // decisions; deterministic, so it lands on best_schedule.
    const Variant& variant = variants[*best];
    OffloadPass lend(OffloadPass::Role::kLend, variant.lend);
    RETURN_IF_ERROR(RunInner(lend, context, name()));
    for (const std::unique_ptr<PlanningPass>& pass :
         PassesAfterLend(variant.arrangement)) {
      RETURN_IF_ERROR(RunInner(*pass, context, name()));
    }
    Decision d;
    d.kind = DecisionKind::kPass;
    d.what = absl::StrFormat(
        "chose %s (%.4f s) out of %d variants of offload-lend and unshard; "
        "the pipeline's fixed order gives %.4f s",
        VariantName(variant), context.sim().iteration_s, variants.size(),
        pipeline_iteration_s);
    context.decisions().Record(std::move(d), context.sim());
  }
  if (context.schedule() != best_schedule) {
    context.schedule() = std::move(best_schedule);
    RETURN_IF_ERROR(context.Resimulate());
  }
  return !(context.schedule() == start);
}

}  // namespace tandem
