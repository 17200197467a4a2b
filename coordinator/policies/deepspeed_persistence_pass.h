// deepspeed-persistence: DeepSpeed ZeRO-3's param_persistence_threshold.
// Params with fewer elements than the threshold (default 1e5) are never
// partitioned: each rank keeps them whole, so they cost no all-gather and no
// release, at the price of their full bytes on every rank. Small params
// (norm weights, biases, MoE routers) would otherwise each pay a collective's
// latency several times an iteration for a few kilobytes. DeepCompile runs
// on ZeRO-3 and inherits the same default.
//
// Run it before zero3-insert, which leaves persistent params out of its
// groups; run later, it takes the params out of their groups itself.
#ifndef TANDEM_COORDINATOR_POLICIES_DEEPSPEED_PERSISTENCE_PASS_H_
#define TANDEM_COORDINATOR_POLICIES_DEEPSPEED_PERSISTENCE_PASS_H_

#include <cstdint>

#include "coordinator/passes/pass_interface.h"

namespace tandem {

class DeepSpeedPersistencePass : public PlanningPass {
 public:
  // DeepSpeed's default stage3_param_persistence_threshold.
  static constexpr int64_t kDefaultThresholdNumel = 100000;

  explicit DeepSpeedPersistencePass(
      int64_t threshold_numel = kDefaultThresholdNumel)
      : threshold_numel_(threshold_numel) {}

  absl::string_view name() const override { return "deepspeed-persistence"; }

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override;

 private:
  int64_t threshold_numel_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_POLICIES_DEEPSPEED_PERSISTENCE_PASS_H_
