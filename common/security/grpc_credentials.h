// TLS for gRPC from PEM files given on the command line (common/README.md,
// "Security"): the coordinator's --tls-cert/--tls-key [--tls-client-ca], and
// a client's --tls-ca [--tls-cert/--tls-key for mutual TLS]. Errors name
// the flag and the file.
#ifndef TANDEM_COMMON_SECURITY_GRPC_CREDENTIALS_H_
#define TANDEM_COMMON_SECURITY_GRPC_CREDENTIALS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// Reads a PEM file (at most 1 MiB) that must hold at least one "-----BEGIN".
absl::StatusOr<std::string> ReadPemFile(absl::string_view flag,
                                        const std::string& path);

struct ServerTlsFiles {
  std::string cert;  // --tls-cert: the server's certificate chain
  std::string key;   // --tls-key: its private key
  // --tls-client-ca: when set, clients are asked for a certificate, and one
  // they present must chain to this CA (whether one is required is the
  // service's call: auth_context()->IsPeerAuthenticated()).
  std::string client_ca;
};

// Plaintext when `files.cert` and `files.key` are both empty; one without
// the other, or a client CA without them, is an error.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsFiles& files);

struct ClientTlsFiles {
  std::string ca;    // --tls-ca: the CA the server's certificate chains to
  std::string cert;  // --tls-cert: this client's certificate (mutual TLS)
  std::string key;   // --tls-key
};

// Plaintext when every path is empty; a client certificate needs --tls-ca.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const ClientTlsFiles& files);

}  // namespace tandem

#endif  // TANDEM_COMMON_SECURITY_GRPC_CREDENTIALS_H_
