#include "coordinator/passes/zero1_pass.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/bytes.h"
#include "common/sim/simulator.h"
#include "common/status_macros.h"

namespace tandem {

absl::StatusOr<bool> Zero1Pass::RunImpl(PlanningContext& context) {
  Schedule& schedule = context.schedule();
  Schedule lowered = LowerZero1(context.graph(), bucket_bytes_);
  const bool changed =
      schedule.mode != lowered.mode || !(schedule.groups == lowered.groups) ||
      !(schedule.actions == lowered.actions) ||
      schedule.persistent_param_ids != lowered.persistent_param_ids ||
      !schedule.offloads.empty();
  schedule.mode = lowered.mode;
  schedule.groups = std::move(lowered.groups);
  schedule.actions = std::move(lowered.actions);
  schedule.persistent_param_ids = std::move(lowered.persistent_param_ids);
  schedule.offloads.clear();
  if (context.explaining()) {
    ASSIGN_OR_RETURN(SimResult sim,
                     Simulate(context.graph(), schedule, context.hw()));
    int buckets = 0;
    for (const Action& a : schedule.actions) {
      if (a.kind == ActionKind::kReduceScatter) ++buckets;
    }
    Decision d;
    d.kind = DecisionKind::kZero1Buckets;
    d.what = absl::StrCat("gradients reduce-scattered in ", buckets,
                          " buckets of about ", FormatBytesShort(bucket_bytes_),
                          " during backward");
    if (sim.exposed_comm_s > 0) d.binding.kind = BindingKind::kLink;
    context.decisions().Record(std::move(d), sim);
  }
  return changed;
}

}  // namespace tandem
