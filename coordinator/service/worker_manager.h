// Workers of every job: registration (ranks and incarnations), one session
// per worker, heartbeats, and routing of what workers send (graphs, profiles,
// progress, schedule switches, errors) to the job and planning managers.
//
// A worker's life as the coordinator sees it:
//
//   Register ──> registered ──(Session hello)──> connected ──(stream ends)─┐
//       ^             ^                              |  ^                  │
//       │             └───────(reconnect, same incarnation)────────────────┘
//       │                                            │
//   (restart: new incarnation) ──> job FAILED if it was RUNNING
//                                                    │
//                          no message for heartbeat_timeout ──> job FAILED
//
// The job becomes RUNNING when every rank has registered and SUCCEEDED when
// every rank has reported its last step. No gRPC in here.
#ifndef TANDEM_COORDINATOR_SERVICE_WORKER_MANAGER_H_
#define TANDEM_COORDINATOR_SERVICE_WORKER_MANAGER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/service/coordinator_metrics.h"
#include "coordinator/service/job_manager.h"
#include "coordinator/service/kv_store.h"
#include "coordinator/service/planning_manager.h"
#include "coordinator/service/timeline_store.h"
#include "coordinator/store/job_store.h"
#include "tandem/v1/worker_service.pb.h"

namespace tandem {

// The downstream half of one worker's session; the gRPC layer implements it.
// Send may be called from any thread, also after the stream ended (the
// manager holds a reference): it then returns false.
class SessionSink {
 public:
  virtual ~SessionSink() = default;
  virtual bool Send(const v1::CoordinatorMessage& message) = 0;
};

class WorkerManager {
 public:
  struct Options {
    // A running job whose worker stays silent this long is failed.
    std::chrono::milliseconds heartbeat_timeout{15000};
    // How often the watcher looks.
    std::chrono::milliseconds watch_interval{250};
  };

  // Every pointer must outlive the manager; `metrics` and `timelines` may be
  // null (timelines are then refused).
  WorkerManager(JobManager* jobs, JobStore* store, PlanningManager* planning,
                KvStore* kv, CoordinatorMetrics* metrics,
                TimelineStore* timelines, Options options);
  ~WorkerManager();
  WorkerManager(const WorkerManager&) = delete;
  WorkerManager& operator=(const WorkerManager&) = delete;

  // Reloads registrations after a restart; silent workers get a full
  // heartbeat timeout from now to reconnect.
  absl::Status Recover();

  // Errors: NotFound (unknown job), FailedPrecondition (the job ended; the
  // worker should exit), InvalidArgument (no incarnation, rank out of
  // range), AlreadyExists (the rank belongs to another live worker),
  // ResourceExhausted (every rank is taken).
  absl::StatusOr<v1::RegisterResponse> Register(
      const v1::RegisterRequest& request);

  // Starts a session from its hello. Errors: NotFound (unknown job),
  // PermissionDenied (rank and incarnation not registered: an unknown or
  // restarted worker). Returns a session id for the calls below.
  absl::StatusOr<int64_t> OpenSession(const v1::SessionHello& hello,
                                      std::shared_ptr<SessionSink> sink);
  // Handles one upstream message. A rejected message comes back as an error
  // (InvalidArgument/FailedPrecondition) and changes nothing; the caller
  // tells the worker and keeps the session.
  absl::Status OnMessage(int64_t session, const v1::WorkerMessage& message);
  // The stream ended; the sink is no longer used.
  void CloseSession(int64_t session);

  // Sends to every connected worker of the job.
  void Broadcast(const std::string& job_id,
                 const v1::CoordinatorMessage& message);
  // The job ended: tells its workers to stop and frees its rendezvous keys.
  void OnJobEnded(const std::string& job_id, v1::JobState state);

  // Key prefix of a job's rendezvous keys.
  static std::string StorePrefix(const std::string& job_id);

 private:
  struct Rank {
    std::string incarnation;
    std::string hostname;
    std::string device;
    std::chrono::steady_clock::time_point last_seen;
    int64_t session = 0;  // 0: not connected
    std::shared_ptr<SessionSink> sink;
    int64_t step = 0;
    int64_t applied_version = 0;
    bool done = false;
  };
  struct JobWorkers {
    int32_t world = 0;
    int64_t total_steps = 0;
    std::map<int32_t, Rank> ranks;
    int64_t announced_version = 0;
    // The job ended: its connection gauges are gone and stay gone.
    bool ended = false;
  };
  struct Session {
    std::string job_id;
    int32_t rank = 0;
  };

  JobWorkers& Workers(const v1::Job& job);
  void WatchLoop();
  void UpdateConnectedMetric(const std::string& job_id, const JobWorkers& w);

  JobManager* jobs_;
  JobStore* store_;
  PlanningManager* planning_;
  KvStore* kv_;
  CoordinatorMetrics* metrics_;
  TimelineStore* timelines_;
  const Options options_;

  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::map<std::string, JobWorkers> jobs_workers_;
  std::map<int64_t, Session> sessions_;
  int64_t next_session_ = 1;
  // "heartbeat-watch": fails running jobs whose workers went silent.
  std::thread watcher_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_SERVICE_WORKER_MANAGER_H_
