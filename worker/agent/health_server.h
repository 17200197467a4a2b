// A worker's own gRPC server, serving only the standard health checking
// protocol (grpc.health.v1) for probes and launchers: `tandem-worker
// --health-listen HOST:PORT`. It lives in the agent layer, so the torch-free
// runtime stays free of gRPC. (libgrpc++'s built-in health service cannot be
// a server's only service, so this one implements the protocol itself.)
//
// Services reported:
//   ""       SERVING while the process runs (liveness); NOT_SERVING once it
//            is stopping.
//   "ready"  SERVING while the rank is registered and training (readiness);
//            NOT_SERVING before registration and once it is stopping.
// Any other name: Check answers NOT_FOUND, Watch SERVICE_UNKNOWN.
//
// Thread safety: every method may be called from any thread.
#ifndef TANDEM_WORKER_AGENT_HEALTH_SERVER_H_
#define TANDEM_WORKER_AGENT_HEALTH_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace tandem {

// grpc.health.v1.Health over a table of service statuses.
class HealthService final : public grpc::health::v1::Health::Service {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  void Set(const std::string& service, bool serving);
  // Everything NOT_SERVING for good, and open Watch calls end.
  void Shutdown();

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;
  grpc::Status Watch(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>*
                         writer) override;

 private:
  ServingStatus StatusLocked(const std::string& service) const;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, ServingStatus> statuses_;
  bool shutdown_ = false;
};

class HealthServer {
 public:
  static constexpr char kReadyService[] = "ready";

  // Listens on `listen` (port 0 picks one). Unavailable when the address is
  // malformed or taken; the message names --health-listen.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(
      const std::string& listen);
  ~HealthServer();
  HealthServer(const HealthServer&) = delete;
  HealthServer& operator=(const HealthServer&) = delete;

  int port() const { return port_; }
  // Readiness ("ready"); ignored after Shutdown.
  void SetReady(bool ready);
  // Everything NOT_SERVING, then the port closes (idempotent).
  void Shutdown();

 private:
  HealthServer() = default;

  HealthService service_;
  std::mutex mu_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_AGENT_HEALTH_SERVER_H_
