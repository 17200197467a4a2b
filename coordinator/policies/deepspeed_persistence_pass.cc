#include "coordinator/policies/deepspeed_persistence_pass.h"

#include <vector>

#include "coordinator/policies/program_memory.h"

namespace tandem {

absl::StatusOr<bool> DeepSpeedPersistencePass::RunImpl(
    PlanningContext& context) {
  if (context.schedule().mode != ShardingMode::kZero3) return false;
  std::vector<int32_t> small;
  for (const Param& param : context.graph().params) {
    if (param.numel() < threshold_numel_) small.push_back(param.id);
  }
  return MakePersistent(small, context.schedule());
}

}  // namespace tandem
