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
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

constexpr char kUsage[] =
    "usage: tandem-health [--service NAME] [--wait S] [--timeout S] [-q] "
    "HOST:PORT\n";

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

bool ParseSeconds(const char* text, double* out) {
  return absl::SimpleAtod(text, out) && *out >= 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string service, address;
  double wait_s = 0, timeout_s = 2;
  bool quiet = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--service" && has_value) {
      service = argv[++i];
    } else if (arg == "--wait" && has_value) {
      if (!ParseSeconds(argv[++i], &wait_s)) {
        std::fprintf(stderr, "tandem-health: --wait needs seconds\n%s", kUsage);
        return 2;
      }
    } else if (arg == "--timeout" && has_value) {
      if (!ParseSeconds(argv[++i], &timeout_s) || timeout_s == 0) {
        std::fprintf(stderr, "tandem-health: --timeout needs seconds > 0\n%s",
                     kUsage);
        return 2;
      }
    } else if (arg == "-q" || arg == "--quiet") {
      quiet = true;
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (!arg.empty() && arg[0] != '-' && address.empty()) {
      address = arg;
    } else {
      std::fprintf(stderr, "tandem-health: unexpected argument '%s'\n%s",
                   arg.c_str(), kUsage);
      return 2;
    }
  }
  if (address.empty()) {
    std::fprintf(stderr, "tandem-health: give the server's HOST:PORT\n%s",
                 kUsage);
    return 2;
  }

  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
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
