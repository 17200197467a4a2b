// Ends streams that stay silent too long: a session that sends no hello
// within its first seconds, or no message at all for a long while. Streams
// hold no thread (the callback API), but each holds memory and a place
// under the session caps, so a silent one is ended. A guard registers a
// stream with a deadline; the watchdog's one thread cancels the stream's
// context when the deadline passes, which ends its pending read. Deadlines
// are kept in order, so ten thousand streams cost a wake each, not a scan.
// Thread-safe.
#ifndef TANDEM_COORDINATOR_RPC_STREAM_WATCHDOG_H_
#define TANDEM_COORDINATOR_RPC_STREAM_WATCHDOG_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

class StreamWatchdog {
 public:
  using Clock = std::chrono::steady_clock;

  StreamWatchdog();
  // Stops the thread; every guard must be gone.
  ~StreamWatchdog();
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  // Watches one stream from construction to destruction, which must come
  // while `context` is valid (a reactor destroys its guard in OnDone).
  class Guard {
   public:
    Guard(StreamWatchdog* watchdog, grpc::ServerContextBase* context,
          std::chrono::milliseconds timeout);
    ~Guard();
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

    // The stream may stay silent `timeout` from now on.
    void Extend(std::chrono::milliseconds timeout);
    // Whether the watchdog cancelled the stream.
    bool expired() const;

   private:
    StreamWatchdog* watchdog_;
    uint64_t id_;
  };

  // Streams cancelled so far (for the metrics and tests).
  int64_t cancelled() const;
  // Streams watched now.
  size_t watched() const;

 private:
  struct Entry {
    grpc::ServerContextBase* context;
    Clock::time_point deadline;
    bool fired = false;
  };
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // The deadlines of entries not yet fired, earliest first.
  std::set<std::pair<Clock::time_point, uint64_t>> order_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_RPC_STREAM_WATCHDOG_H_
