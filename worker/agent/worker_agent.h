// The worker's side of the control plane: registers with the coordinator,
// keeps one session open (reconnecting while the coordinator is away),
// sends heartbeats, forwards what the training loop reports and hands it the
// schedules and commands that come back. The training loop never blocks on
// the coordinator: while it is away, training goes on under the current
// schedule and reports are dropped (the graph is re-sent on reconnect).
//
//   Register() ──ok──> kRegistered ──Start()──> kConnected
//       │ refused                                 │   ^
//       v                                         │   │ session reopened
//   (error to the caller)            stream ended v   │ ("agent-heartbeat")
//                                           kDisconnected
//   any state ──STOP command / fatal refusal──> kStopped
//
// Thread safety: every public method may be called from any thread.
#ifndef TANDEM_WORKER_AGENT_WORKER_AGENT_H_
#define TANDEM_WORKER_AGENT_WORKER_AGENT_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/agent/coordinator_client.h"

namespace tandem {

class WorkerAgent {
 public:
  enum class State { kNew, kRegistered, kConnected, kDisconnected, kStopped };

  struct Options {
    std::string job_id;
    // -1 lets the coordinator assign one.
    int32_t requested_rank = -1;
    std::string hostname;
    std::string device = "cpu";
    // Memory this rank may use (RegisterRequest.device_memory_bytes): a
    // GPU's capacity, or on CPU the host's available memory; 0: unknown.
    int64_t device_memory_bytes = 0;
    std::chrono::milliseconds heartbeat_interval{1000};
    // How long Register() keeps retrying an unreachable coordinator.
    std::chrono::milliseconds register_timeout{60000};
  };

  // `client` must outlive the agent.
  WorkerAgent(CoordinatorClient* client, Options options);
  ~WorkerAgent();
  WorkerAgent(const WorkerAgent&) = delete;
  WorkerAgent& operator=(const WorkerAgent&) = delete;

  // Registers (retrying Unavailable until register_timeout). Errors are the
  // coordinator's: NotFound (unknown job), FailedPrecondition (the job
  // ended), AlreadyExists, ResourceExhausted; Unavailable after the timeout.
  absl::StatusOr<v1::RegisterResponse> Register();
  // Opens the session and starts the heartbeat thread. Call after Register.
  absl::Status Start();
  // Closes the session and stops the thread (idempotent).
  void Shutdown();

  // Reports from the training loop. Never block on the network beyond one
  // write; silently dropped while disconnected (except the graph, which is
  // re-sent on every reconnect).
  void ReportGraph(const v1::GraphReport& report);
  void ReportTimeline(const v1::TimelineReport& timeline);
  void ReportProgress(const v1::IterationProgress& progress);
  // `reason`: why the worker switched on its own (the memory guard's
  // switch to the least-memory schedule, version -1), empty otherwise.
  void ReportApplied(int64_t version, int64_t step,
                     const std::string& reason = "");
  // The memory guard switched this rank to the least-memory schedule
  // (version -1) from `from_step`; `tripped_version` is the version the
  // step that came near the budget ran.
  void ReportMemoryGuard(int64_t from_step, int64_t tripped_version,
                         const std::string& reason);
  // `peer_lost`: a collective failed here, most likely because a peer
  // died (WorkerError.peer_lost).
  void ReportError(const std::string& message, bool fatal,
                   bool peer_lost = false);

  // The newest schedule update not yet taken.
  std::optional<v1::ScheduleUpdate> TakeSchedule();
  // Why the coordinator asked this worker to stop, once it has.
  std::optional<std::string> StopReason() const;
  // Whether that stop is a restart of the job (Command KIND_RESTART): the
  // process should exit for its launcher to start it again.
  bool RestartRequested() const;
  // Waits up to `timeout` for a stop; returns its reason if one came.
  std::optional<std::string> WaitForStop(std::chrono::milliseconds timeout);
  State state() const;
  const std::string& incarnation() const { return incarnation_; }
  // Messages the coordinator refused so far (each is also logged).
  int64_t rejected_count() const { return rejected_.load(); }

  // Any other message (a profile window): written if connected, dropped
  // otherwise. `keep_for_reconnect`: also sent again on every reconnect
  // (the graph).
  void Send(const v1::WorkerMessage& message, bool keep_for_reconnect = false);

 private:
  absl::Status Connect();
  void OnMessage(const v1::CoordinatorMessage& message);
  void OnClosed(const absl::Status& status);
  void HeartbeatLoop();

  CoordinatorClient* client_;
  const Options options_;
  const std::string incarnation_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  State state_ = State::kNew;
  int32_t rank_ = -1;
  int64_t step_ = 0;
  int64_t schedule_version_ = 0;
  std::optional<v1::WorkerMessage> graph_;
  // The newest progress, re-sent on reconnect: the last step's report must
  // reach the coordinator even if it was away when the step ended.
  std::optional<v1::WorkerMessage> progress_;
  // The newest published schedule applied, re-sent on reconnect: a push a
  // coordinator restart interrupted is still recorded active on all ranks.
  std::optional<v1::WorkerMessage> applied_;
  std::optional<v1::ScheduleUpdate> pending_schedule_;
  std::optional<std::string> stop_reason_;
  bool restart_requested_ = false;
  std::atomic<int64_t> rejected_{0};
  bool shutdown_ = false;
  // "agent-heartbeat": sends heartbeats and reopens a lost session.
  std::thread heartbeat_;
};

// A random incarnation id (hex), distinct per process start.
std::string NewIncarnation();

}  // namespace tandem

#endif  // TANDEM_WORKER_AGENT_WORKER_AGENT_H_
