#include "coordinator/service/kv_store.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/store/job_store.h"

namespace tandem {

absl::string_view KvNamespace(absl::string_view key) {
  if (!absl::StartsWith(key, "jobs/")) return "";
  const size_t slash = key.find('/', 5);
  if (slash == absl::string_view::npos || slash == 5) return "";
  return key.substr(0, slash + 1);
}

absl::Status KvStore::AttachStore(JobStore* store) {
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> rows =
      store->LoadKv();
  if (!rows.ok()) return rows.status();
  absl::MutexLock lock(&mu_);
  for (auto& [key, value] : *rows) {
    const size_t bytes = key.size() + value.size();
    Usage& u = usage_[std::string(KvNamespace(key))];
    u.keys += 1;
    u.bytes += bytes;
    total_.keys += 1;
    total_.bytes += bytes;
    data_[std::move(key)] = std::move(value);
  }
  store_ = store;
  return absl::OkStatus();
}

absl::Status KvStore::CheckSizes(absl::string_view key,
                                 absl::string_view value) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key must be 1..", kMaxKeyBytes, " bytes, got ", key.size()));
  }
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("value of '", key.substr(0, 64), "' is ", value.size(),
                     " bytes; at most ", kMaxValueBytes, " are allowed"));
  }
  return absl::OkStatus();
}

absl::Status KvStore::PutLocked(Map::iterator it, absl::string_view key,
                                absl::string_view value, Fired* fired) {
  if (absl::Status s = CheckSizes(key, value); !s.ok()) return s;
  const bool adds = it == data_.end();
  const size_t old_bytes = adds ? 0 : key.size() + it->second.size();
  const size_t new_bytes = key.size() + value.size();
  const absl::string_view ns = KvNamespace(key);
  auto u = usage_.find(ns);
  const Usage job = u == usage_.end() ? Usage{} : u->second;
  const size_t job_keys = job.keys + (adds ? 1 : 0);
  const size_t job_bytes = job.bytes - old_bytes + new_bytes;
  const std::string whose =
      ns.empty() ? std::string("keys outside any job")
                 : absl::StrCat("job ", ns.substr(5, ns.size() - 6));
  if (job_keys > kMaxKeysPerJob || job_bytes > kMaxBytesPerJob) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous quota: ", whose, " would hold ", job_keys,
                     " keys and ", job_bytes, " bytes; the limit per job is ",
                     kMaxKeysPerJob, " keys and ", kMaxBytesPerJob,
                     " bytes (delete keys it no longer "
                     "needs)"));
  }
  const size_t total_keys = total_.keys + (adds ? 1 : 0);
  const size_t total_bytes = total_.bytes - old_bytes + new_bytes;
  if (total_keys > kMaxKeys || total_bytes > kMaxBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the rendezvous store is full (", total_.keys, " keys, ",
                     total_.bytes, " bytes of at most ", kMaxKeys, " and ",
                     kMaxBytes, "); finished jobs release theirs"));
  }
  if (store_ != nullptr) {
    if (absl::Status s = store_->PutKv(key, value); !s.ok()) return s;
  }
  if (u == usage_.end()) u = usage_.emplace(std::string(ns), Usage{}).first;
  u->second = {job_keys, job_bytes};
  total_ = {total_keys, total_bytes};
  if (adds) {
    data_.emplace(std::string(key), std::string(value));
  } else {
    it->second = std::string(value);
  }
  changed_.SignalAll();
  for (auto w = waiting_on_.find(key);
       w != waiting_on_.end() && w->first == key; w = waiting_on_.find(key)) {
    fired->emplace_back(RemoveWaiterLocked(w->second), std::string(value));
  }
  return absl::OkStatus();
}

