// How a worker reaches the coordinator. The agent talks only to this
// interface: GrpcCoordinatorClient is the real one, tests use fakes.
//
// Every call may fail with Unavailable while the coordinator is away; the
// caller retries. The session is one bidirectional stream at a time.
#ifndef TANDEM_WORKER_AGENT_COORDINATOR_CLIENT_H_
#define TANDEM_WORKER_AGENT_COORDINATOR_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/v1/worker_service.pb.h"

namespace tandem {

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;

  virtual absl::StatusOr<v1::RegisterResponse> Register(
      const v1::RegisterRequest& request) = 0;

  // Opens a session with `hello` as its first message. `on_message` runs on
  // the client's reader thread for every downstream message; `on_closed`
  // runs once when the stream ends (with its status). Only one session is
  // open at a time.
  virtual absl::Status OpenSession(
      const v1::WorkerMessage& hello,
      std::function<void(const v1::CoordinatorMessage&)> on_message,
      std::function<void(const absl::Status&)> on_closed) = 0;
  // Sends on the open session. Unavailable when there is none.
  virtual absl::Status Send(const v1::WorkerMessage& message) = 0;
  // Ends the session (half-close, then waits for the reader to finish).
  virtual void CloseSession() = 0;

  // The rendezvous store (c10d semantics).
  virtual absl::Status KvSet(const std::string& key,
                             const std::string& value) = 0;
  virtual absl::StatusOr<std::optional<std::string>> KvGet(
      const std::string& key, std::chrono::milliseconds timeout) = 0;
  virtual absl::StatusOr<int64_t> KvAdd(const std::string& key,
                                        int64_t delta) = 0;
  virtual absl::StatusOr<std::string> KvCompareSet(
      const std::string& key, const std::string& expected,
      const std::string& desired) = 0;
  virtual absl::StatusOr<bool> KvCheck(
      const std::vector<std::string>& keys) = 0;
  virtual absl::StatusOr<bool> KvDelete(const std::string& key) = 0;
  virtual absl::StatusOr<int64_t> KvNumKeys(const std::string& prefix) = 0;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_AGENT_COORDINATOR_CLIENT_H_
