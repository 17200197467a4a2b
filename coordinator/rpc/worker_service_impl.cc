#include "coordinator/rpc/worker_service_impl.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/rpc/status_util.h"

namespace tandem {
namespace {

// Writes to one session stream; safe from any thread, and a no-op once the
// handler that owns the stream has returned.
class GrpcSessionSink : public SessionSink {
 public:
  using Stream =
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>;
  explicit GrpcSessionSink(Stream* stream) : stream_(stream) {}

  bool Send(const v1::CoordinatorMessage& message) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_ == nullptr) return false;
    return stream_->Write(message);
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    stream_ = nullptr;
  }

 private:
  std::mutex mu_;
  Stream* stream_;
};

const char* PayloadName(const v1::WorkerMessage& m) {
  switch (m.payload_case()) {
    case v1::WorkerMessage::kHello:
      return "hello";
    case v1::WorkerMessage::kHeartbeat:
      return "heartbeat";
    case v1::WorkerMessage::kGraph:
      return "graph";
    case v1::WorkerMessage::kProfile:
      return "profile";
    case v1::WorkerMessage::kProgress:
      return "progress";
    case v1::WorkerMessage::kApplied:
      return "applied";
    case v1::WorkerMessage::kError:
      return "error";
    default:
      return "empty";
  }
}

}  // namespace

grpc::Status WorkerServiceImpl::Register(grpc::ServerContext* context,
                                         const v1::RegisterRequest* request,
                                         v1::RegisterResponse* response) {
  if (grpc::Status s = auth_->CheckWorker(*context, request->job_id());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<v1::RegisterResponse> r = workers_->Register(*request);
  if (!r.ok()) return ToGrpc(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Session(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>*
        stream) {
  StreamWatchdog::Guard guard(&watchdog_, context, limits_.hello_timeout);
  v1::WorkerMessage message;
  if (!stream->Read(&message)) {
    if (guard.expired()) {
      return grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat(
              "no hello within ",
              absl::FormatDuration(absl::FromChrono(limits_.hello_timeout)),
              ": a session starts with a hello at once"));
    }
    return grpc::Status::OK;
  }
  guard.Extend(limits_.idle_timeout);
  if (message.payload_case() != v1::WorkerMessage::kHello) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a session starts with a hello (job, rank, "
                        "incarnation)");
  }
  if (grpc::Status s = auth_->CheckWorker(*context, message.hello().job_id());
      !s.ok()) {
    return s;
  }
  auto sink = std::make_shared<GrpcSessionSink>(stream);
  absl::StatusOr<int64_t> session =
      workers_->OpenSession(message.hello(), sink);
  if (!session.ok()) {
    sink->Close();
    return ToGrpc(session.status());
  }
  while (stream->Read(&message)) {
    guard.Extend(limits_.idle_timeout);
    absl::Status s = workers_->OnMessage(*session, message);
    if (!s.ok()) {
      v1::CoordinatorMessage rejected;
      rejected.mutable_rejected()->set_payload(PayloadName(message));
      rejected.mutable_rejected()->set_message(std::string(s.message()));
      sink->Send(rejected);
    }
  }
  workers_->CloseSession(*session);
  sink->Close();
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::KvSet(grpc::ServerContext* context,
                                      const v1::KvSetRequest* request,
                                      v1::KvSetResponse*) {
  if (grpc::Status s = auth_->CheckWorkerKey(*context, request->key());
      !s.ok()) {
    return s;
  }
  return ToGrpc(kv_->Set(request->key(), request->value()));
}

grpc::Status WorkerServiceImpl::KvGet(grpc::ServerContext* context,
                                      const v1::KvGetRequest* request,
                                      v1::KvGetResponse* response) {
  if (grpc::Status s = auth_->CheckWorkerKey(*context, request->key());
      !s.ok()) {
    return s;
  }
  const int64_t wait =
      std::clamp<int64_t>(request->timeout_ms(), 0, kMaxKvWaitMs);
  absl::StatusOr<std::optional<std::string>> v =
      kv_->Get(request->key(), std::chrono::milliseconds(wait));
  if (!v.ok()) return ToGrpc(v.status());
  response->set_found(v->has_value());
  if (v->has_value()) response->set_value(**v);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::KvAdd(grpc::ServerContext* context,
                                      const v1::KvAddRequest* request,
                                      v1::KvAddResponse* response) {
  if (grpc::Status s = auth_->CheckWorkerKey(*context, request->key());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<int64_t> v = kv_->Add(request->key(), request->delta());
  if (!v.ok()) return ToGrpc(v.status());
  response->set_value(*v);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::KvCompareSet(
    grpc::ServerContext* context, const v1::KvCompareSetRequest* request,
    v1::KvCompareSetResponse* response) {
  if (grpc::Status s = auth_->CheckWorkerKey(*context, request->key());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::string> v =
      kv_->CompareSet(request->key(), request->expected(), request->desired());
  if (!v.ok()) return ToGrpc(v.status());
  response->set_value(*std::move(v));
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::KvCheck(grpc::ServerContext* context,
                                        const v1::KvCheckRequest* request,
                                        v1::KvCheckResponse* response) {
  if (request->keys_size() > kMaxKeysPerCheck) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "KvCheck takes at most 1024 keys per call");
  }
  for (const std::string& key : request->keys()) {
    if (grpc::Status s = auth_->CheckWorkerKey(*context, key); !s.ok()) {
      return s;
    }
  }
  response->set_ready(
      kv_->Check({request->keys().begin(), request->keys().end()}));
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::KvDelete(grpc::ServerContext* context,
                                         const v1::KvDeleteRequest* request,
                                         v1::KvDeleteResponse* response) {
  if (grpc::Status s = auth_->CheckWorkerKey(*context, request->key());
      !s.ok()) {
    return s;
  }
  response->set_deleted(kv_->Delete(request->key()));
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::KvNumKeys(grpc::ServerContext* context,
                                          const v1::KvNumKeysRequest* request,
                                          v1::KvNumKeysResponse* response) {
  if (grpc::Status s = auth_->CheckWorkerKey(*context, request->prefix());
      !s.ok()) {
    return s;
  }
  response->set_count(kv_->NumKeys(request->prefix()));
  return grpc::Status::OK;
}

}  // namespace tandem
