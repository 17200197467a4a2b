// What a job did, step by step and rank by rank, kept for its report
// (coordinator/README.md, "Job report"). The planning manager keeps only
// what planning needs, and only while the job runs; the report also shows
// finished jobs, after a restart too. So the history is stored:
//   - each step, once every rank reported it: rank 0's loss, the slowest
//     rank's time, the largest exposed communication and peak, the schedule
//     version (StoredStep), written in batches (at most once a second per
//     job, when the job ends, and before it is read), not per step;
//   - each rank's profile windows in brief (StoredRankWindow): its
//     iteration, communication and exposed communication time and its peak,
//     written as they come (one per window).
// Thread-safe. No gRPC: protos in, status out.
#ifndef TANDEM_COORDINATOR_REPORT_JOB_HISTORY_H_
#define TANDEM_COORDINATOR_REPORT_JOB_HISTORY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/service/job_manager.h"
#include "coordinator/service/worker_manager.h"
#include "coordinator/store/job_store.h"
#include "tandem/v1/profile.pb.h"
#include "tandem/v1/worker_service.pb.h"

namespace tandem {

// A rank's profile window in brief: its collectives' run time (issue to
// done where the run time was not measured) and the part compute waited
// for, summed over the window's mean iteration.
StoredRankWindow SummarizeRankWindow(int32_t rank, const v1::Profile& profile);

// The worker manager's second listener (coordinator_server.cc), after the
// planning manager: it sees only the profiles planning accepted.
class JobHistory final : public WorkerEventListener {
 public:
  // Steps a job may have waiting for their last rank; older ones are
  // dropped first (a rank that stopped reporting leaves them incomplete).
  static constexpr size_t kMaxOpenSteps = 1024;
  // Complete steps held before they are written regardless of the clock.
  static constexpr size_t kMaxBufferedSteps = 512;
  // Rows of steps, and of rank windows, kept per job by default
  // (--max-history-rows-per-job; JobStore::ThinHistory thins older ones).
  static constexpr int64_t kDefaultMaxRows = 100000;

  // `jobs` (the world size of each job) and `store` must outlive it.
  // `now_s` is a monotonic clock in seconds (tests pass a fake one).
  // Each job keeps at most about `max_rows` (+ a quarter, between thinnings)
  // steps and as many rank windows.
  JobHistory(const JobManager* jobs, JobStore* store,
             std::function<double()> now_s = nullptr,
             int64_t max_rows = kDefaultMaxRows);
  JobHistory(const JobHistory&) = delete;
  JobHistory& operator=(const JobHistory&) = delete;

  // A rank's step. Unknown jobs are ignored; a failed write is dropped
  // (the history is for looking at; training goes on).
  void OnProgress(const std::string& job_id, int32_t rank,
                  const v1::IterationProgress& progress) override;
  // A rank's profile window, accepted by the planning manager. Always OK: a
  // failed write is dropped, as for steps.
  absl::Status OnProfile(const std::string& job_id, int32_t rank,
                         const v1::Profile& profile) override;
  // The job ended: writes what is buffered and forgets its open steps.
  void OnJobEnded(const std::string& job_id);

  // Everything stored for the job, what is buffered written first. Errors:
  // the store's.
  absl::StatusOr<std::vector<StoredStep>> Steps(const std::string& job_id);
  absl::StatusOr<std::vector<StoredRankWindow>> RankWindows(
      const std::string& job_id);

 private:
  struct OpenStep {
    std::set<int32_t> ranks;
    StoredStep step;
    bool has_rank0 = false;
  };
  struct JobSteps {
    int32_t world_size = 0;
    std::map<int64_t, OpenStep> open;
    std::vector<StoredStep> complete;
    double last_write_s = 0;
  };

  // Writes the job's complete steps: taken under mu_, written outside it,
  // under write_mu_, so that a reader that writes first sees every step a
  // concurrent writer took.
  absl::Status Write(const std::string& job_id);
  // Counts `rows` stored for the job; every max_rows / 4 of them, thins
  // its history in the store.
  void Added(const std::string& job_id, int64_t rows);

  const JobManager* jobs_;
  JobStore* store_;
  const std::function<double()> now_s_;
  const int64_t max_rows_;
  std::mutex write_mu_;
  std::mutex mu_;
  std::map<std::string, JobSteps> jobs_steps_;
  // Rows stored per job since its history was last thinned (or since this
  // coordinator started). Entries go with the job's end.
  std::map<std::string, int64_t> added_rows_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_REPORT_JOB_HISTORY_H_
