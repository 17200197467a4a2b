// WorkerService over gRPC: registration, the session stream and the
// rendezvous key-value store, mapped onto the worker manager and KvStore.
// Every blocking call is bounded: KvGet waits at most kMaxKvWaitMs. With
// authentication on, each call must carry the job's join secret
// (rpc_auth.h).
#ifndef TANDEM_COORDINATOR_RPC_WORKER_SERVICE_IMPL_H_
#define TANDEM_COORDINATOR_RPC_WORKER_SERVICE_IMPL_H_

#include <chrono>

#include "coordinator/rpc/rpc_auth.h"
#include "coordinator/rpc/stream_watchdog.h"
#include "coordinator/service/kv_store.h"
#include "coordinator/service/worker_manager.h"
#include "tandem/v1/worker_service.grpc.pb.h"

namespace tandem {

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  static constexpr int64_t kMaxKvWaitMs = 60000;
  static constexpr int kMaxKeysPerCheck = 1024;

  // How long a session may stay silent: before its hello, and between
  // messages after it (workers heartbeat every second). A stream past its
  // limit is cancelled (StreamWatchdog), so idle clients cannot hold server
  // threads (coordinator/README.md, "Limits").
  struct SessionLimits {
    std::chrono::milliseconds hello_timeout{10000};
    std::chrono::milliseconds idle_timeout{60000};
  };

  WorkerServiceImpl(WorkerManager* workers, KvStore* kv, const RpcAuth* auth,
                    SessionLimits limits)
      : workers_(workers), kv_(kv), auth_(auth), limits_(limits) {}

  // Session streams the watchdog ended.
  int64_t sessions_timed_out() const { return watchdog_.cancelled(); }

  grpc::Status Register(grpc::ServerContext* context,
                        const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  // The first message must be a hello; then heartbeats, graphs, profiles,
  // progress, switches and errors until the worker hangs up. A refused
  // message is answered with MessageRejected and the session goes on.
  grpc::Status Session(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>*
          stream) override;
  grpc::Status KvSet(grpc::ServerContext* context,
                     const v1::KvSetRequest* request,
                     v1::KvSetResponse* response) override;
  grpc::Status KvGet(grpc::ServerContext* context,
                     const v1::KvGetRequest* request,
                     v1::KvGetResponse* response) override;
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
  WorkerManager* workers_;
  KvStore* kv_;
  // Join secrets and worker certificates (rpc_auth.h): checked on every
  // call, before anything is read or written.
  const RpcAuth* auth_;
  const SessionLimits limits_;
  StreamWatchdog watchdog_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_RPC_WORKER_SERVICE_IMPL_H_
