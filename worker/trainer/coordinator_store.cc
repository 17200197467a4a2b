#include "worker/trainer/coordinator_store.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <thread>

namespace tandem {
namespace {

std::string ToString(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}
std::vector<uint8_t> ToBytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

// Transient outages (the coordinator restarting) are retried until the
// deadline; anything else is thrown at once.
template <typename Fn>
auto Retry(const std::chrono::milliseconds& timeout, const char* what,
           const std::string& key, Fn&& fn) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto result = fn();
    if (result.ok()) return *std::move(result);
    const bool transient =
        result.status().code() == absl::StatusCode::kUnavailable ||
        result.status().code() == absl::StatusCode::kDeadlineExceeded;
    if (!transient || std::chrono::steady_clock::now() >= deadline) {
      TORCH_CHECK(false, "rendezvous store ", what, "('", key,
                  "') failed: ", std::string(result.status().message()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace

CoordinatorStore::CoordinatorStore(CoordinatorClient* client,
                                   std::string prefix,
                                   std::chrono::milliseconds timeout)
    : Store(timeout), client_(client), prefix_(std::move(prefix)) {}

c10::intrusive_ptr<c10d::Store> CoordinatorStore::clone() {
  return c10::make_intrusive<CoordinatorStore>(client_, prefix_, timeout_);
}

void CoordinatorStore::set(const std::string& key,
                           const std::vector<uint8_t>& value) {
  Retry(timeout_, "set", key, [&]() -> absl::StatusOr<bool> {
    absl::Status s = client_->KvSet(Key(key), ToString(value));
    if (!s.ok()) return s;
    return true;
  });
}

std::vector<uint8_t> CoordinatorStore::compareSet(
    const std::string& key, const std::vector<uint8_t>& expected,
    const std::vector<uint8_t>& desired) {
  return ToBytes(Retry(timeout_, "compareSet", key, [&] {
    return client_->KvCompareSet(Key(key), ToString(expected),
                                 ToString(desired));
  }));
}

std::vector<uint8_t> CoordinatorStore::get(const std::string& key) {
  return ToBytes(
      WaitFor(key, std::chrono::steady_clock::now() + timeout_, timeout_));
}

std::string CoordinatorStore::WaitFor(
    const std::string& key, std::chrono::steady_clock::time_point deadline,
    std::chrono::milliseconds timeout) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    // Long polls in slices, so a coordinator restart costs one slice; an
    // outage (UNAVAILABLE while it restarts) is waited out, not fatal: the
    // restarted coordinator still holds the keys set before.
    const auto slice = std::clamp(left, std::chrono::milliseconds(0),
                                  std::chrono::milliseconds(30000));
    absl::StatusOr<std::optional<std::string>> v =
        client_->KvGet(Key(key), slice);
    if (v.ok() && v->has_value()) return **std::move(v);
    if (!v.ok() && v.status().code() != absl::StatusCode::kUnavailable &&
        v.status().code() != absl::StatusCode::kDeadlineExceeded) {
      TORCH_CHECK(false, "rendezvous store get('", key,
                  "') failed: ", std::string(v.status().message()));
    }
    if (!v.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    TORCH_CHECK(std::chrono::steady_clock::now() < deadline,
                "rendezvous store: timed out after ", timeout.count(),
                " ms waiting for key '", key,
                "'; did every rank start and reach the coordinator?");
  }
}

int64_t CoordinatorStore::add(const std::string& key, int64_t value) {
  return Retry(timeout_, "add", key,
               [&] { return client_->KvAdd(Key(key), value); });
}

bool CoordinatorStore::deleteKey(const std::string& key) {
  return Retry(timeout_, "deleteKey", key,
               [&] { return client_->KvDelete(Key(key)); });
}

bool CoordinatorStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& k : keys) full.push_back(Key(k));
  return Retry(timeout_, "check", keys.empty() ? "" : keys[0],
               [&] { return client_->KvCheck(full); });
}

int64_t CoordinatorStore::getNumKeys() {
  return Retry(timeout_, "getNumKeys", prefix_,
               [&] { return client_->KvNumKeys(prefix_); });
}

void CoordinatorStore::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void CoordinatorStore::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const std::string& key : keys) WaitFor(key, deadline, timeout);
}

}  // namespace tandem
