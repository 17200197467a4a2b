#include "coordinator/service/kv_store.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status KvStore::CheckSizes(absl::string_view key, absl::string_view value,
                                 bool adds_key) const {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key must be 1..", kMaxKeyBytes, " bytes, got ", key.size()));
  }
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("value of '", key.substr(0, 64), "' is ", value.size(),
                     " bytes; at most ", kMaxValueBytes, " are allowed"));
  }
  if (adds_key && data_.size() >= kMaxKeys) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the rendezvous store holds ", kMaxKeys,
                     " keys already; finished jobs release theirs"));
  }
  return absl::OkStatus();
}

absl::Status KvStore::Set(absl::string_view key, absl::string_view value) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool adds = data_.find(key) == data_.end();
  if (absl::Status s = CheckSizes(key, value, adds); !s.ok()) return s;
  data_[std::string(key)] = std::string(value);
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> KvStore::Get(
    absl::string_view key, std::chrono::milliseconds timeout) {
  if (absl::Status s = CheckSizes(key, "", false); !s.ok()) return s;
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto it = data_.find(key);
    if (it != data_.end()) return std::optional<std::string>(it->second);
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
      it = data_.find(key);
      if (it != data_.end()) return std::optional<std::string>(it->second);
      return std::optional<std::string>();
    }
  }
}

absl::StatusOr<int64_t> KvStore::Add(absl::string_view key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  int64_t value = 0;
  if (it != data_.end() && !absl::SimpleAtoi(it->second, &value)) {
    return absl::FailedPreconditionError(
        absl::StrCat("value of '", key.substr(0, 64),
                     "' is not an integer; Add needs an integer key"));
  }
  if (absl::Status s = CheckSizes(key, "", it == data_.end()); !s.ok()) {
    return s;
  }
  value += delta;
  data_[std::string(key)] = absl::StrCat(value);
  changed_.notify_all();
  return value;
}

absl::StatusOr<std::string> KvStore::CompareSet(absl::string_view key,
                                                absl::string_view expected,
                                                absl::string_view desired) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (absl::Status s = CheckSizes(key, desired, it == data_.end()); !s.ok()) {
    return s;
  }
  if (it == data_.end()) {
    if (!expected.empty()) return std::string(expected);
    data_[std::string(key)] = std::string(desired);
    changed_.notify_all();
    return std::string(desired);
  }
  if (it->second == expected) {
    it->second = std::string(desired);
    changed_.notify_all();
  }
  return it->second;
}

bool KvStore::Check(const std::vector<std::string>& keys) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& k : keys) {
    if (data_.find(k) == data_.end()) return false;
  }
  return true;
}

bool KvStore::Delete(absl::string_view key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  data_.erase(it);
  return true;
}

int64_t KvStore::NumKeys(absl::string_view prefix) const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (auto it = data_.lower_bound(prefix);
       it != data_.end() &&
       absl::string_view(it->first).substr(0, prefix.size()) == prefix;
       ++it) {
    ++n;
  }
  return n;
}

void KvStore::DeletePrefix(absl::string_view prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.lower_bound(prefix);
  while (it != data_.end() &&
         absl::string_view(it->first).substr(0, prefix.size()) == prefix) {
    it = data_.erase(it);
  }
}

}  // namespace tandem
