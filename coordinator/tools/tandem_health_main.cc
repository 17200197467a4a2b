// tandem-health: asks a Tandem server (coordinator or worker) for its health
// over the standard gRPC health checking protocol (grpc.health.v1), the way a
// Kubernetes gRPC probe does. Launchers use --wait to block until the
// coordinator is ready.
//
//   tandem-health [--service NAME] [--wait S] [--timeout S] [-q] HOST:PORT
//
// --service  the service to ask about ("" by default: the whole server;
//            e.g. tandem.v1.WorkerService)
// --wait     keep asking, twice a second, until SERVING or S seconds passed
// --timeout  deadline of each check (default 2 s)
// Exit status: 0 SERVING; 1 not serving, unknown service or unreachable
// (the reason is on stderr); 2 usage errors.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/flags/command_line.h"
#include "common/flags/flag_checks.h"
#include "common/security/grpc_credentials.h"
#include "grpc/health/v1/health.grpc.pb.h"

ABSL_FLAG(std::string, service, "",
          "the service to ask about: \"\" is the whole server, e.g. "
          "tandem.v1.WorkerService or ready");
ABSL_FLAG(double, wait, 0,
          "keep asking, twice a second, until SERVING or this many seconds "
          "passed");
ABSL_FLAG(double, timeout, 2, "deadline of each check, in seconds");
ABSL_FLAG(bool, quiet, false, "print nothing when SERVING (-q)");
ABSL_FLAG(std::string, tls_ca, "",
          "the server speaks TLS: trust this PEM CA (default: $TANDEM_TLS_CA)");

namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

constexpr char kUsage[] =
    "usage: tandem-health [--service NAME] [--wait S] [--timeout S] [-q] "
    "[--tls-ca FILE] HOST:PORT\n"
    "Asks a Tandem coordinator or worker for its health (grpc.health.v1). "
    "Exit status:\n0 SERVING; 1 not serving, unknown service or "
    "unreachable; 2 usage errors.\n";

struct CheckResult {
  bool serving = false;
  // Why not, when not serving.
  std::string reason;
};

CheckResult CheckOnce(Health::Stub& stub, const std::string& service,
                      std::chrono::milliseconds timeout) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  grpc::Status status = stub.Check(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    return {false, absl::StrCat("the server does not know service '", service,
                                "' (check --service)")};
  }
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    return {false,
            "the server does not implement grpc.health.v1 (is this a Tandem "
            "coordinator or a worker's --health-listen port?)"};
  }
  if (!status.ok()) {
    return {false, absl::StrCat("unreachable: ", status.error_message(),
                                " (is the server up, and the address right?)")};
  }
  if (response.status() != HealthCheckResponse::SERVING) {
    return {false,
            absl::StrCat("status ", HealthCheckResponse::ServingStatus_Name(
                                        response.status()))};
  }
  return {true, ""};
}

}  // namespace

int main(int argc, char** argv) {
  const tandem::CommandLineSpec spec{
      "tandem-health", kUsage, "HOST:PORT", 1, {{"q", "quiet"}}};
  const std::vector<std::string> positional =
      tandem::ParseCommandLineOrExit(spec, argc, argv);
  if (positional.empty()) {
    tandem::ExitWithUsageError(spec, "give the server's HOST:PORT");
  }
  const std::string& address = positional[0];
  const std::string service = absl::GetFlag(FLAGS_service);
  const double wait_s = absl::GetFlag(FLAGS_wait);
  const double timeout_s = absl::GetFlag(FLAGS_timeout);
  const bool quiet = absl::GetFlag(FLAGS_quiet);
  tandem::ExitIfInvalid(spec,
                        {tandem::CheckHostPort("the server address", address,
                                               tandem::PortZero::kRejected),
                         tandem::CheckAtLeast("--wait", wait_s, 0.0),
                         tandem::CheckPositive("--timeout", timeout_s)});

  std::string tls_ca = absl::GetFlag(FLAGS_tls_ca);
  if (tls_ca.empty()) {
    if (const char* env = std::getenv("TANDEM_TLS_CA"); env != nullptr) {
      tls_ca = env;
    }
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      tandem::MakeChannelCredentials({tls_ca, "", ""});
  if (!credentials.ok()) {
    std::fprintf(stderr, "tandem-health: %s\n",
                 std::string(credentials.status().message()).c_str());
    return 2;
  }
  auto channel = grpc::CreateChannel(address, *credentials);
  std::unique_ptr<Health::Stub> stub = Health::NewStub(channel);
  const auto timeout =
      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(wait_s * 1000));
  const std::string what =
      service.empty() ? address : absl::StrCat(address, " ", service);
  while (true) {
    CheckResult result = CheckOnce(*stub, service, timeout);
    if (result.serving) {
      if (!quiet) std::printf("%s: SERVING\n", what.c_str());
      return 0;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::fprintf(
          stderr, "tandem-health: %s: %s%s\n", what.c_str(),
          result.reason.c_str(),
          wait_s > 0 ? absl::StrCat(" (waited ", wait_s, " s)").c_str() : "");
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}
