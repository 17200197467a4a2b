#include "worker/agent/grpc_coordinator_client.h"

#include "absl/strings/str_cat.h"

namespace tandem {

GrpcCoordinatorClient::GrpcCoordinatorClient(
    const std::string& address, CoordinatorCredentials credentials,
    std::chrono::milliseconds rpc_timeout)
    : address_(address),
      rpc_timeout_(rpc_timeout),
      join_secret_(std::move(credentials.join_secret)) {
  grpc::ChannelArguments args;
  // Reconnect quickly when the coordinator comes back: a restart must be
  // over well within its heartbeat timeout (15 s by default). Attempts start
  // 100-500 ms apart; each may take gRPC's default 20 s to connect.
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is not a backoff but that connect
  // timeout, for the TCP connect, the TLS handshake and HTTP/2's settings
  // together: set to 100 ms, a loaded host or a link with a few hundred ms
  // of round trip never finished a TLS handshake in it, and the worker
  // retried until its register timeout (worker/README.md, "Persistence and
  // faults").
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetMaxReceiveMessageSize(64 << 20);
  channel_ = grpc::CreateCustomChannel(address,
                                       credentials.channel != nullptr
                                           ? credentials.channel
                                           : grpc::InsecureChannelCredentials(),
                                       args);
  stub_ = v1::WorkerService::NewStub(channel_);
}

GrpcCoordinatorClient::~GrpcCoordinatorClient() { CloseSession(); }

void GrpcCoordinatorClient::Prepare(grpc::ClientContext& ctx,
                                    std::chrono::milliseconds extra) const {
  ctx.set_deadline(std::chrono::system_clock::now() + rpc_timeout_ + extra);
  if (!join_secret_.empty())
    ctx.AddMetadata("tandem-join-secret", join_secret_);
}

absl::Status GrpcCoordinatorClient::Annotate(const grpc::Status& s) const {
  if (s.ok()) return absl::OkStatus();
  std::string msg = s.error_message();
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    msg = absl::StrCat("coordinator at ", address_, " is unreachable (", msg,
                       "); is tandem-coordinator running there?");
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), msg);
}

absl::StatusOr<v1::RegisterResponse> GrpcCoordinatorClient::Register(
    const v1::RegisterRequest& request) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  v1::RegisterResponse response;
  grpc::Status s = stub_->Register(&ctx, request, &response);
  if (!s.ok()) return Annotate(s);
  return response;
}

absl::Status GrpcCoordinatorClient::OpenSession(
    const v1::WorkerMessage& hello,
    std::function<void(const v1::CoordinatorMessage&)> on_message,
    std::function<void(const absl::Status&)> on_closed) {
  CloseSession();
  std::lock_guard<std::mutex> lock(mu_);
  session_ctx_ = std::make_unique<grpc::ClientContext>();
  if (!join_secret_.empty()) {
    session_ctx_->AddMetadata("tandem-join-secret", join_secret_);
  }
  session_ = stub_->Session(session_ctx_.get());
  if (!session_->Write(hello)) {
    grpc::Status s = session_->Finish();
    session_.reset();
    session_ctx_.reset();
    return s.ok() ? absl::UnavailableError(absl::StrCat(
                        "coordinator at ", address_, " closed the session"))
                  : Annotate(s);
  }
  auto* stream = session_.get();
  reader_ = std::thread([this, stream, on_message = std::move(on_message),
                         on_closed = std::move(on_closed)] {
    v1::CoordinatorMessage message;
    while (stream->Read(&message)) on_message(message);
    on_closed(Annotate(stream->Finish()));
  });
  return absl::OkStatus();
}

absl::Status GrpcCoordinatorClient::Send(const v1::WorkerMessage& message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (session_ == nullptr || !session_->Write(message)) {
    return absl::UnavailableError(
        absl::StrCat("no session with the coordinator at ", address_));
  }
  return absl::OkStatus();
}

void GrpcCoordinatorClient::CloseSession() {
  std::thread reader;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (session_ctx_ != nullptr) session_ctx_->TryCancel();
    reader = std::move(reader_);
  }
  if (reader.joinable()) reader.join();
  std::lock_guard<std::mutex> lock(mu_);
  session_.reset();
  session_ctx_.reset();
}

absl::Status GrpcCoordinatorClient::KvSet(const std::string& key,
                                          const std::string& value) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  v1::KvSetRequest req;
  req.set_key(key);
  req.set_value(value);
  v1::KvSetResponse resp;
  return Annotate(stub_->KvSet(&ctx, req, &resp));
}

absl::StatusOr<std::optional<std::string>> GrpcCoordinatorClient::KvGet(
    const std::string& key, std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  Prepare(ctx, timeout);
  v1::KvGetRequest req;
  req.set_key(key);
  req.set_timeout_ms(timeout.count());
  v1::KvGetResponse resp;
  grpc::Status s = stub_->KvGet(&ctx, req, &resp);
  if (!s.ok()) return Annotate(s);
  if (!resp.found()) return std::optional<std::string>();
  return std::optional<std::string>(resp.value());
}

absl::StatusOr<int64_t> GrpcCoordinatorClient::KvAdd(const std::string& key,
                                                     int64_t delta) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  v1::KvAddRequest req;
  req.set_key(key);
  req.set_delta(delta);
  v1::KvAddResponse resp;
  grpc::Status s = stub_->KvAdd(&ctx, req, &resp);
  if (!s.ok()) return Annotate(s);
  return resp.value();
}

absl::StatusOr<std::string> GrpcCoordinatorClient::KvCompareSet(
    const std::string& key, const std::string& expected,
    const std::string& desired) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  v1::KvCompareSetRequest req;
  req.set_key(key);
  req.set_expected(expected);
  req.set_desired(desired);
  v1::KvCompareSetResponse resp;
  grpc::Status s = stub_->KvCompareSet(&ctx, req, &resp);
  if (!s.ok()) return Annotate(s);
  return resp.value();
}

absl::StatusOr<bool> GrpcCoordinatorClient::KvCheck(
    const std::vector<std::string>& keys) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  v1::KvCheckRequest req;
  for (const std::string& k : keys) req.add_keys(k);
  v1::KvCheckResponse resp;
  grpc::Status s = stub_->KvCheck(&ctx, req, &resp);
  if (!s.ok()) return Annotate(s);
  return resp.ready();
}

absl::StatusOr<bool> GrpcCoordinatorClient::KvDelete(const std::string& key) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  v1::KvDeleteRequest req;
  req.set_key(key);
  v1::KvDeleteResponse resp;
  grpc::Status s = stub_->KvDelete(&ctx, req, &resp);
  if (!s.ok()) return Annotate(s);
  return resp.deleted();
}

absl::StatusOr<int64_t> GrpcCoordinatorClient::KvNumKeys(
    const std::string& prefix) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  v1::KvNumKeysRequest req;
  req.set_prefix(prefix);
  v1::KvNumKeysResponse resp;
  grpc::Status s = stub_->KvNumKeys(&ctx, req, &resp);
  if (!s.ok()) return Annotate(s);
  return resp.count();
}

}  // namespace tandem
