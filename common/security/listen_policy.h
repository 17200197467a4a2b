// Secure by default off loopback (common/README.md, "Security"): a listener
// on any address but loopback needs TLS and tokens, unless --insecure says
// the network is trusted.
#ifndef TANDEM_COMMON_SECURITY_LISTEN_POLICY_H_
#define TANDEM_COMMON_SECURITY_LISTEN_POLICY_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem {

// True for HOST:PORT whose host is literally loopback: 127.0.0.0/8,
// "localhost", "::1" ("[::1]:PORT"), and for unix: sockets. Names that
// merely resolve to loopback count as public: the check does not resolve.
bool IsLoopbackListen(absl::string_view host_port);

// What a listener has for protection.
struct ListenProtection {
  bool tls = false;
  bool tokens = false;
  // --insecure: serve a public address without them anyway.
  bool insecure = false;
};

// OK for loopback, or when TLS and tokens are both on, or with --insecure.
// Otherwise FailedPrecondition naming `flag` and the flags to add.
absl::Status CheckListen(absl::string_view flag, absl::string_view host_port,
                         const ListenProtection& protection);

}  // namespace tandem

#endif  // TANDEM_COMMON_SECURITY_LISTEN_POLICY_H_
