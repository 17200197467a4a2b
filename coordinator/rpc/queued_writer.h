// The write side of one callback-API server stream: messages queued from
// any thread and written one at a time (gRPC allows one write in flight),
// then the stream's status once the queue has drained. A failed write ends
// the stream (CANCELLED: the client is gone). Thread-safe; the reactor's
// OnWriteDone forwards here, and its OnDone calls Detach before it is
// deleted, after which nothing reaches the reactor.
#ifndef TANDEM_COORDINATOR_RPC_QUEUED_WRITER_H_
#define TANDEM_COORDINATOR_RPC_QUEUED_WRITER_H_

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <deque>
#include <mutex>
#include <utility>

namespace tandem {

// Reactor: grpc::ServerWriteReactor<Message> or
// grpc::ServerBidiReactor<Request, Message>.
template <typename Reactor, typename Message>
class QueuedWriter {
 public:
  explicit QueuedWriter(Reactor* reactor) : reactor_(reactor) {}
  QueuedWriter(const QueuedWriter&) = delete;
  QueuedWriter& operator=(const QueuedWriter&) = delete;

  enum class Pushed { kQueued, kEnded, kFull };
  // Queues `message` unless the stream is ending or `max_queued` messages
  // wait already.
  Pushed Push(Message message, size_t max_queued) {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr || finishing_) return Pushed::kEnded;
    if (queue_.size() >= max_queued) return Pushed::kFull;
    queue_.push_back(std::move(message));
    if (queue_.size() == 1) reactor_->StartWrite(&queue_.front());
    return Pushed::kQueued;
  }

  void OnWriteDone(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr) return;
    queue_.pop_front();
    if (!ok && !finishing_) {
      queue_.clear();
      finishing_ = true;
      status_ = grpc::Status(grpc::StatusCode::CANCELLED,
                             "the stream broke: the client is gone");
    }
    if (!queue_.empty()) {
      reactor_->StartWrite(&queue_.front());
    } else if (finishing_ && !finished_) {
      finished_ = true;
      reactor_->Finish(status_);
    }
  }

  // Ends the stream with `status` once what is queued is written. Only the
  // first call counts.
  void Finish(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr || finishing_) return;
    finishing_ = true;
    status_ = std::move(status);
    if (queue_.empty()) {
      finished_ = true;
      reactor_->Finish(status_);
    }
  }

  // Nothing queued, nothing being written, not ending: ready for more.
  bool Idle() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reactor_ != nullptr && !finishing_ && queue_.empty();
  }

  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    reactor_ = nullptr;
    queue_.clear();
  }

 private:
  mutable std::mutex mu_;
  Reactor* reactor_;
  // The front is being written; a deque keeps its address while more are
  // added.
  std::deque<Message> queue_;
  bool finishing_ = false;
  bool finished_ = false;
  grpc::Status status_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_RPC_QUEUED_WRITER_H_
