// A piece of work handed to one of the runtime's background threads and
// waited for by others: a collective on the Communicator's communication
// thread, or a copy on the HostTier's copy thread. The thread that runs it
// marks it started and finishes it; any thread may wait for it. Its times
// (issue to done, run, waited) are what the profiler and the iteration
// timeline record.
#ifndef TANDEM_WORKER_RUNTIME_ASYNC_WORK_H_
#define TANDEM_WORKER_RUNTIME_ASYNC_WORK_H_

#include <chrono>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

using SteadyTime = std::chrono::steady_clock::time_point;

class AsyncWork {
 public:
  enum class Kind {
    kCollective,  // on the communication thread (communicator.h)
    kHostCopy,    // on the host tier's copy thread (host_tier.h)
  };

  // Issued now.
  explicit AsyncWork(Kind kind);

  // Runs `body` on the calling thread and returns its handle, done: a world
  // of one has nothing to move, so its "collectives" are local copies that
  // need no communication thread. started_at/finished_at bracket `body`;
  // an exception it throws propagates to the caller.
  static std::shared_ptr<AsyncWork> RunInline(
      Kind kind, const std::function<void()>& body);

  Kind kind() const { return kind_; }

  // Blocks until the work finished and returns its status. The time spent
  // blocked is added to waited_s().
  absl::Status Wait();
  bool done() const;

  // Valid once done: seconds from submission to completion, and the part of
  // it callers spent blocked in Wait (the exposed communication or copy).
  double issue_to_done_s() const;
  double waited_s() const;
  // Valid once done: seconds it ran on its thread (start to completion),
  // i.e. issue_to_done_s less the queueing.
  double run_s() const;
  // Valid once done: when it started running and when it finished (the
  // iteration timeline places it with these).
  SteadyTime started_at() const;
  SteadyTime finished_at() const;

  // For the thread that runs it: it starts now; it finished with `status`
  // (wakes the waiters).
  void MarkStarted();
  void Finish(absl::Status status);

 private:
  const Kind kind_;
  const SteadyTime issued_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  SteadyTime started_ ABSL_GUARDED_BY(mu_);
  SteadyTime finished_ ABSL_GUARDED_BY(mu_);
  double waited_s_ ABSL_GUARDED_BY(mu_) = 0;
};
using AsyncHandle = std::shared_ptr<AsyncWork>;

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_ASYNC_WORK_H_
