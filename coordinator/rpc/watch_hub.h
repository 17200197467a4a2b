// Every JobService.Watch stream, driven from one thread, so that a watch
// holds no thread while its job is quiet (coordinator/README.md, "Limits").
// The hub wakes when any job changes (JobManager's change listener), when a
// stream's writes drain, and every `recheck` (500 ms), when it also checks
// each stream's token again: a revoked token ends its streams within that,
// with the answer a new call would get. A stream is only given more once
// its earlier messages are written, so a client that reads slowly gets its
// progress coalesced, never an unbounded queue, and events are never
// skipped (each stream resumes after the last event it was sent). Each user
// may hold `max_streams_per_user` watches; past it, RESOURCE_EXHAUSTED.
#ifndef TANDEM_COORDINATOR_RPC_WATCH_HUB_H_
#define TANDEM_COORDINATOR_RPC_WATCH_HUB_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/security/token_table.h"
#include "coordinator/rpc/rpc_auth.h"
#include "coordinator/service/job_manager.h"
#include "tandem/v1/job_service.pb.h"

namespace tandem {

class WatchHub {
 public:
  struct Limits {
    int max_streams_per_user = 128;
    std::chrono::milliseconds recheck{500};
  };
  using Reactor = grpc::ServerWriteReactor<v1::WatchJobResponse>;

  // Installs itself as `jobs`' change listener; both must outlive it.
  WatchHub(JobManager* jobs, const RpcAuth* auth, Limits limits);
  // Stops the thread. Every stream must have ended (the server shut down).
  ~WatchHub();
  WatchHub(const WatchHub&) = delete;
  WatchHub& operator=(const WatchHub&) = delete;

  // The stream for one Watch whose caller may read `job` (already
  // authorized): sends the job at once, then its events after
  // `request.after_seq()` and its progress until the job ends or the
  // client goes away.
  Reactor* Open(grpc::CallbackServerContext* context,
                const v1::WatchJobRequest& request, const Principal& caller,
                v1::Job job);
  // A stream that ends at once with `status`.
  static Reactor* Refuse(grpc::Status status);

  // Streams open now.
  int64_t streams() const;

 private:
  class Stream;
  void Wake() ABSL_LOCKS_EXCLUDED(wake_mu_);
  void Run() ABSL_LOCKS_EXCLUDED(wake_mu_, mu_);
  void Remove(Stream* stream) ABSL_LOCKS_EXCLUDED(mu_);

  JobManager* jobs_;
  const RpcAuth* auth_;
  const Limits limits_;

  // The streams, and how many each user holds. Held while the thread works
  // on them, so a stream is deleted (OnDone, which takes it) only between.
  mutable absl::Mutex mu_;
  std::set<Stream*> streams_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> per_user_ ABSL_GUARDED_BY(mu_);

  absl::Mutex wake_mu_;
  absl::CondVar wake_cv_;
  bool woken_ ABSL_GUARDED_BY(wake_mu_) = false;
  bool stop_ ABSL_GUARDED_BY(wake_mu_) = false;
  std::thread thread_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_RPC_WATCH_HUB_H_
