#include "coordinator/passes/pass_pipeline.h"

#include <chrono>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem {

std::vector<std::string> PassPipeline::PassNames() const {
  std::vector<std::string> names;
  for (const auto& pass : passes_) names.emplace_back(pass->name());
  return names;
}

absl::StatusOr<bool> PassPipeline::RunImpl(PlanningContext& context) {
  if (!context.has_sim()) RETURN_IF_ERROR(context.Resimulate());
  bool any_changed = false;
  for (const auto& pass : passes_) {
    PassRecord record;
    record.pass = std::string(pass->name());
    record.iteration_before_s = context.sim().iteration_s;
    record.peak_before_bytes = context.sim().peak_bytes;
    // A pass that builds the plan from nothing has no earlier peak to be
    // held to; only the finished plan is judged against the budget.
    const bool from_scratch = context.schedule().actions.empty() &&
                              context.schedule().persistent_param_ids.empty();
    context.set_peak_at_pass_start(from_scratch ? INT64_MAX
                                                : context.sim().peak_bytes);

    const size_t decisions_before = context.decisions().size();
    context.decisions().set_pass(record.pass);

    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<bool> changed = pass->Run(context);
    if (!changed.ok()) {
      return absl::Status(
          changed.status().code(),
          absl::StrCat(pass->name(), ": ", changed.status().message()));
    }
    if (*changed) RETURN_IF_ERROR(context.Resimulate());
    context.decisions().RecordRest(
        record.pass, *changed, context.decisions().size() > decisions_before,
        context.sim(), RestBinding(context.sim(), context.memory_target()));
    record.wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    record.changed = *changed;
    any_changed = any_changed || *changed;
    context.schedule().provenance.passes.push_back(record.pass);

    for (const auto& checker : checkers_) {
      absl::Status status = checker->Check(context);
      if (!status.ok()) {
        return absl::Status(status.code(),
                            absl::StrCat(checker->name(), " failed after ",
                                         pass->name(), ": ", status.message()));
      }
    }
    record.iteration_after_s = context.sim().iteration_s;
    record.peak_after_bytes = context.sim().peak_bytes;
    if (sink_ != nullptr) sink_->Record(record);
  }
  return any_changed;
}

}  // namespace tandem
