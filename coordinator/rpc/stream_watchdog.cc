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
    const Clock::time_point now = Clock::now();
    while (!order_.empty() && order_.begin()->first <= now) {
      Entry& e = entries_.at(order_.begin()->second);
      order_.erase(order_.begin());
      e.fired = true;
      ++cancelled_;
      // Safe under mu_: the guard unregisters (under mu_) before its
      // stream's context goes away. TryCancel runs no reaction inline.
      e.context->TryCancel();
    }
    if (order_.empty()) {
      wake_.wait(lock);
    } else {
      wake_.wait_until(lock, order_.begin()->first);
    }
  }
}

int64_t StreamWatchdog::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

size_t StreamWatchdog::watched() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

StreamWatchdog::Guard::Guard(StreamWatchdog* watchdog,
                             grpc::ServerContextBase* context,
                             std::chrono::milliseconds timeout)
    : watchdog_(watchdog) {
  const Clock::time_point deadline = Clock::now() + timeout;
  bool earliest;
  {
    std::lock_guard<std::mutex> lock(watchdog_->mu_);
    id_ = watchdog_->next_id_++;
    watchdog_->entries_[id_] = {context, deadline, false};
    earliest = watchdog_->order_.empty() ||
               deadline < watchdog_->order_.begin()->first;
    watchdog_->order_.emplace(deadline, id_);
  }
  if (earliest) watchdog_->wake_.notify_all();
}

StreamWatchdog::Guard::~Guard() {
  std::lock_guard<std::mutex> lock(watchdog_->mu_);
  auto it = watchdog_->entries_.find(id_);
  if (!it->second.fired) watchdog_->order_.erase({it->second.deadline, id_});
  watchdog_->entries_.erase(it);
}

void StreamWatchdog::Guard::Extend(std::chrono::milliseconds timeout) {
  bool earliest;
  {
    std::lock_guard<std::mutex> lock(watchdog_->mu_);
    Entry& e = watchdog_->entries_.at(id_);
    if (e.fired) return;  // too late: the stream is being cancelled
    watchdog_->order_.erase({e.deadline, id_});
    e.deadline = Clock::now() + timeout;
    earliest = watchdog_->order_.empty() ||
               e.deadline < watchdog_->order_.begin()->first;
    watchdog_->order_.emplace(e.deadline, id_);
  }
  if (earliest) watchdog_->wake_.notify_all();
}

bool StreamWatchdog::Guard::expired() const {
  std::lock_guard<std::mutex> lock(watchdog_->mu_);
  return watchdog_->entries_.at(id_).fired;
}

}  // namespace tandem
