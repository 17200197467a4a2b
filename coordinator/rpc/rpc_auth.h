// Who may call what (coordinator/README.md, "Authentication"). Off unless
// the coordinator has --auth-tokens; then:
//   - JobService calls carry `authorization: Bearer TOKEN`; a job belongs to
//     the user who submitted it, and only that user or an admin may read,
//     cancel or re-plan it (List shows a user their own jobs).
//   - WorkerService calls carry `tandem-join-secret: SECRET`, the job's join
//     secret (JoinSecrets), and may only touch that job's rendezvous keys
//     ("jobs/<id>/...").
//   - With --tls-client-ca, workers must also present a client certificate
//     that chains to it (mutual TLS).
// Refusals are UNAUTHENTICATED (no or unknown credential) or
// PERMISSION_DENIED (a valid one that does not open this), with a message
// that says which and what to pass.
#ifndef TANDEM_COORDINATOR_RPC_RPC_AUTH_H_
#define TANDEM_COORDINATOR_RPC_RPC_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "common/security/token_table.h"
#include "coordinator/service/join_secrets.h"
#include "tandem/v1/job.pb.h"

namespace tandem {

class RpcAuth {
 public:
  // The metadata keys.
  static constexpr char kAuthorization[] = "authorization";
  static constexpr char kJoinSecret[] = "tandem-join-secret";

  // `tokens` null: authentication off (everyone is an anonymous admin, and
  // workers need no secret). `require_worker_certificate`: --tls-client-ca.
  RpcAuth(std::unique_ptr<TokenFile> tokens, JoinSecrets join,
          bool require_worker_certificate)
      : tokens_(std::move(tokens)),
        join_(std::move(join)),
        require_worker_certificate_(require_worker_certificate) {}

  bool enabled() const { return tokens_ != nullptr; }
  // Re-reads the token file (SIGHUP); the old table stays on error.
  absl::Status Reload();
  const JoinSecrets& join_secrets() const { return join_; }

  // JobService: the caller, from the `authorization` value (nullopt when
  // absent). Anonymous admin when authentication is off.
  grpc::Status Authenticate(std::optional<absl::string_view> authorization,
                            Principal* caller) const;
  grpc::Status Authenticate(const grpc::ServerContextBase& context,
                            Principal* caller) const;
  // The call's `authorization` value, kept by streams that authenticate
  // again later (a revoked token ends them).
  static std::optional<std::string> Authorization(
      const grpc::ServerContextBase& context);
  // NOT_FOUND, as for a job that does not exist, unless `caller` owns `job`
  // or is an admin.
  grpc::Status MayAccess(const Principal& caller, const v1::Job& job) const;
  // For List: the owner to filter on (nullopt: all jobs).
  std::optional<std::string> ListFilter(const Principal& caller) const;

  // WorkerService: may this caller act as a worker of `job_id`?
  grpc::Status CheckWorker(std::optional<absl::string_view> join_secret,
                           bool peer_certificate,
                           absl::string_view job_id) const;
  grpc::Status CheckWorker(const grpc::ServerContextBase& context,
                           absl::string_view job_id) const;
  // A rendezvous key: must lie under "jobs/<id>/" of the job the secret
  // opens. Always OK when authentication is off.
  grpc::Status CheckWorkerKey(const grpc::ServerContextBase& context,
                              absl::string_view key) const;

 private:
  std::unique_ptr<TokenFile> tokens_;
  JoinSecrets join_;
  bool require_worker_certificate_;
};

// The job id of a rendezvous key "jobs/<id>/..."; nullopt for any other
// key.
std::optional<absl::string_view> JobOfKey(absl::string_view key);

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_RPC_RPC_AUTH_H_
