#include "coordinator/rpc/rpc_auth.h"

#include "absl/strings/str_cat.h"
#include "coordinator/service/job_manager.h"
#include "coordinator/service/kv_store.h"

namespace tandem {
namespace {

std::optional<absl::string_view> Metadata(
    const grpc::ServerContextBase& context, absl::string_view key) {
  const auto& md = context.client_metadata();
  auto it = md.find(grpc::string_ref(key.data(), key.size()));
  if (it == md.end()) return std::nullopt;
  return absl::string_view(it->second.data(), it->second.size());
}

grpc::Status Unauthenticated(std::string message) {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::move(message));
}
grpc::Status Denied(std::string message) {
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, std::move(message));
}

}  // namespace

std::optional<absl::string_view> JobOfKey(absl::string_view key) {
  const absl::string_view ns = KvNamespace(key);  // "jobs/<id>/" or ""
  if (ns.empty()) return std::nullopt;
  return ns.substr(5, ns.size() - 6);
}

absl::Status RpcAuth::Reload() {
  if (tokens_ == nullptr) return absl::OkStatus();
  return tokens_->Reload();
}

grpc::Status RpcAuth::Authenticate(
    std::optional<absl::string_view> authorization, Principal* caller) const {
  if (tokens_ == nullptr) {
    *caller = Principal{"", true};
    return grpc::Status::OK;
  }
  if (!authorization.has_value()) {
    return Unauthenticated(
        "no token: this coordinator authenticates its users; pass --token "
        "TOKEN or set TANDEM_TOKEN (Python: tandem.Client(token=...))");
  }
  std::optional<absl::string_view> token = BearerToken(*authorization);
  if (!token.has_value()) {
    return Unauthenticated(
        "the authorization metadata must read 'Bearer TOKEN'");
  }
  std::optional<Principal> found = tokens_->Find(*token);
  if (!found.has_value()) {
    return Unauthenticated(
        "unknown token: it is not in the coordinator's token file (it may "
        "have been revoked); ask the coordinator's operator for one");
  }
  *caller = *std::move(found);
  return grpc::Status::OK;
}

std::optional<std::string> RpcAuth::Authorization(
    const grpc::ServerContextBase& context) {
  std::optional<absl::string_view> value = Metadata(context, kAuthorization);
  if (!value.has_value()) return std::nullopt;
  return std::string(*value);
}

grpc::Status RpcAuth::Authenticate(const grpc::ServerContextBase& context,
                                   Principal* caller) const {
  return Authenticate(Metadata(context, kAuthorization), caller);
}

grpc::Status RpcAuth::MayAccess(const Principal& caller,
                                const v1::Job& job) const {
  if (tokens_ == nullptr || caller.admin || caller.user == job.owner()) {
    return grpc::Status::OK;
  }
  // Another user's job: the answer for a job that does not exist, so that a
  // stranger learns nothing of which ids exist.
  return grpc::Status(grpc::StatusCode::NOT_FOUND, NoSuchJob(job.id()));
}

std::optional<std::string> RpcAuth::ListFilter(const Principal& caller) const {
  if (tokens_ == nullptr || caller.admin) return std::nullopt;
  return caller.user;
}

grpc::Status RpcAuth::CheckWorker(std::optional<absl::string_view> join_secret,
                                  bool peer_certificate,
                                  absl::string_view job_id) const {
  if (require_worker_certificate_ && !peer_certificate) {
    return Unauthenticated(
        "workers must present a client certificate (the coordinator has "
        "--tls-client-ca): start tandem-worker with --tls-cert and --tls-key");
  }
  if (tokens_ == nullptr) return grpc::Status::OK;
  if (!join_secret.has_value() || join_secret->empty()) {
    return Unauthenticated(absl::StrCat(
        "no join secret: this coordinator admits a worker of job ", job_id,
        " only with the job's join secret; give tandem-worker "
        "--join-secret-file FILE or set TANDEM_JOIN_SECRET (`tandem "
        "join-secret ",
        job_id, "` prints it)"));
  }
  if (!join_.Matches(job_id, *join_secret)) {
    return Denied(absl::StrCat("wrong join secret for job ", job_id,
                               ": it is not this job's (`tandem join-secret ",
                               job_id, "` prints the right one)"));
  }
  return grpc::Status::OK;
}

grpc::Status RpcAuth::CheckWorker(const grpc::ServerContextBase& context,
                                  absl::string_view job_id) const {
  bool certificate = false;
  if (require_worker_certificate_) {
    std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
    certificate = auth != nullptr && auth->IsPeerAuthenticated();
  }
  return CheckWorker(Metadata(context, kJoinSecret), certificate, job_id);
}

grpc::Status RpcAuth::CheckWorkerKey(const grpc::ServerContextBase& context,
                                     absl::string_view key) const {
  // Without tokens, keys are not tied to jobs; a certificate may still be
  // required.
  if (tokens_ == nullptr) return CheckWorker(context, "");
  std::optional<absl::string_view> job = JobOfKey(key);
  if (!job.has_value()) {
    return Denied(absl::StrCat(
        "rendezvous key '", key.substr(0, 128),
        "' is outside every job: a worker may only use keys under the "
        "store_prefix Register returned (\"jobs/<id>/\")"));
  }
  return CheckWorker(context, *job);
}

}  // namespace tandem
