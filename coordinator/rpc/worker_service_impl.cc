#include "coordinator/rpc/worker_service_impl.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/rpc/queued_writer.h"
#include "coordinator/rpc/status_util.h"

namespace tandem {
namespace {

// The downstream half of one session, for the worker manager, which holds
// it past the stream's end (Send then returns false).
class SessionWriter : public SessionSink {
 public:
  using Reactor =
      grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>;
  // A worker that reads nothing while this many messages wait is ended (it
  // reconnects and is sent the newest schedule).
  static constexpr size_t kMaxQueued = 256;

  SessionWriter(Reactor* reactor, grpc::ServerContextBase* context)
      : writer_(reactor), context_(context) {}

  bool Send(const v1::CoordinatorMessage& message) override {
    switch (writer_.Push(message, kMaxQueued)) {
      case Writer::Pushed::kQueued:
        return true;
      case Writer::Pushed::kFull: {
        // Ends the pending read, and so the stream. The context lives
        // until OnDone, which detaches this first.
        std::lock_guard<std::mutex> lock(mu_);
        if (context_ != nullptr && !overflowed_) {
          overflowed_ = true;
          context_->TryCancel();
        }
        return false;
      }
      case Writer::Pushed::kEnded:
        return false;
    }
    return false;
  }
  void OnWriteDone(bool ok) { writer_.OnWriteDone(ok); }
  void Finish(grpc::Status status) { writer_.Finish(std::move(status)); }
  void Detach() {
    writer_.Detach();
    std::lock_guard<std::mutex> lock(mu_);
    context_ = nullptr;
  }

 private:
  using Writer = QueuedWriter<Reactor, v1::CoordinatorMessage>;
  Writer writer_;
  std::mutex mu_;
  grpc::ServerContextBase* context_;
  bool overflowed_ = false;
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

std::string PeerHost(const std::string& peer) {
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) {
    return peer;
  }
  const size_t colon = peer.rfind(':');
  return colon <= 4 ? peer : peer.substr(0, colon);
}

// One worker's session. Reads run on gRPC's callback threads, one at a time;
// writes go through the SessionWriter; the watchdog cancels the stream when
// it stays silent. Deletes itself when gRPC is done with it.
class WorkerServiceImpl::SessionReactor
    : public grpc::ServerBidiReactor<v1::WorkerMessage,
                                     v1::CoordinatorMessage> {
 public:
  SessionReactor(WorkerServiceImpl* service,
                 grpc::CallbackServerContext* context)
      : service_(service),
        context_(context),
        peer_(PeerHost(context->peer())),
        guard_(&service->watchdog_, context, service->limits_.hello_timeout),
        writer_(std::make_shared<SessionWriter>(this, context)) {
    if (grpc::Status s = service_->AdmitPending(peer_); !s.ok()) {
      writer_->Finish(s);
      return;
    }
    pending_ = true;
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Ended();
      return;
    }
    guard_.Extend(service_->limits_.idle_timeout);
    if (session_ < 0) {
      Hello();
      return;
    }
    absl::Status s = service_->workers_->OnMessage(session_, in_);
    if (!s.ok()) {
      v1::CoordinatorMessage rejected;
      rejected.mutable_rejected()->set_payload(PayloadName(in_));
      rejected.mutable_rejected()->set_message(std::string(s.message()));
      writer_->Send(rejected);
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override { writer_->OnWriteDone(ok); }

  void OnDone() override {
    writer_->Detach();
    if (pending_) service_->ReleasePending(peer_);
    {
      absl::MutexLock lock(&service_->mu_);
      --service_->open_;
    }
    delete this;
  }

 private:
  void Hello() {
    service_->ReleasePending(peer_);
    pending_ = false;
    if (in_.payload_case() != v1::WorkerMessage::kHello) {
      writer_->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   "a session starts with a hello (job, rank, "
                                   "incarnation)"));
      return;
    }
    if (grpc::Status s =
            service_->auth_->CheckWorker(*context_, in_.hello().job_id());
        !s.ok()) {
      writer_->Finish(s);
      return;
    }
    absl::StatusOr<int64_t> session =
        service_->workers_->OpenSession(in_.hello(), writer_);
    if (!session.ok()) {
      writer_->Finish(ToGrpc(session.status()));
      return;
    }
    session_ = *session;
    StartRead(&in_);
  }

  // The worker hung up, went away, or the watchdog ended the stream.
  void Ended() {
    if (session_ >= 0) {
      service_->workers_->CloseSession(session_);
    } else if (guard_.expired()) {
      writer_->Finish(grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat("no hello within ",
                       absl::FormatDuration(
                           absl::FromChrono(service_->limits_.hello_timeout)),
                       ": a session starts with a hello at once")));
      return;
    }
    writer_->Finish(grpc::Status::OK);
  }

