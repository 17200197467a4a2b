#include "coordinator/report/job_history.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "common/status_macros.h"

namespace tandem {

StoredRankWindow SummarizeRankWindow(int32_t rank, const v1::Profile& profile) {
  StoredRankWindow w;
  w.rank = rank;
  w.schedule_version = profile.schedule_version();
  w.first_iteration = profile.first_iteration();
  w.last_iteration = profile.last_iteration();
  w.iteration_s = profile.iteration_s();
  w.peak_bytes = profile.peak_bytes();
  for (const v1::CollectiveTiming& c : profile.collectives()) {
    w.comm_s += c.run_s() > 0 ? c.run_s() : c.issue_to_done_s();
    w.exposed_comm_s += c.exposed_s();
  }
  return w;
}

JobHistory::JobHistory(const JobManager* jobs, JobStore* store,
                       std::function<double()> now_s, int64_t max_rows)
    : jobs_(jobs),
      store_(store),
      now_s_(now_s ? std::move(now_s)
                   : [] {
                       return std::chrono::duration<double>(
                                  std::chrono::steady_clock::now()
                                      .time_since_epoch())
                           .count();
                     }),
      max_rows_(std::max<int64_t>(max_rows, 4)) {}

void JobHistory::Added(const std::string& job_id, int64_t rows) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t& added = added_rows_[job_id];
    added += rows;
    if (added < max_rows_ / 4) return;
    added = 0;
  }
  // What is lost on failure is only the thinning: the next batch retries.
  (void)store_->ThinHistory(job_id, max_rows_);
}

void JobHistory::OnProgress(const std::string& job_id, int32_t rank,
                            const v1::IterationProgress& progress) {
  bool write = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_steps_.find(job_id);
    if (it == jobs_steps_.end()) {
      absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
      if (!job.ok()) return;
      it = jobs_steps_.try_emplace(job_id).first;
      it->second.world_size = std::max(1, job->spec().parallel().world_size());
      it->second.last_write_s = now_s_();
    }
    JobSteps& job = it->second;
    OpenStep& open = job.open[progress.step()];
    if (!open.ranks.insert(rank).second) return;  // a repeat
    StoredStep& s = open.step;
    s.step = progress.step();
    if (rank == 0 || !open.has_rank0) {
      s.loss = progress.loss();
      s.schedule_version = progress.schedule_version();
      open.has_rank0 = rank == 0;
    }
    s.iteration_s = std::max(s.iteration_s, progress.iteration_s());
    s.exposed_comm_s = std::max(s.exposed_comm_s, progress.exposed_comm_s());
    s.peak_bytes = std::max(s.peak_bytes, progress.peak_bytes());
    s.work = std::max(s.work, progress.work());
    if (progress.has_cpu_wait_share()) {
      s.cpu_wait_share = std::max(s.cpu_wait_share, progress.cpu_wait_share());
    }
    const bool completed =
        static_cast<int32_t>(open.ranks.size()) >= job.world_size;
    if (completed) {
      job.complete.push_back(s);
      // Steps before it that some rank never reported stay incomplete.
      job.open.erase(job.open.begin(),
                     std::next(job.open.find(progress.step())));
    }
    while (job.open.size() > kMaxOpenSteps) job.open.erase(job.open.begin());
    // Written when a step completes, so that a batch ends with it.
    write = completed && (job.complete.size() >= kMaxBufferedSteps ||
                          now_s_() - job.last_write_s >= 1.0);
  }
  if (write) (void)Write(job_id);
}

absl::Status JobHistory::OnProfile(const std::string& job_id, int32_t rank,
                                   const v1::Profile& profile) {
  if (store_->PutRankWindow(job_id, SummarizeRankWindow(rank, profile)).ok()) {
    Added(job_id, 1);
  }
  return absl::OkStatus();
}

void JobHistory::OnJobEnded(const std::string& job_id) {
  (void)Write(job_id);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_steps_.find(job_id);
  if (it != jobs_steps_.end() && it->second.complete.empty()) {
    jobs_steps_.erase(it);
  }
  added_rows_.erase(job_id);
}

absl::Status JobHistory::Write(const std::string& job_id) {
  std::lock_guard<std::mutex> write_lock(write_mu_);
  std::vector<StoredStep> steps;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_steps_.find(job_id);
    if (it == jobs_steps_.end()) return absl::OkStatus();
    steps.swap(it->second.complete);
    it->second.last_write_s = now_s_();
  }
  RETURN_IF_ERROR(store_->PutSteps(job_id, steps));
  Added(job_id, static_cast<int64_t>(steps.size()));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StoredStep>> JobHistory::Steps(
    const std::string& job_id) {
  if (absl::Status s = Write(job_id); !s.ok()) return s;
  return store_->LoadSteps(job_id);
}

absl::StatusOr<std::vector<StoredRankWindow>> JobHistory::RankWindows(
    const std::string& job_id) {
  return store_->LoadRankWindows(job_id);
}

}  // namespace tandem
