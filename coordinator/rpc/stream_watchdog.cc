#include "coordinator/rpc/stream_watchdog.h"

namespace tandem {

StreamWatchdog::StreamWatchdog() : thread_([this] { Run(); }) {}

StreamWatchdog::~StreamWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StreamWatchdog::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const auto now = std::chrono::steady_clock::now();
    auto next = now + std::chrono::seconds(1);
    for (auto& [id, e] : entries_) {
      if (e.fired) continue;
      if (e.deadline <= now) {
        e.fired = true;
        ++cancelled_;
        // Safe under mu_: the guard unregisters (under mu_) before its
        // handler returns and the context goes away.
        e.context->TryCancel();
      } else if (e.deadline < next) {
        next = e.deadline;
      }
    }
    wake_.wait_until(lock, next);
  }
}

int64_t StreamWatchdog::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

StreamWatchdog::Guard::Guard(StreamWatchdog* watchdog,
                             grpc::ServerContext* context,
                             std::chrono::milliseconds timeout)
    : watchdog_(watchdog) {
  {
    std::lock_guard<std::mutex> lock(watchdog_->mu_);
    id_ = watchdog_->next_id_++;
    watchdog_->entries_[id_] = {
        context, std::chrono::steady_clock::now() + timeout, false};
  }
  watchdog_->wake_.notify_all();
}

StreamWatchdog::Guard::~Guard() {
  std::lock_guard<std::mutex> lock(watchdog_->mu_);
  watchdog_->entries_.erase(id_);
}

void StreamWatchdog::Guard::Extend(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(watchdog_->mu_);
  watchdog_->entries_[id_].deadline =
      std::chrono::steady_clock::now() + timeout;
}

bool StreamWatchdog::Guard::expired() const {
  std::lock_guard<std::mutex> lock(watchdog_->mu_);
  return watchdog_->entries_.at(id_).fired;
}

}  // namespace tandem
