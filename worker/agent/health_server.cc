#include "worker/agent/health_server.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace tandem {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

void HealthService::Set(const std::string& service, bool serving) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return;
    statuses_[service] = serving ? HealthCheckResponse::SERVING
                                 : HealthCheckResponse::NOT_SERVING;
  }
  changed_.notify_all();
}

void HealthService::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    for (auto& [_, status] : statuses_) {
      status = HealthCheckResponse::NOT_SERVING;
    }
  }
  changed_.notify_all();
}

HealthService::ServingStatus HealthService::StatusLocked(
    const std::string& service) const {
  auto it = statuses_.find(service);
  return it == statuses_.end() ? HealthCheckResponse::SERVICE_UNKNOWN
                               : it->second;
}

grpc::Status HealthService::Check(grpc::ServerContext* /*context*/,
                                  const HealthCheckRequest* request,
                                  HealthCheckResponse* response) {
  std::lock_guard<std::mutex> lock(mu_);
  const ServingStatus status = StatusLocked(request->service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("unknown service '", request->service(),
                                     "': a worker reports \"\" and \"",
                                     HealthServer::kReadyService, "\""));
  }
  response->set_status(status);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(
    grpc::ServerContext* context, const HealthCheckRequest* request,
    grpc::ServerWriter<HealthCheckResponse>* writer) {
  std::unique_lock<std::mutex> lock(mu_);
  bool first = true;
  ServingStatus sent = HealthCheckResponse::UNKNOWN;
  while (!context->IsCancelled()) {
    const ServingStatus now = StatusLocked(request->service());
    if (first || now != sent) {
      HealthCheckResponse response;
      response.set_status(now);
      sent = now;
      first = false;
      lock.unlock();
      const bool written = writer->Write(response);
      lock.lock();
      if (!written) break;
    }
    // After shutdown, end the stream once the final status (NOT_SERVING) is
    // out: shutdown may land while the previous status is being written.
    if (shutdown_ && StatusLocked(request->service()) == sent) break;
    // Wakes on a change, including one made while the lock was released for
    // the write; the timeout notices a cancelled call.
    changed_.wait_for(lock, std::chrono::milliseconds(500),
                      [&] { return StatusLocked(request->service()) != sent; });
  }
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(
    const std::string& listen) {
  std::unique_ptr<HealthServer> s(new HealthServer());
  s->service_.Set("", true);
  s->service_.Set(kReadyService, false);
  grpc::ServerBuilder builder;
  // gRPC binds with SO_REUSEPORT by default: two workers given the same
  // port would then share it silently. Refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(),
                           &s->port_);
  builder.RegisterService(&s->service_);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve health checks on ", listen,
                     ": the address is malformed or the port is in use; change "
                     "--health-listen"));
  }
  return s;
}

HealthServer::~HealthServer() { Shutdown(); }

void HealthServer::SetReady(bool ready) { service_.Set(kReadyService, ready); }

void HealthServer::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  if (server_ == nullptr) return;
  service_.Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(500));
  server_.reset();
}

}  // namespace tandem
