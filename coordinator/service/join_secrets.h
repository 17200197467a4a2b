// Per-job join secrets (coordinator/README.md, "Authentication"): what a
// worker must present to register as a rank of a job and to use its
// rendezvous keys. A job's secret is HMAC-SHA256(coordinator key, job id),
// so nothing per job is stored, a restarted coordinator (same --db) issues
// the same secrets, and a secret opens exactly one job.
#ifndef TANDEM_COORDINATOR_SERVICE_JOIN_SECRETS_H_
#define TANDEM_COORDINATOR_SERVICE_JOIN_SECRETS_H_

#include <string>

#include "absl/strings/string_view.h"

namespace tandem {

class JoinSecrets {
 public:
  // `key`: JobStore::SecretKey().
  explicit JoinSecrets(std::string key) : key_(std::move(key)) {}

  // "tjs-" and 64 hex digits.
  std::string For(absl::string_view job_id) const;
  // Compared in constant time.
  bool Matches(absl::string_view job_id, absl::string_view presented) const;

 private:
  std::string key_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_SERVICE_JOIN_SECRETS_H_
