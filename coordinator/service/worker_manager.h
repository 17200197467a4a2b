// Workers of every job: registration (ranks and incarnations), one session
// per worker, and heartbeats. Job lifecycle (RUNNING, SUCCEEDED, FAILED on a
// fatal error or a silent worker) goes to the job manager; what concerns
// planning (registrations, graphs, profiles, progress, schedule switches) is
// reported to WorkerEventListeners, which the server wires: the planning
// manager, then the job history. The managers never hold each other.
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
// The job becomes RUNNING when every rank has registered and opened its
// session, and SUCCEEDED when every rank has reported its last step. No gRPC in
// here.
#ifndef TANDEM_COORDINATOR_SERVICE_WORKER_MANAGER_H_
#define TANDEM_COORDINATOR_SERVICE_WORKER_MANAGER_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/service/coordinator_metrics.h"
#include "coordinator/service/job_manager.h"
#include "coordinator/service/kv_store.h"
#include "coordinator/service/timeline_store.h"
#include "coordinator/store/job_store.h"
#include "tandem/v1/job_service.pb.h"
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

// What the worker manager reports about a job's workers. Called on RPC
// threads, outside the manager's lock, for ranks that registered; a listener
// overrides what it uses (the defaults accept and ignore). An error from
// OnGraph or OnProfile is the worker's message being rejected: it goes back
// to that worker, and the session goes on.
class WorkerEventListener {
 public:
  virtual ~WorkerEventListener() = default;
  // A rank registered (again, after a reconnect) on `hostname` with
  // `device`, which has `device_memory_bytes` for it (0: unknown).
  virtual void OnRankRegistered(const std::string& job_id, int32_t rank,
                                const std::string& hostname,
                                const std::string& device,
                                int64_t device_memory_bytes) {}
  // Rank 0 sends the graph, every rank its hash.
  virtual absl::Status OnGraph(const std::string& job_id, int32_t rank,
                               const v1::GraphReport& report) {
    return absl::OkStatus();
  }
  virtual absl::Status OnProfile(const std::string& job_id, int32_t rank,
                                 const v1::Profile& profile) {
    return absl::OkStatus();
  }
  // A finished iteration (already checked: finite, non-negative).
  virtual void OnProgress(const std::string& job_id, int32_t rank,
                          const v1::IterationProgress& progress) {}
  // Every rank switched to schedule `version` (once per version).
  virtual void OnScheduleActive(const std::string& job_id, int64_t version) {}
  // The memory guard switched every rank to the least-memory schedule from
  // `step` (each rank reports it; `reason` is the rank's account).
  // `tripped_version`: the version the step that came near the budget ran
  // (ScheduleApplied.tripped_version; nullopt from a worker that does not
  // say).
  virtual void OnMemoryGuard(const std::string& job_id, int32_t rank,
                             int64_t step,
                             std::optional<int64_t> tripped_version,
                             const std::string& reason) {}
  // The job resumes at another world size (restart.min_world): its graph,
  // profiles and schedules were for the old one.
  virtual void OnWorldChanged(const std::string& job_id) {}
};

// Listeners called in the order added. For OnGraph and OnProfile the first
// error stops the rest and is the answer: a later listener sees only what
// every earlier one accepted (the job history, only the profiles the
// planning manager took).
class WorkerEventFanOut final : public WorkerEventListener {
 public:
  void Add(WorkerEventListener* listener) { listeners_.push_back(listener); }
  void Clear() { listeners_.clear(); }

  void OnRankRegistered(const std::string& job_id, int32_t rank,
                        const std::string& hostname, const std::string& device,
                        int64_t device_memory_bytes) override;
  absl::Status OnGraph(const std::string& job_id, int32_t rank,
                       const v1::GraphReport& report) override;
  absl::Status OnProfile(const std::string& job_id, int32_t rank,
                         const v1::Profile& profile) override;
  void OnProgress(const std::string& job_id, int32_t rank,
                  const v1::IterationProgress& progress) override;
  void OnScheduleActive(const std::string& job_id, int64_t version) override;
  void OnMemoryGuard(const std::string& job_id, int32_t rank, int64_t step,
                     std::optional<int64_t> tripped_version,
                     const std::string& reason) override;
  void OnWorldChanged(const std::string& job_id) override;

