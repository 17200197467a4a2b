// CoordinatorClient over gRPC (tandem.v1.WorkerService).
#ifndef TANDEM_WORKER_AGENT_GRPC_COORDINATOR_CLIENT_H_
#define TANDEM_WORKER_AGENT_GRPC_COORDINATOR_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <mutex>
#include <thread>

#include "tandem/v1/worker_service.grpc.pb.h"
#include "worker/agent/coordinator_client.h"

namespace tandem {

// How to reach an authenticating coordinator (coordinator/README.md,
// "Authentication").
struct CoordinatorCredentials {
  // TLS (common/security/grpc_credentials.h); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> channel;
  // The job's join secret, sent on every call as `tandem-join-secret`;
  // empty: none.
  std::string join_secret;
};

class GrpcCoordinatorClient : public CoordinatorClient {
 public:
  // `address` is HOST:PORT. Unary calls time out after `rpc_timeout` (KvGet
  // after its own timeout plus that).
  explicit GrpcCoordinatorClient(
      const std::string& address, CoordinatorCredentials credentials = {},
      std::chrono::milliseconds rpc_timeout = std::chrono::seconds(10));
  ~GrpcCoordinatorClient() override;

  absl::StatusOr<v1::RegisterResponse> Register(
      const v1::RegisterRequest& request) override;
  absl::Status OpenSession(
      const v1::WorkerMessage& hello,
      std::function<void(const v1::CoordinatorMessage&)> on_message,
      std::function<void(const absl::Status&)> on_closed) override;
  absl::Status Send(const v1::WorkerMessage& message) override;
  void CloseSession() override;

  absl::Status KvSet(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::optional<std::string>> KvGet(
      const std::string& key, std::chrono::milliseconds timeout) override;
  absl::StatusOr<int64_t> KvAdd(const std::string& key, int64_t delta) override;
  absl::StatusOr<std::string> KvCompareSet(const std::string& key,
                                           const std::string& expected,
                                           const std::string& desired) override;
  absl::StatusOr<bool> KvCheck(const std::vector<std::string>& keys) override;
  absl::StatusOr<bool> KvDelete(const std::string& key) override;
  absl::StatusOr<int64_t> KvNumKeys(const std::string& prefix) override;

 private:
  // The deadline and the join secret.
  void Prepare(grpc::ClientContext& ctx,
               std::chrono::milliseconds extra = {}) const;
  absl::Status Annotate(const grpc::Status& status) const;

  const std::string address_;
  const std::chrono::milliseconds rpc_timeout_;
  const std::string join_secret_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;

  // The open session, if any. mu_ guards the pointers and serializes writes.
  std::mutex mu_;
  std::unique_ptr<grpc::ClientContext> session_ctx_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>>
      session_;
  // "session-reader": reads downstream messages until the stream ends.
  std::thread reader_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_AGENT_GRPC_COORDINATOR_CLIENT_H_
