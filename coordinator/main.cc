// tandem-coordinator: the long-running daemon. Parses flags and runs
// CoordinatorServer until SIGINT or SIGTERM.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "coordinator/rpc/coordinator_server.h"

namespace {

volatile std::sig_atomic_t g_stop = 0;

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: tandem-coordinator [--listen HOST:PORT] [--db FILE] "
               "[--metrics-listen HOST:PORT] [--heartbeat-timeout-s N]\n"
               "  --listen             gRPC address (default 127.0.0.1:50051)\n"
               "  --db                 SQLite file (default ./tandem.db)\n"
               "  --metrics-listen     serve Prometheus /metrics here\n"
               "  --heartbeat-timeout-s  fail a running job whose worker is "
               "silent this long (default 15)\n");
}

}  // namespace

int main(int argc, char** argv) {
  tandem::CoordinatorOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tandem-coordinator: %s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--listen") {
      options.listen = value("--listen");
    } else if (arg == "--db") {
      options.db = value("--db");
    } else if (arg == "--metrics-listen") {
      options.metrics_listen = value("--metrics-listen");
    } else if (arg == "--heartbeat-timeout-s") {
      double s = 0;
      if (!absl::SimpleAtod(value("--heartbeat-timeout-s"), &s) || s <= 0) {
        std::fprintf(stderr,
                     "tandem-coordinator: --heartbeat-timeout-s must be a "
                     "positive number of seconds\n");
        return 2;
      }
      options.heartbeat_timeout =
          std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
    } else if (arg == "--help" || arg == "-h") {
      Usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "tandem-coordinator: unknown argument '%s'\n",
                   arg.c_str());
      Usage(stderr);
      return 2;
    }
  }
  auto server = tandem::CoordinatorServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "tandem-coordinator: %s\n",
                 std::string(server.status().message()).c_str());
    return 1;
  }
  std::signal(SIGINT, [](int) { g_stop = 1; });
  std::signal(SIGTERM, [](int) { g_stop = 1; });
  std::printf("tandem-coordinator listening on port %d", (*server)->port());
  if ((*server)->metrics_port() != 0) {
    std::printf(", metrics on port %d", (*server)->metrics_port());
  }
  std::printf(" (db %s)\n", options.db.c_str());
  std::fflush(stdout);
  std::thread waiter([&] { (*server)->Wait(); });
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  (*server)->Stop();
  waiter.join();
  return 0;
}
