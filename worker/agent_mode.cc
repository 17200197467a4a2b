// Agent mode over gRPC: the coordinator client, the health server and the
// stop signals around the agent trainer.
#include "worker/agent_mode.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/security/grpc_credentials.h"
#include "worker/agent/grpc_coordinator_client.h"
#include "worker/agent/health_server.h"
#include "worker/trainer/agent_trainer.h"

namespace tandem {
namespace {

// The stop signal received (0: none); RunAgent acts on it.
std::atomic<int> g_stop_signal{0};

void OnStopSignal(int signal) { g_stop_signal.store(signal); }

}  // namespace

bool AgentModeBuilt() { return true; }

int RunAgentMode(const AgentModeFlags& flags, const RuntimeOptions& runtime,
                 IterationObserver* observer) {
  AgentTrainerOptions options;
  options.job_id = flags.job_id;
  options.requested_rank = flags.rank;
  // --world in agent mode: the launcher's count, checked against the job.
  options.expected_world = flags.world > 0 ? flags.world : 0;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  options.hostname = host;
  options.runtime = runtime;
  options.bind_host = flags.bind_host;
  options.threads = flags.threads;
  options.offload_dir = flags.offload_dir;
  options.profile_window = flags.profile_window;
  options.slow_node_ms = flags.slow_node_ms;
  options.slow_from_step = flags.slow_from_step;
  options.observer = observer;
  std::unique_ptr<HealthServer> health;
  if (!flags.health_listen.empty()) {
    absl::StatusOr<std::unique_ptr<HealthServer>> started =
        HealthServer::Start(flags.health_listen);
    if (!started.ok()) {
      std::fprintf(stderr, "tandem-worker: %s\n",
                   std::string(started.status().message()).c_str());
      return 2;
    }
    health = *std::move(started);
    std::fprintf(stderr, "tandem-worker: health on port %d\n", health->port());
    options.on_ready = [h = health.get()](bool ready) { h->SetReady(ready); };
  }
  std::signal(SIGTERM, OnStopSignal);
  std::signal(SIGINT, OnStopSignal);
  std::signal(SIGHUP, OnStopSignal);
  options.stop_signal = &g_stop_signal;
  if (flags.exit_with_parent) {
    // The launcher (tandem launch) ending by any means, SIGKILL included,
    // hangs up on this rank. A launcher gone before this call left us to
    // init: the same hang-up, now.
    prctl(PR_SET_PDEATHSIG, SIGHUP);
    if (flags.launcher_pid > 0 && getppid() != flags.launcher_pid) {
      g_stop_signal.store(SIGHUP);
    }
  }

  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> channel =
      MakeChannelCredentials({flags.tls_ca, flags.tls_cert, flags.tls_key});
  if (!channel.ok()) {
    std::fprintf(stderr, "tandem-worker: %s\n",
                 std::string(channel.status().message()).c_str());
    return 2;
  }
  GrpcCoordinatorClient client(flags.coordinator,
                               {*std::move(channel), flags.join_secret});
  absl::Status status = RunAgent(client, options, std::cout);
  if (health) health->Shutdown();
  if (status.code() == absl::StatusCode::kCancelled) {
    std::fprintf(stderr,
                 "tandem-worker: %s; exiting with status %d for the launcher "
                 "to start this worker again\n",
                 std::string(status.message()).c_str(), kExitRestart);
    return kExitRestart;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "tandem-worker: %s\n",
                 std::string(status.message()).c_str());
    const int signal = g_stop_signal.load();
    return signal != 0 ? 128 + signal : 1;
  }
  return 0;
}

}  // namespace tandem