 private:
  std::vector<WorkerEventListener*> listeners_;
};

class WorkerManager {
 public:
  // The newest schedule of a job as the update that published it (with
  // its incumbent while a comparison runs); NotFound when it has none.
  using ScheduleLookup = std::function<absl::StatusOr<v1::ScheduleUpdate>(
      const std::string& job_id)>;

  struct Options {
    // A running job whose worker stays silent this long is failed.
    std::chrono::milliseconds heartbeat_timeout{15000};
    // How often the watcher looks.
    std::chrono::milliseconds watch_interval{250};
    // A registered worker without a session this long (it never opened
    // one, or did not come back after a coordinator restart) counts as
    // gone until its job runs (Rank::gone_since).
    std::chrono::milliseconds session_grace{5000};
  };

  // Every pointer must outlive the manager; `metrics` and `timelines` may be
  // null (timelines are then refused).
  WorkerManager(JobManager* jobs, JobStore* store, KvStore* kv,
                CoordinatorMetrics* metrics, TimelineStore* timelines,
                Options options);
  // Stop().
  ~WorkerManager();
  WorkerManager(const WorkerManager&) = delete;
  WorkerManager& operator=(const WorkerManager&) = delete;

  // Set these before the first RPC; each must stay callable while RPCs are
  // served. Without a listener, reports are accepted and dropped; without a
  // lookup, a reconnecting worker is sent no schedule. AddListener appends
  // to the listeners, called in that order (WorkerEventFanOut); SetListener
  // makes `listener` the only one (null: none).
  void AddListener(WorkerEventListener* listener);
  void SetListener(WorkerEventListener* listener);
  void SetScheduleLookup(ScheduleLookup lookup);
  // Stops the heartbeat watcher: no job fails for silence from now on.
  // Returns once the thread has exited. Idempotent; not from the job
  // manager's state listener.
  void Stop();

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

  // Every rank of the job that registered, by rank: host, incarnation,
  // device, whether its session is open and when it was last heard from
  // (`tandem status`). An ended job's come from the store, not connected.
  absl::StatusOr<std::vector<v1::WorkerStatus>> Describe(
      const std::string& job_id);

  // Sends to every connected worker of the job.
  void Broadcast(const std::string& job_id,
                 const v1::CoordinatorMessage& message);
  // The job ended: tells its workers to stop and frees its rendezvous keys.
  void OnJobEnded(const std::string& job_id, v1::JobState state);

  // Key prefix of a job's rendezvous keys: "jobs/<id>/", and below it
  // "r<k>/" after its k-th restart (a fresh rendezvous), "r<k>w<n>/" once
  // that restart resumed at a smaller world of n ranks.
  static std::string StorePrefix(const std::string& job_id, int restarts = 0,
                                 int resumed_world = 0);
  // Below the prefix: set once the job runs (RegisterResponse.start_key).
  static constexpr char kStartKey[] = "tandem/started";

 private:
  // Where a rank's worker stands with its session.
  enum class Link {
    // Registered, no session opened yet (within options.session_grace).
    kRegistered,
    // Its session is open (`session` names it).
    kConnected,
    // Its session closed, or it opened none within the session grace. Until
    // the job runs it does not count as registered and a new worker may take
    // its rank; opening a session connects it again.
    kGone,
  };
  struct Rank {
    std::string incarnation;
    std::string hostname;
    std::string device;
    std::chrono::steady_clock::time_point last_seen;
    // When a message of this incarnation last came (wall clock, for
    // people); unset after a restart until it speaks again.
    std::chrono::system_clock::time_point last_heard{};
    Link link = Link::kRegistered;
    int64_t session = 0;  // while kConnected; 0 otherwise
    std::shared_ptr<SessionSink> sink;
    int64_t step = 0;
    int64_t applied_version = 0;
    // Its last step arrived (or the job ended): no heartbeat is awaited. A
    // done rank may still be connected until its worker exits.
    bool done = false;
    bool connected() const { return link == Link::kConnected; }
    bool live() const { return link != Link::kGone; }
  };
  struct JobWorkers {
    int32_t world = 0;
    int64_t total_steps = 0;
    std::map<int32_t, Rank> ranks;
    int64_t announced_version = 0;
    // The job ended: its connection gauges are gone and stay gone.
    bool ended = false;
    // After a restart, until rank 0 reports its first step: the last step
    // reached before it (the steps recomputed are counted from there).
    int64_t step_at_restart = -1;
    // restart.min_world (0: world) and restart.rejoin_timeout_s.
    int32_t min_world = 0;
    std::chrono::milliseconds rejoin_timeout{60000};
    // While the job waits for its ranks after a restart: since when. Past
    // rejoin_timeout with at least min_world registered, it resumes with
    // them (ResumeSmallerWorld).
    std::optional<std::chrono::steady_clock::time_point> waiting_since;
    // A rank whose collective failed on a lost peer (WorkerError.peer_lost)
    // while every other rank's session was still open: the gRPC stream of a
    // killed process can close after its peer's error arrives. The next
    // other rank whose session closes is then the lost one (CloseSession).
    // Cleared when the ranks are dropped (a restart).
    int32_t peer_lost_reporter = -1;
  };
  struct Session {
    std::string job_id;
    int32_t rank = 0;
  };

