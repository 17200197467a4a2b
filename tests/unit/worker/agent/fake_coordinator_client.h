// An in-process CoordinatorClient for tests: registration returns a canned
// response, every message a worker sends is recorded (and handed to an
// optional hook that plays the coordinator's part, e.g. pushing a schedule
// when the graph arrives), and the rendezvous key-value store is a map with
// c10d's semantics. No gRPC, no coordinator.
//
// Thread safety: every method may be called from any thread. Hooks and the
// session's callbacks run without the fake's lock held, so a hook may call
// Push() and the agent may call back into the fake.
#ifndef TANDEM_TESTS_UNIT_WORKER_AGENT_FAKE_COORDINATOR_CLIENT_H_
#define TANDEM_TESTS_UNIT_WORKER_AGENT_FAKE_COORDINATOR_CLIENT_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "worker/agent/coordinator_client.h"

namespace tandem {

class FakeCoordinatorClient : public CoordinatorClient {
 public:
  explicit FakeCoordinatorClient(v1::RegisterResponse registration);

  // Runs on the sending thread after each recorded message (heartbeats
  // included).
  void set_on_send(std::function<void(const v1::WorkerMessage&)> hook);

  // The coordinator's side: delivers `message` to the open session's
  // on_message. False when no session is open.
  bool Push(const v1::CoordinatorMessage& message);

  // The next `calls` KvGet calls fail with UNAVAILABLE, as while the
  // coordinator restarts.
  void FailKvGets(int calls);

  // What the worker did, in order.
  std::vector<v1::RegisterRequest> register_requests() const;
  std::vector<v1::WorkerMessage> hellos() const;
  // Every message sent on a session except heartbeats.
  std::vector<v1::WorkerMessage> sent() const;

  // CoordinatorClient.
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
  const v1::RegisterResponse registration_;

  mutable std::mutex mu_;
  std::condition_variable kv_changed_;
  std::vector<v1::RegisterRequest> register_requests_;
  std::vector<v1::WorkerMessage> hellos_;
  std::vector<v1::WorkerMessage> sent_;
  std::function<void(const v1::WorkerMessage&)> on_send_;
  bool session_open_ = false;
  std::function<void(const v1::CoordinatorMessage&)> on_message_;
  std::function<void(const absl::Status&)> on_closed_;
  std::map<std::string, std::string> kv_;
  int kv_get_failures_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_TESTS_UNIT_WORKER_AGENT_FAKE_COORDINATOR_CLIENT_H_
