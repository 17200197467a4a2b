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
// The memory guard (worker/README.md, "Memory guard"): the slot may hold a
// fallback, the least-memory schedule (common/lowering/least_memory.h). When
// any rank's report says its peak came near the budget, every rank switches
// to the fallback at that boundary, whatever is pending, and drops the
// pending schedule (planned before the guard tripped); the coordinator's next
// plan, newer than every version seen, replaces the fallback the usual way.
//
// A comparison (coordinator/README.md, "Decisions under noise"): a schedule
// offered with an incumbent alternates with it in blocks of `block_steps`
// iterations, the offered one first, from the iteration every rank switched
// to it. Which one runs is a function of the iteration alone, so every rank
// switches at the same boundaries without another exchange. It ends after
// `block_pairs` pairs (the offered schedule then runs on; 0: no end), when
// a newer offer takes effect, or when the memory guard trips.
//
// No libtorch: the agreement rule is tested in isolation.
#ifndef TANDEM_WORKER_RUNTIME_SCHEDULE_SLOT_H_
#define TANDEM_WORKER_RUNTIME_SCHEDULE_SLOT_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/ir/schedule.h"

namespace tandem {

struct ScheduleReport {
  // Version of the pending schedule, 0 when none.
  int64_t pending_version = 0;
  int64_t not_before = 0;
  // This rank's peak came within the guard band of the budget (or over it).
  bool near_budget = false;
};

class ScheduleSlot {
 public:
  // `fallback`, when given, is what the memory guard switches to; its
  // version must differ from every published one (kLeastMemoryVersion).
  explicit ScheduleSlot(Schedule initial,
                        std::optional<Schedule> fallback = std::nullopt);

  // Thread-safe (the agent's session thread offers while the compute thread
  // trains). Replaces an older pending schedule. Errors: InvalidArgument when
  // the version is not newer than every version the slot has held or been
  // offered (active, pending, or dropped when the guard tripped), or when an
  // incumbent is given with `block_steps` < 1 or a version not older than
  // the schedule's.
  // With `incumbent`: the two alternate once the schedule takes effect, for
  // `block_pairs` block pairs (0: until a newer schedule).
  absl::Status Offer(Schedule schedule, int64_t not_before_iteration,
                     std::optional<Schedule> incumbent = std::nullopt,
                     int64_t block_steps = 0, int64_t block_pairs = 0);

  // What this rank reports at the iteration boundary; `near_budget` is the
  // executor's guard verdict for this rank. Remembers the pending schedule
  // it reported, so a newer Offer between Report and Agree cannot make this
  // rank decide differently from the others.
  ScheduleReport Report(bool near_budget = false);

  // Given every rank's report (in rank order, identical on every rank) at
  // the boundary before `next_iteration`, switches when all agree, or to the
  // fallback when any rank is near the budget and the fallback is held and
  // not active, or to the other schedule of a comparison at the end of a
  // block. Returns the newly active schedule, or nullptr when nothing
  // changes.
  const Schedule* Agree(absl::Span<const ScheduleReport> reports,
                        int64_t next_iteration);

  // Only the compute thread calls these; the active schedule changes only in
  // Agree.
  const Schedule& active() const { return active_; }
  bool has_fallback() const { return fallback_.has_value(); }
  // The fallback, or nullptr.
  const Schedule* fallback() const {
    return fallback_.has_value() ? &*fallback_ : nullptr;
  }
  bool fallback_active() const {
    return fallback_.has_value() && active_.version == fallback_->version;
  }
  // A comparison is running (the active schedule is one of its two).
  bool alternating() const { return alternation_.has_value(); }

 private:
  struct Pending {
    Schedule schedule;
    int64_t not_before = 0;
    std::optional<Schedule> incumbent;
    int64_t block_steps = 0;
    int64_t block_pairs = 0;
  };
  struct Alternation {
    Schedule candidate;
    Schedule incumbent;
    int64_t start = 0;
    int64_t block_steps = 1;
    // The iteration the candidate runs on from (0: none).
    int64_t end = 0;
  };
  // The agreed pending schedule, when every rank reported it and it may
  // take effect at `next_iteration`; else nullptr.
  const Schedule* AgreePending(absl::Span<const ScheduleReport> reports,
                               int64_t next_iteration);
  // The newest version that took effect: a comparison's candidate while it
  // runs, else the active one.
  int64_t current_version() const {
    return alternation_.has_value() ? alternation_->candidate.version
                                    : active_.version;
  }
  mutable std::mutex mu_;
  std::shared_ptr<const Pending> pending_;  // guarded by mu_
  // The newest version held or offered, the fallback's aside.
  int64_t newest_version_;  // guarded by mu_
  // Compute thread only.
  std::shared_ptr<const Pending> reported_;
  Schedule active_;
  std::optional<Alternation> alternation_;
  const std::optional<Schedule> fallback_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_SCHEDULE_SLOT_H_
