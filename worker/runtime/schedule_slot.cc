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
                                 int64_t not_before_iteration) {
  std::lock_guard<std::mutex> lock(mu_);
  if (schedule.version <= newest_version_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule v", schedule.version, " is not newer than v", newest_version_,
        " (active, pending or dropped); publish it with a higher version"));
  }
  newest_version_ = schedule.version;
  pending_ = std::make_shared<const Pending>(
      Pending{std::move(schedule), not_before_iteration});
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
    std::lock_guard<std::mutex> lock(mu_);
    pending_.reset();
    reported_.reset();
    return &active_;
  }
  if (reported_ == nullptr) return nullptr;
  const int64_t version = reports[0].pending_version;
  int64_t not_before = 0;
  for (const ScheduleReport& r : reports) {
    if (r.pending_version != version) return nullptr;
    not_before = std::max(not_before, r.not_before);
  }
  if (version != reported_->schedule.version || version <= active_.version ||
      next_iteration < not_before) {
    return nullptr;
  }
  active_ = reported_->schedule;
  std::lock_guard<std::mutex> lock(mu_);
  if (pending_ == reported_) pending_.reset();
  reported_.reset();
  return &active_;
}

}  // namespace tandem
