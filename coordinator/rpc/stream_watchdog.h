// Ends streams that stay silent too long: a session that sends no hello
// within its first seconds, or no message at all for a long while, holds a
// server thread for nothing (the server is synchronous: one thread per open
// stream). A guard registers a stream with a deadline; the watchdog's thread
// cancels the stream's context when the deadline passes, which makes the
// handler's blocked Read return false. Thread-safe.
#ifndef TANDEM_COORDINATOR_RPC_STREAM_WATCHDOG_H_
#define TANDEM_COORDINATOR_RPC_STREAM_WATCHDOG_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>

namespace tandem {

class StreamWatchdog {
 public:
  StreamWatchdog();
  // Stops the thread; every guard must be gone.
  ~StreamWatchdog();
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  // Watches one stream from construction to destruction (before the
  // handler returns, while `context` is valid).
  class Guard {
   public:
    Guard(StreamWatchdog* watchdog, grpc::ServerContext* context,
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

 private:
  struct Entry {
    grpc::ServerContext* context;
    std::chrono::steady_clock::time_point deadline;
    bool fired = false;
  };
  void Run();

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::map<uint64_t, Entry> entries_;
  uint64_t next_id_ = 0;
  int64_t cancelled_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_RPC_STREAM_WATCHDOG_H_