  WorkerServiceImpl* service_;
  grpc::CallbackServerContext* context_;
  const std::string peer_;
  StreamWatchdog::Guard guard_;
  std::shared_ptr<SessionWriter> writer_;
  v1::WorkerMessage in_;
  bool pending_ = false;
  int64_t session_ = -1;
};

grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>*
WorkerServiceImpl::Session(grpc::CallbackServerContext* context) {
  {
    absl::MutexLock lock(&mu_);
    ++open_;
  }
  return new SessionReactor(this, context);
}

grpc::Status WorkerServiceImpl::AdmitPending(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  auto it = pending_by_peer_.find(peer);
  const int from_peer = it == pending_by_peer_.end() ? 0 : it->second;
  if (from_peer >= limits_.max_pending_per_peer) {
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat(from_peer, " sessions from ", peer,
                     " are waiting for their hello, the most one address may "
                     "have (--max-pending-sessions-per-peer); a session sends "
                     "its hello at once"));
  }
  if (pending_ >= limits_.max_pending) {
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat(pending_,
                     " sessions are waiting for their hello, the most this "
                     "coordinator holds (--max-pending-sessions); retry "
                     "shortly"));
  }
  ++pending_;
  if (it == pending_by_peer_.end()) {
    pending_by_peer_.emplace(peer, 1);
  } else {
    ++it->second;
  }
  return grpc::Status::OK;
}

void WorkerServiceImpl::ReleasePending(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  --pending_;
  auto it = pending_by_peer_.find(peer);
  if (it != pending_by_peer_.end() && --it->second == 0) {
    pending_by_peer_.erase(it);
  }
}

int64_t WorkerServiceImpl::sessions_open() const {
  absl::MutexLock lock(&mu_);
  return open_;
}

int64_t WorkerServiceImpl::sessions_pending() const {
  absl::MutexLock lock(&mu_);
  return pending_;
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

// One KvGet that waits for its key: a KvStore waiter, answered by whoever
// sets the key, by the store's expiry thread at the timeout, or cancelled
// when the client goes away. Exactly one of them finishes the call: the
// store runs a waiter once, and CancelWait fails once it has been taken.
class WorkerServiceImpl::KvGetReactor : public grpc::ServerUnaryReactor {
 public:
  KvGetReactor(KvStore* kv, v1::KvGetResponse* response)
      : kv_(kv), response_(response) {}

  void Start(const std::string& key, std::chrono::milliseconds wait) {
    std::lock_guard<std::mutex> lock(mu_);
    absl::StatusOr<KvStore::Waiting> w = kv_->GetOrWait(
        key, std::chrono::steady_clock::now() + wait,
        [this](std::optional<std::string> value) { Answer(std::move(value)); });
    if (!w.ok()) {
      FinishLocked(ToGrpc(w.status()));
    } else if (w->value.has_value()) {
      response_->set_found(true);
      response_->set_value(*std::move(w->value));
      FinishLocked(grpc::Status::OK);
    } else {
      waiter_ = w->waiter;
    }
  }

  void FinishWith(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    FinishLocked(std::move(status));
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    // Not yet answered, and the store has not taken the waiter to run.
    if (done_ || waiter_ == 0 || !kv_->CancelWait(waiter_)) return;
    FinishLocked(
        grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
  }

  void OnDone() override {
    // Whoever finished has let go of mu_ before it is destroyed.
    { std::lock_guard<std::mutex> lock(mu_); }
    delete this;
  }

 private:
  void Answer(std::optional<std::string> value) {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    response_->set_found(value.has_value());
    if (value.has_value()) response_->set_value(*std::move(value));
    FinishLocked(grpc::Status::OK);
  }

  void FinishLocked(grpc::Status status) {
    done_ = true;
    Finish(std::move(status));
  }

  KvStore* kv_;
  v1::KvGetResponse* response_;
  std::mutex mu_;
  uint64_t waiter_ = 0;
  bool done_ = false;
};

grpc::ServerUnaryReactor* WorkerServiceImpl::KvGet(
    grpc::CallbackServerContext* context, const v1::KvGetRequest* request,
    v1::KvGetResponse* response) {
  auto* reactor = new KvGetReactor(kv_, response);
  const int64_t wait =
      std::clamp<int64_t>(request->timeout_ms(), 0, kMaxKvWaitMs);
  if (wait == 0) {  // checks the caller itself
    reactor->FinishWith(KvGetNow(context, request, response));
    return reactor;
  }
  if (grpc::Status s = auth_->CheckWorkerKey(*context, request->key());
      !s.ok()) {
    reactor->FinishWith(s);
    return reactor;
  }
  reactor->Start(request->key(), std::chrono::milliseconds(wait));
  return reactor;
}

grpc::Status WorkerServiceImpl::KvGetNow(grpc::ServerContextBase* context,
                                         const v1::KvGetRequest* request,
                                         v1::KvGetResponse* response) {
  if (grpc::Status s = auth_->CheckWorkerKey(*context, request->key());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::optional<std::string>> v =
      kv_->Get(request->key(), std::chrono::milliseconds(0));
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
