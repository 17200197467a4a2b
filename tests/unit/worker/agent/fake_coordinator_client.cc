#include "tests/unit/worker/agent/fake_coordinator_client.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace tandem {

FakeCoordinatorClient::FakeCoordinatorClient(v1::RegisterResponse registration)
    : registration_(std::move(registration)) {}

void FakeCoordinatorClient::set_on_send(
    std::function<void(const v1::WorkerMessage&)> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  on_send_ = std::move(hook);
}

bool FakeCoordinatorClient::Push(const v1::CoordinatorMessage& message) {
  std::function<void(const v1::CoordinatorMessage&)> on_message;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!session_open_) return false;
    on_message = on_message_;
  }
  on_message(message);
  return true;
}

std::vector<v1::RegisterRequest> FakeCoordinatorClient::register_requests()
    const {
  std::lock_guard<std::mutex> lock(mu_);
  return register_requests_;
}

std::vector<v1::WorkerMessage> FakeCoordinatorClient::hellos() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hellos_;
}

std::vector<v1::WorkerMessage> FakeCoordinatorClient::sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sent_;
}

absl::StatusOr<v1::RegisterResponse> FakeCoordinatorClient::Register(
    const v1::RegisterRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  register_requests_.push_back(request);
  return registration_;
}

absl::Status FakeCoordinatorClient::OpenSession(
    const v1::WorkerMessage& hello,
    std::function<void(const v1::CoordinatorMessage&)> on_message,
    std::function<void(const absl::Status&)> on_closed) {
  std::lock_guard<std::mutex> lock(mu_);
  if (session_open_) {
    return absl::FailedPreconditionError("a session is already open");
  }
  hellos_.push_back(hello);
  session_open_ = true;
  on_message_ = std::move(on_message);
  on_closed_ = std::move(on_closed);
  return absl::OkStatus();
}

absl::Status FakeCoordinatorClient::Send(const v1::WorkerMessage& message) {
  std::function<void(const v1::WorkerMessage&)> hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!session_open_) return absl::UnavailableError("no session");
    if (!message.has_heartbeat()) sent_.push_back(message);
    hook = on_send_;
  }
  if (hook) hook(message);
  return absl::OkStatus();
}

void FakeCoordinatorClient::CloseSession() {
  std::function<void(const absl::Status&)> on_closed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!session_open_) return;
    session_open_ = false;
    on_closed = std::move(on_closed_);
    on_message_ = nullptr;
  }
  // The stream ended: the real client reports that once, too.
  if (on_closed) on_closed(absl::OkStatus());
}

absl::Status FakeCoordinatorClient::KvSet(const std::string& key,
                                          const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    kv_[key] = value;
  }
  kv_changed_.notify_all();
  return absl::OkStatus();
}

void FakeCoordinatorClient::FailKvGets(int calls) {
  std::lock_guard<std::mutex> lock(mu_);
  kv_get_failures_ = calls;
}

absl::StatusOr<std::optional<std::string>> FakeCoordinatorClient::KvGet(
    const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (kv_get_failures_ > 0) {
    --kv_get_failures_;
    return absl::UnavailableError("the coordinator is restarting");
  }
  kv_changed_.wait_for(lock, timeout, [&] { return kv_.count(key) > 0; });
  auto it = kv_.find(key);
  if (it == kv_.end()) return std::optional<std::string>();
  return std::optional<std::string>(it->second);
}

absl::StatusOr<int64_t> FakeCoordinatorClient::KvAdd(const std::string& key,
                                                     int64_t delta) {
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::string& stored = kv_[key];
    if (!stored.empty() && !absl::SimpleAtoi(stored, &value)) {
      return absl::FailedPreconditionError("KvAdd on a non-integer value");
    }
    value += delta;
    stored = std::to_string(value);
  }
  kv_changed_.notify_all();
  return value;
}

absl::StatusOr<std::string> FakeCoordinatorClient::KvCompareSet(
    const std::string& key, const std::string& expected,
    const std::string& desired) {
  std::string now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kv_.find(key);
    // c10d's rule: a missing key is set only when nothing was expected.
    if (it == kv_.end()) {
      if (!expected.empty()) return expected;
      kv_[key] = desired;
      now = desired;
    } else if (it->second == expected) {
      it->second = desired;
      now = desired;
    } else {
      return it->second;
    }
  }
  kv_changed_.notify_all();
  return now;
}

absl::StatusOr<bool> FakeCoordinatorClient::KvCheck(
    const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& key : keys) {
    if (kv_.count(key) == 0) return false;
  }
  return true;
}

absl::StatusOr<bool> FakeCoordinatorClient::KvDelete(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return kv_.erase(key) > 0;
}

absl::StatusOr<int64_t> FakeCoordinatorClient::KvNumKeys(
    const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t count = 0;
  for (const auto& [key, value] : kv_) {
    if (absl::StartsWith(key, prefix)) ++count;
  }
  return count;
}

}  // namespace tandem
