// The active schedule and the one waiting to take effect, with the rule by
// which all ranks agree on the iteration where it does (worker/README.md,
// "Runtime rules": "A new schedule takes effect at an iteration boundary that
// every rank agrees on; no rank mixes two schedules in one iteration").
//
// Every iteration ends with one small all-gather of each rank's Report() (the
// executor folds it into the loss and gradient-norm exchange, so agreement
// costs no extra collective). Every rank then calls Agree() with the same
// reports and reaches the same decision: switch to version v when every rank
// holds v pending, v is newer than the active one, and the next iteration is
// at least every rank's not_before. A rank that receives v late only delays
// the switch; it never splits it.
//
// No libtorch: the agreement rule is tested in isolation.
#ifndef TANDEM_WORKER_RUNTIME_SCHEDULE_SLOT_H_
#define TANDEM_WORKER_RUNTIME_SCHEDULE_SLOT_H_

#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/ir/schedule.h"

namespace tandem {

struct ScheduleReport {
  // Version of the pending schedule, 0 when none.
  int64_t pending_version = 0;
  int64_t not_before = 0;
};

class ScheduleSlot {
 public:
  explicit ScheduleSlot(Schedule initial);

  // Thread-safe (the agent's session thread offers while the compute thread
  // trains). Replaces an older pending schedule. Errors: InvalidArgument when
  // the version is not newer than the active and the pending ones.
  absl::Status Offer(Schedule schedule, int64_t not_before_iteration);

  // What this rank reports at the iteration boundary. Remembers the pending
  // schedule it reported, so a newer Offer between Report and Agree cannot
  // make this rank decide differently from the others.
  ScheduleReport Report();

  // Given every rank's report (in rank order, identical on every rank) at
  // the boundary before `next_iteration`, switches when all agree. Returns
  // the newly active schedule, or nullptr when nothing changes.
  const Schedule* Agree(absl::Span<const ScheduleReport> reports,
                        int64_t next_iteration);

  // Only the compute thread calls these; the active schedule changes only in
  // Agree.
  const Schedule& active() const { return active_; }

 private:
  struct Pending {
    Schedule schedule;
    int64_t not_before = 0;
  };
  mutable std::mutex mu_;
  std::shared_ptr<const Pending> pending_;  // guarded by mu_
  int64_t active_version_;                  // guarded by mu_
  // Compute thread only.
  std::shared_ptr<const Pending> reported_;
  Schedule active_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_SCHEDULE_SLOT_H_
