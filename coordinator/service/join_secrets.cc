#include "coordinator/service/join_secrets.h"

#include <openssl/evp.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/security/token_table.h"

namespace tandem {

std::string JoinSecrets::For(absl::string_view job_id) const {
  unsigned char mac[EVP_MAX_MD_SIZE];
  size_t size = 0;
  if (EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, key_.data(),
                key_.size(),
                reinterpret_cast<const unsigned char*>(job_id.data()),
                job_id.size(), mac, sizeof(mac), &size) == nullptr) {
    // Only without a working libcrypto; a secret nobody can match.
    return std::string();
  }
  return absl::StrCat("tjs-", absl::BytesToHexString(absl::string_view(
                                  reinterpret_cast<const char*>(mac), size)));
}

bool JoinSecrets::Matches(absl::string_view job_id,
                          absl::string_view presented) const {
  const std::string expected = For(job_id);
  return !expected.empty() && ConstantTimeEquals(expected, presented);
}

}  // namespace tandem
