#include "common/security/listen_policy.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace tandem {

bool IsLoopbackListen(absl::string_view host_port) {
  if (absl::StartsWith(host_port, "unix:")) return true;
  const size_t colon = host_port.rfind(':');
  absl::string_view host =
      colon == absl::string_view::npos ? host_port : host_port.substr(0, colon);
  if (absl::ConsumePrefix(&host, "[") && !absl::ConsumeSuffix(&host, "]")) {
    return false;
  }
  if (absl::EqualsIgnoreCase(host, "localhost") || host == "::1") return true;
  std::vector<absl::string_view> octets = absl::StrSplit(host, '.');
  if (octets.size() != 4) return false;
  int first = -1;
  for (absl::string_view o : octets) {
    int v = -1;
    if (o.empty() || o.size() > 3 || !absl::SimpleAtoi(o, &v) || v < 0 ||
        v > 255) {
      return false;
    }
    if (first < 0) first = v;
  }
  return first == 127;
}

absl::Status CheckListen(absl::string_view flag, absl::string_view host_port,
                         const ListenProtection& protection) {
  if (IsLoopbackListen(host_port) || protection.insecure ||
      (protection.tls && protection.tokens)) {
    return absl::OkStatus();
  }
  std::vector<std::string> missing;
  if (!protection.tls) missing.push_back("--tls-cert and --tls-key");
  if (!protection.tokens) missing.push_back("--auth-tokens");
  return absl::FailedPreconditionError(absl::StrCat(
      flag, " ", host_port,
      " is not a loopback address: without TLS and tokens anyone who can "
      "reach it could use it. Add ",
      absl::StrJoin(missing, " and "),
      ", listen on 127.0.0.1, or pass --insecure to serve it unprotected "
      "(a private network you trust)"));
}

}  // namespace tandem
