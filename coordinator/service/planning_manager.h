// Turns what workers measure into schedules: collects each rank's profile
// windows, aggregates them across ranks (time: the slowest rank; memory: the
// largest), plans on its own thread (never on an RPC thread), persists every
// schedule version and hands it to a publisher that pushes it to all ranks.
// It also watches each iteration for drift (DriftDetector) and re-plans on
// drift, memory pressure or a Reoptimize call, recording the reason.
//
// When a plan is made:
//   - "initial": the first complete window after the job's warm-up steps;
//   - "drift" / "memory": the first complete window after the detector
//     fired (measured under the schedule that drifted);
//   - "reoptimize": right away, from the latest aggregated window.
// A failed plan is an event; the job keeps its current schedule.
#ifndef TANDEM_COORDINATOR_SERVICE_PLANNING_MANAGER_H_
#define TANDEM_COORDINATOR_SERVICE_PLANNING_MANAGER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/ir/graph.h"
#include "common/ir/profile.h"
#include "coordinator/service/coordinator_metrics.h"
#include "coordinator/service/drift_detector.h"
#include "coordinator/service/job_manager.h"
#include "coordinator/store/job_store.h"
#include "tandem/v1/worker_service.pb.h"

namespace tandem {

class PlanningManager {
 public:
  // Pushes a new schedule to every rank of a job.
  using Publisher = std::function<void(const std::string& job_id,
                                       const v1::ScheduleUpdate& update)>;

  // Bounds on what one profile may hold, against oversized messages.
  static constexpr int kMaxProfileEntries = 200000;
  // Profiles held per rank while rank 0's graph is on its way.
  static constexpr int kMaxEarlyProfilesPerRank = 4;
  // Steps between the newest step any rank reported and the step a new
  // schedule takes effect: time for it to reach every rank.
  static constexpr int64_t kSwitchLeadSteps = 2;

  // `jobs`, `store` and `metrics` (nullable) must outlive the manager.
  PlanningManager(JobManager* jobs, JobStore* store,
                  CoordinatorMetrics* metrics);
  ~PlanningManager();
  PlanningManager(const PlanningManager&) = delete;
  PlanningManager& operator=(const PlanningManager&) = delete;

  void SetPublisher(Publisher publisher);
  // Reloads graphs and schedules of unfinished jobs after a restart.
  absl::Status Recover();

  // Rank 0 reports the graph; every rank its hash. Errors:
  // InvalidArgument for a malformed graph (the message says what is wrong),
  // FailedPrecondition for a hash that differs from rank 0's (the job is
  // failed: its ranks run different models).
  absl::Status OnGraph(const std::string& job_id, int32_t rank,
                       const v1::GraphReport& report);
  // Errors: InvalidArgument for a profile that is too large, not for this
  // job's graph, or has negative/NaN values; FailedPrecondition when more
  // profiles than kMaxEarlyProfilesPerRank per rank arrive before the graph
  // (they are held until it comes, then checked). Nothing is recorded on
  // error.
  absl::Status OnProfile(const std::string& job_id, int32_t rank,
                         const v1::Profile& profile);
  void OnProgress(const std::string& job_id, int32_t rank,
                  const v1::IterationProgress& progress);
  // All ranks switched to `version`.
  void OnScheduleActive(const std::string& job_id, int64_t version);
  // Plans now (reason "reoptimize" unless given); returns the version that
  // will be planned. FailedPrecondition when the job has no profile yet.
  absl::StatusOr<int64_t> RequestReplan(const std::string& job_id,
                                        const std::string& reason);

  // The schedule `version` of a job (0: the newest). NotFound when none.
  absl::StatusOr<StoredSchedule> GetSchedule(const std::string& job_id,
                                             int64_t version) const;
  // Forgets a finished job's in-memory state.
  void Forget(const std::string& job_id);
  // Blocks until no plan is queued or running (tests, shutdown).
  void Drain();

 private:
  struct JobPlanning {
    v1::JobSpec spec;
    std::optional<Graph> graph;
    std::string graph_hash;
    // Hashes and profiles reported before rank 0's graph arrived.
    std::map<int32_t, std::string> early_hashes;
    std::vector<std::pair<int32_t, Profile>> early_profiles;
    // (first, last) -> rank -> profile.
    std::map<std::pair<int64_t, int64_t>, std::map<int32_t, Profile>> windows;
    std::optional<Profile> latest;
    std::vector<StoredSchedule> schedules;
    std::unique_ptr<DriftDetector> drift;
    // step -> (slowest iteration_s, largest peak, ranks reported).
    std::map<int64_t, std::tuple<double, int64_t, int>> steps;
    int64_t max_step = 0;
    std::string pending_reason;
    bool queued = false;
  };

  JobPlanning& State(const std::string& job_id, const v1::Job& job);
  // Validates `profile` against the job's graph and adds it to its window,
  // planning when the window completes. Requires mu_ and the graph.
  absl::Status AcceptProfileLocked(const std::string& job_id,
                                   JobPlanning& state, int32_t rank,
                                   Profile profile);
  // Queues a plan for the job. Requires mu_.
  void QueueLocked(const std::string& job_id, JobPlanning& state,
                   const std::string& reason);
  void PlannerLoop();
  void PlanOne(const std::string& job_id, const std::string& reason);
  void Fail(const std::string& job_id, const std::string& message);

  JobManager* jobs_;
  JobStore* store_;
  CoordinatorMetrics* metrics_;
  Publisher publisher_;

  mutable std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable idle_;
  std::map<std::string, JobPlanning> state_;
  std::deque<std::pair<std::string, std::string>> queue_;  // job, reason
  bool busy_ = false;
  bool stop_ = false;
  // "planner": runs the pass pipelines so RPC threads never wait on them.
  std::thread planner_;
};

// The pipeline named by a job's optimize.passes, with every invariant
// checker. InvalidArgument for an unknown pass name.
absl::StatusOr<std::unique_ptr<class PassPipeline>> BuildPipelineFromNames(
    const std::vector<std::string>& names, class PassRecordSink* sink);

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_SERVICE_PLANNING_MANAGER_H_
