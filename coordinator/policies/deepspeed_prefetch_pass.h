// deepspeed-prefetch: DeepSpeed ZeRO-3's parameter coordinator
// (PartitionedParameterCoordinator) with its default knobs, on a plan of one
// gather group per param (run split-groups first).
//
// Prefetch. DeepSpeed traces the order params are fetched in during the
// first iteration; afterwards each module fetch first gathers the module's
// own params (popping them off the trace queue) and waits for them, then pops
// upcoming fetches off the queue in use order and gathers the params not
// already gathered, while the elements it prefetches at this fetch stay under
// the prefetch bucket (5e7) and under the headroom of max_live_parameters
// (1e9 gathered elements, in flight included).
//
// Release. After a module runs, each of its params is released unless it is
// used again within the next max_reuse_distance elements of the trace (1e9;
// the params of the modules that follow, in order), or the prefetcher popped
// a later fetch of it while it was gathered (DeepSpeed then keeps it rather
// than lose that fetch). A param kept gathered skips its next gather.
//
// In the IR: every forward and backward node is a module fetch; the trace is
// the incoming plan's ALLGATHERs in program order, and it and the reuse
// window stop at the end of the micro-batch (DeepSpeed resets each step). A
// prefetched ALLGATHER is issued after the fetching node's WAITs, its WAIT
// staying before its use; a release that is skipped removes that RELEASE and
// the next ALLGATHER and WAIT of the group. Not modelled: coalescing one
// fetch's params into one collective.
#ifndef TANDEM_COORDINATOR_POLICIES_DEEPSPEED_PREFETCH_PASS_H_
#define TANDEM_COORDINATOR_POLICIES_DEEPSPEED_PREFETCH_PASS_H_

#include <cstdint>

#include "coordinator/passes/pass_interface.h"

namespace tandem {

class DeepSpeedPrefetchPass : public PlanningPass {
 public:
  // DeepSpeed's defaults: stage3_prefetch_bucket_size,
  // stage3_max_live_parameters and stage3_max_reuse_distance.
  static constexpr int64_t kDefaultBucketNumel = 50000000;
  static constexpr int64_t kDefaultMaxLiveNumel = 1000000000;
  static constexpr int64_t kDefaultMaxReuseNumel = 1000000000;

  explicit DeepSpeedPrefetchPass(
      int64_t bucket_numel = kDefaultBucketNumel,
      int64_t max_live_numel = kDefaultMaxLiveNumel,
      int64_t max_reuse_numel = kDefaultMaxReuseNumel)
      : bucket_numel_(bucket_numel),
        max_live_numel_(max_live_numel),
        max_reuse_numel_(max_reuse_numel) {}

  absl::string_view name() const override { return "deepspeed-prefetch"; }

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override;

 private:
  int64_t bucket_numel_;
  int64_t max_live_numel_;
  int64_t max_reuse_numel_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_POLICIES_DEEPSPEED_PREFETCH_PASS_H_
