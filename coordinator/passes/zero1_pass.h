// zero1: the plan of a ZeRO-1 job, which shards only the optimizer states.
// Every param is replicated (persistent), so forward and backward gather
// nothing. Gradients are reduced in buckets of about bucket_bytes of
// gradient, filled in the order backward completes them; each bucket is
// reduce-scattered to the optimizer-shard owners right after the backward
// node that completes its last gradient, so the reduction overlaps the rest
// of backward (DDP's bucketing, with reduce-scatter instead of all-reduce).
// After the optimizer node every rank all-gathers the updated params, in
// groups of bucket size, all issued before any is waited for so they run
// back to back, and waits for them before the iteration ends.
//
// Replaces whatever the schedule held (mode, groups, persistent set,
// offloads, actions); offload may run after it when the states do not fit.
#ifndef TANDEM_COORDINATOR_PASSES_ZERO1_PASS_H_
#define TANDEM_COORDINATOR_PASSES_ZERO1_PASS_H_

#include <cstdint>

#include "coordinator/passes/pass_interface.h"

namespace tandem {

class Zero1Pass : public PlanningPass {
 public:
  // 32 MiB: DDP's 25 MB default pays a collective's latency more often on
  // large models; past ~50 MB the last bucket overlaps too little.
  static constexpr int64_t kDefaultBucketBytes = int64_t{32} << 20;

  explicit Zero1Pass(int64_t bucket_bytes = kDefaultBucketBytes)
      : bucket_bytes_(bucket_bytes > 0 ? bucket_bytes : kDefaultBucketBytes) {}

  absl::string_view name() const override { return "zero1"; }
  int64_t bucket_bytes() const { return bucket_bytes_; }

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override;

 private:
  int64_t bucket_bytes_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PASSES_ZERO1_PASS_H_
