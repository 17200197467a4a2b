// WorkerService over gRPC: registration, the session stream and the
// rendezvous key-value store, mapped onto the worker manager and KvStore.
// The session stream and KvGet use gRPC's callback API: an open session, a
// silent one and a KvGet waiting for its key hold no thread, and a client
// that goes away frees its waiter at once (coordinator/README.md, "Limits").
// The other calls answer at once on the server's bounded pool. KvGet waits
// at most kMaxKvWaitMs. With authentication on, each call must carry the
// job's join secret (rpc_auth.h).
#ifndef TANDEM_COORDINATOR_RPC_WORKER_SERVICE_IMPL_H_
#define TANDEM_COORDINATOR_RPC_WORKER_SERVICE_IMPL_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/rpc/rpc_auth.h"
#include "coordinator/rpc/stream_watchdog.h"
#include "coordinator/service/kv_store.h"
#include "coordinator/service/worker_manager.h"
#include "tandem/v1/worker_service.grpc.pb.h"

namespace tandem {

class WorkerServiceImpl final
    : public v1::WorkerService::WithCallbackMethod_Session<
          v1::WorkerService::WithCallbackMethod_KvGet<
              v1::WorkerService::Service>> {
 public:
  static constexpr int64_t kMaxKvWaitMs = 60000;
  static constexpr int kMaxKeysPerCheck = 1024;

  // How long a session may stay silent: before its hello, and between
  // messages after it (workers heartbeat every second); a stream past its
  // limit is cancelled (StreamWatchdog). And how many sessions may wait for
  // their hello at once, in all and from one peer address: past either, a
  // new session is refused at once (RESOURCE_EXHAUSTED naming the flag), so
  // anonymous clients cannot crowd out workers (coordinator/README.md,
  // "Limits").
  struct SessionLimits {
    std::chrono::milliseconds hello_timeout{10000};
    std::chrono::milliseconds idle_timeout{60000};
    int max_pending = 4096;
    int max_pending_per_peer = 256;
  };

  WorkerServiceImpl(WorkerManager* workers, KvStore* kv, const RpcAuth* auth,
                    SessionLimits limits)
      : workers_(workers), kv_(kv), auth_(auth), limits_(limits) {}

  // Session streams the watchdog ended.
  int64_t sessions_timed_out() const { return watchdog_.cancelled(); }
  // Sessions open now, and those of them still waiting for their hello.
  int64_t sessions_open() const;
  int64_t sessions_pending() const;

  grpc::Status Register(grpc::ServerContext* context,
                        const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  // The first message must be a hello; then heartbeats, graphs, profiles,
  // progress, switches and errors until the worker hangs up. A refused
  // message is answered with MessageRejected and the session goes on.
  grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* Session(
      grpc::CallbackServerContext* context) override;
  grpc::Status KvSet(grpc::ServerContext* context,
                     const v1::KvSetRequest* request,
                     v1::KvSetResponse* response) override;
  // Answers at once when the key is there or the request's timeout is 0;
  // otherwise waits, holding no thread, until the key is set, the timeout
  // passes or the client goes away.
  grpc::ServerUnaryReactor* KvGet(grpc::CallbackServerContext* context,
                                  const v1::KvGetRequest* request,
                                  v1::KvGetResponse* response) override;
  // KvGet's answer without waiting (timeout 0), for callers outside a
  // server (tests/fuzz/service_fuzzer.cc).
  grpc::Status KvGetNow(grpc::ServerContextBase* context,
                        const v1::KvGetRequest* request,
                        v1::KvGetResponse* response);
  grpc::Status KvAdd(grpc::ServerContext* context,
                     const v1::KvAddRequest* request,
                     v1::KvAddResponse* response) override;
  grpc::Status KvCompareSet(grpc::ServerContext* context,
                            const v1::KvCompareSetRequest* request,
                            v1::KvCompareSetResponse* response) override;
  grpc::Status KvCheck(grpc::ServerContext* context,
                       const v1::KvCheckRequest* request,
                       v1::KvCheckResponse* response) override;
  grpc::Status KvDelete(grpc::ServerContext* context,
                        const v1::KvDeleteRequest* request,
                        v1::KvDeleteResponse* response) override;
  grpc::Status KvNumKeys(grpc::ServerContext* context,
                         const v1::KvNumKeysRequest* request,
                         v1::KvNumKeysResponse* response) override;

 private:
  class SessionReactor;
  class KvGetReactor;

  // Takes a place for a session awaiting its hello from `peer` (an
  // address without its port); a refusal says which cap is full.
  grpc::Status AdmitPending(const std::string& peer);
  // Gives the place back (at the hello, or when the stream ends).
  void ReleasePending(const std::string& peer);

  WorkerManager* workers_;
  KvStore* kv_;
  // Join secrets and worker certificates (rpc_auth.h): checked on every
  // call, before anything is read or written.
  const RpcAuth* auth_;
  const SessionLimits limits_;
  StreamWatchdog watchdog_;
  mutable absl::Mutex mu_;
  int64_t open_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int, std::less<>> pending_by_peer_ ABSL_GUARDED_BY(mu_);
};

// The host part of a gRPC peer string ("ipv4:10.0.0.1:5000" ->
// "ipv4:10.0.0.1", "ipv6:[::1]:5000" -> "ipv6:[::1]"); others unchanged.
std::string PeerHost(const std::string& peer);

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_RPC_WORKER_SERVICE_IMPL_H_
