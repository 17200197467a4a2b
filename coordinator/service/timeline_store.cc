#include "coordinator/service/timeline_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace tandem {

TimelineStore::TimelineStore(std::function<double()> now_unix_s)
    : now_unix_s_(now_unix_s ? std::move(now_unix_s) : [] {
        return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
      }) {}

absl::Status TimelineStore::Put(const std::string& job_id, int32_t rank,
                                const v1::TimelineReport& report) {
  const std::string& trace = report.trace_json();
  if (rank < 0 || report.step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeline from rank ", rank, " has a negative step"));
  }
  if (trace.empty() || trace.size() > kMaxTraceBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "timeline from rank ", rank, " is ", trace.size(),
        " bytes; send one non-empty trace of at most ", kMaxTraceBytes));
  }
  const size_t first = trace.find_first_not_of(" \t\r\n");
  const size_t last = trace.find_last_not_of(" \t\r\n");
  if (trace[first] != '{' || trace[last] != '}') {
    return absl::InvalidArgumentError(absl::StrCat(
        "timeline from rank ", rank,
        " is not a JSON object; send a Chrome trace ({\"traceEvents\": ...})"));
  }
  v1::RankTimeline t;
  t.set_rank(rank);
  t.set_step(report.step());
  t.set_schedule_version(report.schedule_version());
  t.set_trace_json(trace);
  t.set_received_unix_s(now_unix_s_());
  // Written outside the lock: readers of other jobs need not wait for it.
  absl::Status stored =
      store_ != nullptr ? store_->PutTimeline(job_id, t) : absl::OkStatus();
  absl::MutexLock lock(&mu_);
  jobs_[job_id][rank] = std::move(t);
  order_.remove(job_id);
  order_.push_back(job_id);
  while (order_.size() > kMaxJobs) {
    jobs_.erase(order_.front());
    order_.pop_front();
  }
  return stored;
}

absl::StatusOr<std::vector<v1::RankTimeline>> TimelineStore::Get(
    const std::string& job_id, const std::vector<int32_t>& ranks) const {
  std::vector<v1::RankTimeline> all;
  bool in_memory = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it != jobs_.end()) {
      in_memory = true;
      for (const auto& [rank, timeline] : it->second) all.push_back(timeline);
    }
  }
  if (!in_memory && store_ != nullptr) {
    absl::StatusOr<std::vector<v1::RankTimeline>> stored =
        store_->LoadTimelines(job_id);
    if (!stored.ok()) return stored.status();
    all = *std::move(stored);
  }
  std::vector<v1::RankTimeline> out;
  for (v1::RankTimeline& timeline : all) {
    if (ranks.empty() ||
        std::find(ranks.begin(), ranks.end(), timeline.rank()) != ranks.end()) {
      out.push_back(std::move(timeline));
    }
  }
  if (out.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no timeline of job ", job_id,
        ranks.empty() ? "" : absl::StrCat(" rank ", absl::StrJoin(ranks, ",")),
        " yet: ranks send one with each profile window (after "
        "optimize.warmup_steps steps) and at their last step"));
  }
  return out;
}

}  // namespace tandem
