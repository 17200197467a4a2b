#include "worker/runtime/async_work.h"

#include <utility>

namespace tandem {
namespace {

double Seconds(SteadyTime from, SteadyTime to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

AsyncWork::AsyncWork(Kind kind)
    : kind_(kind), issued_(std::chrono::steady_clock::now()) {}

std::shared_ptr<AsyncWork> AsyncWork::RunInline(
    Kind kind, const std::function<void()>& body) {
  auto handle = std::make_shared<AsyncWork>(kind);
  {
    absl::MutexLock lock(&handle->mu_);
    handle->started_ = handle->issued_;
  }
  body();
  handle->Finish(absl::OkStatus());
  return handle;
}

absl::Status AsyncWork::Wait() {
  absl::MutexLock lock(&mu_);
  if (!done_) {
    const SteadyTime start = std::chrono::steady_clock::now();
    while (!done_) cv_.Wait(&mu_);
    // Until completion, not until this thread woke: the wake-up latency is
    // scheduling, not communication.
    if (finished_ > start) waited_s_ += Seconds(start, finished_);
  }
  return status_;
}

bool AsyncWork::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

double AsyncWork::issue_to_done_s() const {
  absl::MutexLock lock(&mu_);
  return done_ ? Seconds(issued_, finished_) : 0;
}

double AsyncWork::run_s() const {
  absl::MutexLock lock(&mu_);
  return done_ ? Seconds(started_, finished_) : 0;
}

SteadyTime AsyncWork::started_at() const {
  absl::MutexLock lock(&mu_);
  return started_;
}

SteadyTime AsyncWork::finished_at() const {
  absl::MutexLock lock(&mu_);
  return finished_;
}

double AsyncWork::waited_s() const {
  absl::MutexLock lock(&mu_);
  return waited_s_;
}

void AsyncWork::MarkStarted() {
  absl::MutexLock lock(&mu_);
  started_ = std::chrono::steady_clock::now();
}

void AsyncWork::Finish(absl::Status status) {
  absl::MutexLock lock(&mu_);
  status_ = std::move(status);
  finished_ = std::chrono::steady_clock::now();
  done_ = true;
  cv_.SignalAll();
}

}  // namespace tandem
