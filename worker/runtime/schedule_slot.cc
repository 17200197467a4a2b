#include "worker/runtime/schedule_slot.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem {

ScheduleSlot::ScheduleSlot(Schedule initial)
    : active_version_(initial.version), active_(std::move(initial)) {}

absl::Status ScheduleSlot::Offer(Schedule schedule,
                                 int64_t not_before_iteration) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t newest =
      pending_ != nullptr
          ? std::max(pending_->schedule.version, active_version_)
          : active_version_;
  if (schedule.version <= newest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule v", schedule.version, " is not newer than v", newest,
        " (active or pending); publish it with a higher version"));
  }
  pending_ = std::make_shared<const Pending>(
      Pending{std::move(schedule), not_before_iteration});
  return absl::OkStatus();
}

ScheduleReport ScheduleSlot::Report() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    reported_ = pending_;
  }
  if (reported_ == nullptr) return {};
  return {reported_->schedule.version, reported_->not_before};
}

const Schedule* ScheduleSlot::Agree(absl::Span<const ScheduleReport> reports,
                                    int64_t next_iteration) {
  if (reports.empty() || reported_ == nullptr) return nullptr;
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
  active_version_ = active_.version;
  return &active_;
}

}  // namespace tandem
