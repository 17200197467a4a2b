// The rendezvous key-value store the collective backend bootstraps from
// (c10d's Store semantics: set, blocking get, add, compare-and-set, check,
// delete, key count). Served by WorkerService so that a worker needs nothing
// but the coordinator's address. Keys are namespaced per job by the caller.
//
// With a JobStore attached, every change is in SQLite before it is
// acknowledged (AttachStore), so a coordinator restart in the middle of a
// rendezvous loses nothing.
//
// Sizes are bounded so that a misbehaving client cannot exhaust memory: keys
// up to 1 KiB, values up to 1 MiB; each job's namespace ("jobs/<id>/...")
// holds at most kMaxKeysPerJob keys and kMaxBytesPerJob bytes (keys plus
// values), so one job cannot fill the store for the others; and the whole
// store at most kMaxKeys keys and kMaxBytes bytes. Keys outside any job
// share one namespace with the same quota.
//
// A get that waits for its key holds no thread (GetOrWait): the waiter is a
// callback, run by whoever sets the key or, at its deadline, by the store's
// one expiry thread. Waiters are bounded like keys: kMaxWaitersPerJob per
// namespace, kMaxWaiters in all.
#ifndef TANDEM_COORDINATOR_SERVICE_KV_STORE_H_
#define TANDEM_COORDINATOR_SERVICE_KV_STORE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

class JobStore;

class KvStore {
 public:
  static constexpr size_t kMaxKeyBytes = 1024;
  static constexpr size_t kMaxValueBytes = 1 << 20;
  static constexpr size_t kMaxKeys = 100000;
  static constexpr size_t kMaxBytes = 512u << 20;
  static constexpr size_t kMaxKeysPerJob = 16384;
  static constexpr size_t kMaxBytesPerJob = 32u << 20;
  static constexpr size_t kMaxWaitersPerJob = 4096;
  static constexpr size_t kMaxWaiters = 65536;

  KvStore() = default;
  // Stops the expiry thread; waiters still registered are dropped without
  // being called (their server has shut down first).
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // Writes every change through to `store` (which must outlive this) before
  // it is acknowledged, and loads what it holds: a restarted coordinator
  // keeps the keys of rendezvous in progress. Call once, before use.
  absl::Status AttachStore(JobStore* store);

  // Errors: InvalidArgument for an empty or oversized key or value,
  // ResourceExhausted when the job's quota or the store is full (the
  // message says which, with the figures).
  absl::Status Set(absl::string_view key, absl::string_view value);
  // Waits up to `timeout` for the key; nullopt when it never appeared.
  // Blocks the calling thread: servers use GetOrWait.
  absl::StatusOr<std::optional<std::string>> Get(
      absl::string_view key, std::chrono::milliseconds timeout);

  // Get without a thread. When the key is there, its value, and `done` is
  // not called. Otherwise `done` is registered and runs exactly once,
  // outside the store's lock: with the value, on the thread that sets the
  // key, or with nullopt at `deadline`, on the store's expiry thread; unless
  // CancelWait removes it first. `done` must not block, nor call back into
  // the store. Errors: InvalidArgument for a bad key, ResourceExhausted past
  // the waiter quotas (nothing is registered then).
  using WaitDone = std::function<void(std::optional<std::string>)>;
  struct Waiting {
    std::optional<std::string> value;  // set: the key was there
    uint64_t waiter = 0;               // else: the id for CancelWait
  };
  absl::StatusOr<Waiting> GetOrWait(
      absl::string_view key, std::chrono::steady_clock::time_point deadline,
      WaitDone done);
  // Removes a waiter. False when its `done` has already been taken to run
  // (it then runs, or has run, once).
  bool CancelWait(uint64_t waiter);
  // Waiters registered now.
  size_t waiters() const;
  // Adds `delta` to the integer value of `key` (0 when absent) and returns
  // the result. FailedPrecondition when the value is not an integer,
  // OutOfRange when the sum overflows int64 (nothing is changed).
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta);
  // Sets `desired` when the current value equals `expected` (or when the key
  // is absent and `expected` is empty); returns the value after the call.
  absl::StatusOr<std::string> CompareSet(absl::string_view key,
                                         absl::string_view expected,
                                         absl::string_view desired);
  bool Check(const std::vector<std::string>& keys) const;
  bool Delete(absl::string_view key);
  int64_t NumKeys(absl::string_view prefix) const;
  // Removes every key with the prefix (a finished job's rendezvous).
  void DeletePrefix(absl::string_view prefix);

 private:
  using Map = std::map<std::string, std::string, std::less<>>;
  struct Usage {
    size_t keys = 0;
    size_t bytes = 0;
  };
  // Key and value within their bounds. Requires nothing.
  static absl::Status CheckSizes(absl::string_view key,
                                 absl::string_view value);
  // A waiter's callback taken to run, with what it gets.
  using Fired = std::vector<std::pair<WaitDone, std::optional<std::string>>>;
  struct Waiter {
    std::string key;
    std::chrono::steady_clock::time_point deadline;
    WaitDone done;
  };
  // Sets `key` (found at `it`, or end()) to `value` within the quotas; the
  // key's waiters move to `fired`, to be run once mu_ is released. Requires
  // mu_.
  absl::Status PutLocked(Map::iterator it, absl::string_view key,
                         absl::string_view value, Fired* fired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Add and CompareSet; the waiters they wake go to `fired`. Take mu_.
  absl::StatusOr<int64_t> AddAndCollect(absl::string_view key, int64_t delta,
                                        Fired* fired);
  absl::StatusOr<std::string> CompareSetAndCollect(absl::string_view key,
                                                   absl::string_view expected,
                                                   absl::string_view desired,
                                                   Fired* fired);
  // Unregisters a waiter (its callback is returned; null when it is not
  // registered). Requires mu_.
  WaitDone RemoveWaiterLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Run(Fired fired);
  // The expiry thread: fires waiters at their deadlines.
  void Expire() ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the key, from the database too when `persist`. Requires mu_.
  Map::iterator EraseLocked(Map::iterator it, bool persist)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  Map data_ ABSL_GUARDED_BY(mu_);
  JobStore* store_ = nullptr;
  // By namespace ("jobs/<id>/", or "" for keys outside any job); entries
  // are dropped when they empty.
  std::map<std::string, Usage, std::less<>> usage_ ABSL_GUARDED_BY(mu_);
  Usage total_ ABSL_GUARDED_BY(mu_);

  // Waiters by id, by key and by deadline; counts per namespace.
  std::map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::multimap<std::string, uint64_t, std::less<>> waiting_on_
      ABSL_GUARDED_BY(mu_);
  std::set<std::pair<std::chrono::steady_clock::time_point, uint64_t>>
      deadlines_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, size_t, std::less<>> waiters_per_ns_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 1;
  // Started with the first waiter; wakes for the earliest deadline.
  absl::CondVar expiry_wake_;
  // Started under mu_ by the first waiter; joined by the destructor once
  // stop_ is set.
  std::thread expiry_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

// The quota namespace of a key: "jobs/<id>/" for a job's keys, else "".
absl::string_view KvNamespace(absl::string_view key);

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_SERVICE_KV_STORE_H_