KvStore::WaitDone KvStore::RemoveWaiterLocked(uint64_t id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return nullptr;
  Waiter& w = it->second;
  for (auto k = waiting_on_.find(w.key);
       k != waiting_on_.end() && k->first == w.key; ++k) {
    if (k->second == id) {
      waiting_on_.erase(k);
      break;
    }
  }
  deadlines_.erase({w.deadline, id});
  auto n = waiters_per_ns_.find(KvNamespace(w.key));
  if (n != waiters_per_ns_.end() && --n->second == 0) waiters_per_ns_.erase(n);
  WaitDone done = std::move(w.done);
  waiters_.erase(it);
  return done;
}

void KvStore::Run(Fired fired) {
  for (auto& [done, value] : fired) {
    if (done) done(std::move(value));
  }
}

KvStore::~KvStore() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  expiry_wake_.SignalAll();
  if (expiry_.joinable()) expiry_.join();
}

absl::StatusOr<KvStore::Waiting> KvStore::GetOrWait(
    absl::string_view key, std::chrono::steady_clock::time_point deadline,
    WaitDone done) {
  if (absl::Status s = CheckSizes(key, ""); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = data_.find(key);
  if (it != data_.end()) return Waiting{it->second, 0};
  const absl::string_view ns = KvNamespace(key);
  auto n = waiters_per_ns_.find(ns);
  const size_t in_ns = n == waiters_per_ns_.end() ? 0 : n->second;
  if (in_ns >= kMaxWaitersPerJob) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous quota: ",
        ns.empty() ? std::string("keys outside any job")
                   : absl::StrCat("job ", ns.substr(5, ns.size() - 6)),
        " has ", in_ns, " gets waiting, the most one job may have; ",
        "wait for fewer keys at once"));
  }
  if (waiters_.size() >= kMaxWaiters) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the rendezvous store has ", waiters_.size(),
                     " gets waiting, the most it holds; retry shortly"));
  }
  const uint64_t id = next_waiter_++;
  waiters_.emplace(id, Waiter{std::string(key), deadline, std::move(done)});
  waiting_on_.emplace(std::string(key), id);
  const bool earliest =
      deadlines_.empty() || deadline < deadlines_.begin()->first;
  deadlines_.emplace(deadline, id);
  if (n == waiters_per_ns_.end()) {
    waiters_per_ns_.emplace(std::string(ns), 1);
  } else {
    ++n->second;
  }
  if (!expiry_.joinable()) {
    expiry_ = std::thread([this] { Expire(); });
  } else if (earliest) {
    expiry_wake_.SignalAll();
  }
  return Waiting{std::nullopt, id};
}

bool KvStore::CancelWait(uint64_t waiter) {
  absl::MutexLock lock(&mu_);
  return RemoveWaiterLocked(waiter) != nullptr;
}

size_t KvStore::waiters() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

void KvStore::Expire() {
  mu_.Lock();
  while (!stop_) {
    Fired fired;
    const auto now = std::chrono::steady_clock::now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      fired.emplace_back(RemoveWaiterLocked(deadlines_.begin()->second),
                         std::nullopt);
    }
    if (!fired.empty()) {
      mu_.Unlock();
      Run(std::move(fired));
      mu_.Lock();
      continue;
    }
    if (deadlines_.empty()) {
      expiry_wake_.Wait(&mu_);
    } else {
      expiry_wake_.WaitWithTimeout(
          &mu_, absl::FromChrono(deadlines_.begin()->first -
                                 std::chrono::steady_clock::now()));
    }
  }
  mu_.Unlock();
}

KvStore::Map::iterator KvStore::EraseLocked(Map::iterator it, bool persist) {
  // Best effort: a key left in the database comes back after a restart and
  // is cleared with its job's prefix when the job ends.
  if (persist && store_ != nullptr) (void)store_->DeleteKv(it->first);
  const size_t bytes = it->first.size() + it->second.size();
  auto u = usage_.find(KvNamespace(it->first));
  if (u != usage_.end()) {
    u->second.keys -= 1;
    u->second.bytes -= bytes;
    if (u->second.keys == 0) usage_.erase(u);
  }
  total_.keys -= 1;
  total_.bytes -= bytes;
  return data_.erase(it);
}

