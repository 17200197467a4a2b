#include "coordinator/rpc/stream_watchdog.h"

#include "absl/time/time.h"

namespace tandem {

StreamWatchdog::StreamWatchdog() : thread_([this] { Run(); }) {}

StreamWatchdog::~StreamWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  wake_.SignalAll();
  thread_.join();
}

void StreamWatchdog::Run() {
  mu_.Lock();
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
      wake_.Wait(&mu_);
    } else {
      wake_.WaitWithTimeout(
          &mu_, absl::FromChrono(order_.begin()->first - Clock::now()));
    }
  }
  mu_.Unlock();
}

int64_t StreamWatchdog::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

size_t StreamWatchdog::watched() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

StreamWatchdog::Guard::Guard(StreamWatchdog* watchdog,
                             grpc::ServerContextBase* context,
                             std::chrono::milliseconds timeout)
    : watchdog_(watchdog) {
  const Clock::time_point deadline = Clock::now() + timeout;
  bool earliest;
  {
    absl::MutexLock lock(&watchdog_->mu_);
    id_ = watchdog_->next_id_++;
    watchdog_->entries_[id_] = {context, deadline, false};
    earliest = watchdog_->order_.empty() ||
               deadline < watchdog_->order_.begin()->first;
    watchdog_->order_.emplace(deadline, id_);
  }
  if (earliest) watchdog_->wake_.SignalAll();
}

StreamWatchdog::Guard::~Guard() {
  absl::MutexLock lock(&watchdog_->mu_);
  auto it = watchdog_->entries_.find(id_);
  if (!it->second.fired) watchdog_->order_.erase({it->second.deadline, id_});
  watchdog_->entries_.erase(it);
}

void StreamWatchdog::Guard::Extend(std::chrono::milliseconds timeout) {
  bool earliest;
  {
    absl::MutexLock lock(&watchdog_->mu_);
    Entry& e = watchdog_->entries_.at(id_);
    if (e.fired) return;  // too late: the stream is being cancelled
    watchdog_->order_.erase({e.deadline, id_});
    e.deadline = Clock::now() + timeout;
    earliest = watchdog_->order_.empty() ||
               e.deadline < watchdog_->order_.begin()->first;
    watchdog_->order_.emplace(e.deadline, id_);
  }
  if (earliest) watchdog_->wake_.SignalAll();
}

bool StreamWatchdog::Guard::expired() const {
  absl::MutexLock lock(&watchdog_->mu_);
  return watchdog_->entries_.at(id_).fired;
}

}  // namespace tandem
