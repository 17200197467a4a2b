// The coordinator daemon: owns the store, the managers, the metrics and the
// gRPC server, in dependency order, and wires them together. main.cc only
// parses flags and calls Start/Wait.
#ifndef TANDEM_COORDINATOR_RPC_COORDINATOR_SERVER_H_
#define TANDEM_COORDINATOR_RPC_COORDINATOR_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics/http_exporter.h"
#include "common/metrics/metrics_registry.h"
#include "coordinator/rpc/job_service_impl.h"
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
};

class CoordinatorServer {
 public:
  // Opens the database, recovers every job, and starts serving. Errors name
  // the flag to change (--db, --listen, --metrics-listen).
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      const CoordinatorOptions& options);
  ~CoordinatorServer();
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  // Ports actually bound (port 0 in the options picks a free one).
  int port() const { return port_; }
  int metrics_port() const { return exporter_ ? exporter_->port() : 0; }
  void Shutdown();
  void Wait();

 private:
  CoordinatorServer() = default;
  void UpdateJobGauges();

  metrics::Registry registry_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<JobStore> store_;
  KvStore kv_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<PlanningManager> planning_;
  TimelineStore timelines_;
  std::unique_ptr<WorkerManager> workers_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<metrics::HttpExporter> exporter_;
  int port_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_RPC_COORDINATOR_SERVER_H_