absl::Status KvStore::Set(absl::string_view key, absl::string_view value) {
  Fired fired;
  absl::Status s;
  {
    absl::MutexLock lock(&mu_);
    s = PutLocked(data_.find(key), key, value, &fired);
  }
  Run(std::move(fired));
  return s;
}

absl::StatusOr<std::optional<std::string>> KvStore::Get(
    absl::string_view key, std::chrono::milliseconds timeout) {
  if (absl::Status s = CheckSizes(key, ""); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  for (;;) {
    auto it = data_.find(key);
    if (it != data_.end()) return std::optional<std::string>(it->second);
    if (changed_.WaitWithDeadline(&mu_, deadline)) {
      it = data_.find(key);
      if (it != data_.end()) return std::optional<std::string>(it->second);
      return std::optional<std::string>();
    }
  }
}

absl::StatusOr<int64_t> KvStore::Add(absl::string_view key, int64_t delta) {
  Fired fired;
  absl::StatusOr<int64_t> out = AddAndCollect(key, delta, &fired);
  Run(std::move(fired));
  return out;
}

absl::StatusOr<int64_t> KvStore::AddAndCollect(absl::string_view key,
                                               int64_t delta, Fired* fired) {
  absl::MutexLock lock(&mu_);
  auto it = data_.find(key);
  int64_t value = 0;
  if (it != data_.end() && !absl::SimpleAtoi(it->second, &value)) {
    return absl::FailedPreconditionError(
        absl::StrCat("value of '", key.substr(0, 64),
                     "' is not an integer; Add needs an integer key"));
  }
  // A client's delta may overflow (found by tests/fuzz/service_fuzzer).
  if (__builtin_add_overflow(value, delta, &value)) {
    return absl::OutOfRangeError(absl::StrCat("adding ", delta, " to '",
                                              key.substr(0, 64),
                                              "' overflows a 64-bit integer"));
  }
  if (absl::Status s = PutLocked(it, key, absl::StrCat(value), fired);
      !s.ok()) {
    return s;
  }
  return value;
}

absl::StatusOr<std::string> KvStore::CompareSet(absl::string_view key,
                                                absl::string_view expected,
                                                absl::string_view desired) {
  Fired fired;
  absl::StatusOr<std::string> out =
      CompareSetAndCollect(key, expected, desired, &fired);
  Run(std::move(fired));
  return out;
}

absl::StatusOr<std::string> KvStore::CompareSetAndCollect(
    absl::string_view key, absl::string_view expected,
    absl::string_view desired, Fired* fired) {
  absl::MutexLock lock(&mu_);
  auto it = data_.find(key);
  if (absl::Status s = CheckSizes(key, desired); !s.ok()) return s;
  if (it == data_.end()) {
    if (!expected.empty()) return std::string(expected);
    if (absl::Status s = PutLocked(it, key, desired, fired); !s.ok()) {
      return s;
    }
    return std::string(desired);
  }
  if (it->second == expected) {
    if (absl::Status s = PutLocked(it, key, desired, fired); !s.ok()) {
      return s;
    }
  }
  return it->second;
}

bool KvStore::Check(const std::vector<std::string>& keys) const {
  absl::MutexLock lock(&mu_);
  for (const std::string& k : keys) {
    if (data_.find(k) == data_.end()) return false;
  }
  return true;
}

bool KvStore::Delete(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  EraseLocked(it, /*persist=*/true);
  return true;
}

int64_t KvStore::NumKeys(absl::string_view prefix) const {
  absl::MutexLock lock(&mu_);
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
  absl::MutexLock lock(&mu_);
  // One statement for the prefix, not one per key.
  if (store_ != nullptr) (void)store_->DeleteKvPrefix(prefix);
  auto it = data_.lower_bound(prefix);
  while (it != data_.end() &&
         absl::string_view(it->first).substr(0, prefix.size()) == prefix) {
    it = EraseLocked(it, /*persist=*/false);
  }
}

}  // namespace tandem
