// The coordinator daemon: owns the store, the managers, the metrics and the
// gRPC server, in dependency order, and wires them together: the managers do
// not hold each other, they report to listeners set here (what workers send
// goes to the planning manager; new schedules go to the workers; ended jobs
// stop their workers). main.cc only parses flags and calls Start, Wait and
// Stop.
#ifndef TANDEM_COORDINATOR_RPC_COORDINATOR_SERVER_H_
#define TANDEM_COORDINATOR_RPC_COORDINATOR_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics/http_exporter.h"
#include "common/metrics/metrics_registry.h"
#include "coordinator/report/job_history.h"
#include "coordinator/report/job_report_builder.h"
#include "coordinator/rpc/job_service_impl.h"
#include "coordinator/rpc/rpc_auth.h"
#include "coordinator/rpc/worker_service_impl.h"
#include "coordinator/service/coordinator_metrics.h"
#include "coordinator/service/job_manager.h"
#include "coordinator/service/kv_store.h"
#include "coordinator/service/planning_manager.h"
#include "coordinator/service/worker_manager.h"
#include "coordinator/store/job_store.h"

namespace tandem {

struct CoordinatorOptions {
  std::string listen = "127.0.0.1:50051";
  std::string db = "tandem.db";
  // Empty: no metrics endpoint.
  std::string metrics_listen;
  std::chrono::milliseconds heartbeat_timeout{15000};
  // Security (coordinator/README.md, "Authentication"): TLS from PEM files
  // (--tls-cert, --tls-key; --tls-client-ca asks workers for certificates),
  // bearer tokens (--auth-tokens; empty: authentication off), and
  // --insecure, which allows a public address without them.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  std::string auth_tokens;
  bool insecure = false;
  // Limits (coordinator/README.md, "Limits"): server threads for unary
  // calls in flight (past it a call gets RESOURCE_EXHAUSTED; streams and
  // waiting KvGets hold none), how long a worker session may stay silent
  // before and after its hello, how many may await their hello (in all and
  // per peer address), and watches per user.
  int max_rpc_threads = 2048;
  std::chrono::milliseconds session_hello_timeout{10000};
  int max_pending_sessions = 4096;
  int max_pending_sessions_per_peer = 256;
  int max_streams_per_user = 128;
  // Jobs not yet ended, events per job, and where jobs may read and write
  // (--max-active-jobs, --max-active-jobs-per-user, --max-events-per-job,
  // --data-roots, --checkpoint-roots).
  JobManager::Limits job_limits;
  // Per job: profiles held awaiting the other ranks, and window aggregates
  // kept in the store (--max-profile-bytes-per-job,
  // --max-stored-profile-bytes-per-job).
  int64_t max_held_profile_bytes = ProfileAggregator::kDefaultMaxHeldBytes;
  int64_t max_stored_profile_bytes = JobStore::kDefaultMaxStoredProfileBytes;
  // Steps, and rank windows, kept per job for its report; older ones thin
  // out past it (JobStore::ThinHistory).
  int64_t max_history_rows_per_job = JobHistory::kDefaultMaxRows;
};

class CoordinatorServer {
 public:
  // Opens the database, recovers every job, and starts serving. Errors name
  // the flag to change (--db, --listen, --metrics-listen).
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      const CoordinatorOptions& options);
  // Stop().
  ~CoordinatorServer();
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  // Ports actually bound (port 0 in the options picks a free one).
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }

  // Stops, in this order: the gRPC server (health first turns NOT_SERVING;
  // RPCs in flight get 2 s, then are cancelled, and every handler has
  // returned), the planner (a plan in flight is persisted or abandoned, and
  // not published), the heartbeat watcher, then the metrics endpoint. Each
  // stage only reaches the ones after it, so no thread calls into a stopped
  // part. Idempotent and safe from any thread but the server's own (an RPC
  // handler, the planner, the watcher); concurrent calls all return once it
  // is done.
  void Stop();
  // Blocks until Stop() (from another thread) has shut the gRPC server down.
  void Wait();
  // Re-reads the token file (SIGHUP). On error the old tokens stay in force.
  absl::Status ReloadTokens();

 private:
  CoordinatorServer() = default;
  void UpdateJobGauges();

  // Members in dependency order: each is used by those declared after it
  // (and their threads), never by those before, so that destruction, which
  // runs in reverse, is safe even without Stop().
  metrics::Registry registry_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<JobStore> store_;
  KvStore kv_;
  TimelineStore timelines_;
  // Its state listener runs on whichever thread changes a job's state (RPC
  // handlers, the planner, the watcher) and reaches workers_ and the gauges.
  std::unique_ptr<JobManager> jobs_;
  // Steps and ranks' profile windows for the job reports; workers_' second
  // listener, flushed by jobs_' state listener when a job ends.
  std::unique_ptr<JobHistory> history_;
  // The job reports: JobService.GetReport and /jobs/<id> on the metrics
  // port.
  std::unique_ptr<JobReportBuilder> reports_;
  std::unique_ptr<WorkerManager> workers_;
  // workers_' first listener; its planner thread publishes schedules
  // through workers_.
  std::unique_ptr<PlanningManager> planning_;
  std::unique_ptr<RpcAuth> auth_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<metrics::HttpExporter> exporter_;
  int port_ = 0;
  int metrics_port_ = 0;
  std::once_flag stopped_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_RPC_COORDINATOR_SERVER_H_
