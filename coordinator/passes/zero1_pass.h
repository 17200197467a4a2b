// zero1: the plan of a ZeRO-1 job (LowerZero1 in common/lowering/lowering.h,
// which the worker starts ZeRO-1 jobs on): every param replicated, gradients
// reduce-scattered in buckets during backward, updated params all-gathered
// after the optimizer. Replaces whatever the schedule held (mode, groups,
// persistent set, offloads, actions); offload may run after it when the
// states do not fit.
#ifndef TANDEM_COORDINATOR_PASSES_ZERO1_PASS_H_
#define TANDEM_COORDINATOR_PASSES_ZERO1_PASS_H_

#include <cstdint>

#include "common/lowering/lowering.h"
#include "coordinator/passes/pass_interface.h"

namespace tandem {

class Zero1Pass : public PlanningPass {
 public:
  static constexpr int64_t kDefaultBucketBytes = kDefaultZero1BucketBytes;

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