  // When WatchLoop last failed the jobs past parallel.start_timeout_s.
  std::chrono::steady_clock::time_point last_start_check_{};

  JobWorkers& Workers(const v1::Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's current rendezvous prefix (restarts, resumed world).
  static std::string StorePrefix(const v1::Job& job);
  // A PENDING job whose every rank is registered and has its session open
  // goes RUNNING, and its start key is set (RegisterResponse.start_key).
  // Not under mu_.
  void StartIfReady(const std::string& job_id);
  // A rank of the job is lost (`cause`; `kind` labels the metric:
  // heartbeat, peer, relaunch): restarts the job when restart.max_restarts
  // allows (its ranks are told to stop and forgotten, its rendezvous starts
  // afresh), else fails it. Returns whether it restarted. Not under mu_.
  bool LoseRank(const std::string& job_id, absl::string_view cause,
                absl::string_view kind);
  // The job waited rejoin_timeout for its ranks after a restart and has
  // `world` of them (at least restart.min_world): it resumes at that world
  // (JobManager::ResumeSmaller), and the registered ranks, which were told
  // the old world, stop (exit 75) and register again. Not under mu_.
  void ResumeSmallerWorld(const std::string& job_id, int32_t world,
                          const std::string& missing);
  // Tells the ranks to stop and forgets them. Requires mu_.
  std::vector<std::shared_ptr<SessionSink>> DropRanksLocked(
      const std::string& job_id, JobWorkers& w)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<v1::WorkerStatus> DescribeLocked(const JobWorkers& w) const;
  void WatchLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void UpdateConnectedMetric(const std::string& job_id, const JobWorkers& w);
  // Why a silent rank may be alive after all, when this coordinator is the
  // likelier cause: heartbeats reach it late. Empty otherwise. Requires
  // mu_.
  std::string OverloadHintLocked(std::chrono::steady_clock::time_point now)
      const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  WorkerEventListener& Listener() ABSL_LOCKS_EXCLUDED(mu_);

  JobManager* jobs_;
  JobStore* store_;
  KvStore* kv_;
  CoordinatorMetrics* metrics_;
  TimelineStore* timelines_;
  const Options options_;

  absl::Mutex mu_;
  absl::CondVar stop_cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  WorkerEventFanOut listeners_ ABSL_GUARDED_BY(mu_);
  ScheduleLookup schedule_lookup_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, JobWorkers> jobs_workers_ ABSL_GUARDED_BY(mu_);
  // The largest delay of a heartbeat (its send time to its handling) seen
  // within the last two heartbeat timeouts, and when.
  double heartbeat_delay_s_ ABSL_GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point heartbeat_delay_at_
      ABSL_GUARDED_BY(mu_){};
  // The ranks of jobs that ended and were forgotten by the watch, as they
  // were last (`tandem status`); the oldest of more than kMaxEndedJobs go,
  // and the store still has their registrations.
  static constexpr size_t kMaxEndedJobs = 1000;
  std::map<std::string, std::vector<v1::WorkerStatus>> ended_workers_
      ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ended_order_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  int64_t next_session_ = 1;
  std::once_flag joined_;
  // "heartbeat-watch": fails running jobs whose workers went silent (through
  // the job manager, whose state listener runs on this thread); from the
  // constructor until Stop().
  std::thread watcher_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_SERVICE_WORKER_MANAGER_H_
