#include "worker/runtime/schedule_slot.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem {

ScheduleSlot::ScheduleSlot(Schedule initial, std::optional<Schedule> fallback)
    : newest_version_(initial.version),
      active_(std::move(initial)),
      fallback_(std::move(fallback)) {}

absl::Status ScheduleSlot::Offer(Schedule schedule,
                                 int64_t not_before_iteration,
                                 std::optional<Schedule> incumbent,
                                 int64_t block_steps, int64_t block_pairs) {
  if (incumbent.has_value()) {
    if (block_steps < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule v", schedule.version, " alternates with v",
                       incumbent->version, " in blocks of ", block_steps,
                       " steps; a block is at least 1 step"));
    }
    if (incumbent->version >= schedule.version) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule v", schedule.version, " alternates with v",
                       incumbent->version,
                       ", which is not older; the incumbent is a "
                       "version that ran before"));
    }
    if (block_pairs < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule v", schedule.version, " alternates for ", block_pairs,
          " block pairs; 0 (until a newer schedule) or more"));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (schedule.version <= newest_version_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule v", schedule.version, " is not newer than v", newest_version_,
        " (active, pending or dropped); publish it with a higher version"));
  }
  newest_version_ = schedule.version;
  pending_ = std::make_shared<const Pending>(
      Pending{std::move(schedule), not_before_iteration, std::move(incumbent),
              block_steps, block_pairs});
  return absl::OkStatus();
}

ScheduleReport ScheduleSlot::Report(bool near_budget) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    reported_ = pending_;
  }
  ScheduleReport report;
  report.near_budget = near_budget;
  if (reported_ != nullptr) {
    report.pending_version = reported_->schedule.version;
    report.not_before = reported_->not_before;
  }
  return report;
}

const Schedule* ScheduleSlot::Agree(absl::Span<const ScheduleReport> reports,
                                    int64_t next_iteration) {
  if (reports.empty()) return nullptr;
  const bool near =
      std::any_of(reports.begin(), reports.end(),
                  [](const ScheduleReport& r) { return r.near_budget; });
  if (near && fallback_.has_value() && !fallback_active()) {
    active_ = *fallback_;
    alternation_.reset();
    std::lock_guard<std::mutex> lock(mu_);
    pending_.reset();
    reported_.reset();
    return &active_;
  }
  if (const Schedule* next = AgreePending(reports, next_iteration)) {
    return next;
  }
  if (!alternation_.has_value()) return nullptr;
  const Alternation& a = *alternation_;
  if (a.end > 0 && next_iteration >= a.end) {
    // Done: the candidate runs on.
    const bool switched = active_.version != a.candidate.version;
    if (switched) active_ = a.candidate;
    alternation_.reset();
    return switched ? &active_ : nullptr;
  }
  const bool candidate_turn =
      ((next_iteration - a.start) / a.block_steps) % 2 == 0;
  const Schedule& turn = candidate_turn ? a.candidate : a.incumbent;
  if (turn.version == active_.version) return nullptr;
  active_ = turn;
  return &active_;
}

const Schedule* ScheduleSlot::AgreePending(
    absl::Span<const ScheduleReport> reports, int64_t next_iteration) {
  if (reported_ == nullptr) return nullptr;
  const int64_t version = reports[0].pending_version;
  int64_t not_before = 0;
  for (const ScheduleReport& r : reports) {
    if (r.pending_version != version) return nullptr;
    not_before = std::max(not_before, r.not_before);
  }
  if (version != reported_->schedule.version || version <= current_version() ||
      next_iteration < not_before) {
    return nullptr;
  }
  active_ = reported_->schedule;
  if (reported_->incumbent.has_value()) {
    const int64_t block = reported_->block_steps;
    alternation_ = Alternation{
        reported_->schedule, *reported_->incumbent, next_iteration, block,
        reported_->block_pairs > 0
            ? next_iteration + 2 * block * reported_->block_pairs
            : 0};
  } else {
    alternation_.reset();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (pending_ == reported_) pending_.reset();
  reported_.reset();
  return &active_;
}

}  // namespace tandem
