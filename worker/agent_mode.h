// tandem-worker's agent mode, as main.cc hands it over once the flags are
// parsed. Two definitions, chosen at link time: agent_mode.cc wires the gRPC
// coordinator client, the health server and the stop signals to the agent
// trainer; agent_mode_unavailable.cc, linked where the worker is built
// without gRPC (TANDEM_WORKER_STANDALONE_ONLY), says that this build has no
// agent mode.
#ifndef TANDEM_WORKER_AGENT_MODE_H_
#define TANDEM_WORKER_AGENT_MODE_H_

#include <cstdint>
#include <string>

#include "worker/runtime/iteration_report.h"
#include "worker/trainer/runtime_options.h"

namespace tandem {

// Agent mode's flags (worker/main.cc documents them).
struct AgentModeFlags {
  std::string coordinator;
  std::string job_id;
  // -1: the coordinator assigns one; 0 for `world`: unchecked.
  int rank = -1;
  int world = 0;
  std::string bind_host = "127.0.0.1";
  std::string health_listen;
  int threads = 0;
  std::string offload_dir;
  int profile_window = 0;
  double slow_node_ms = 0;
  int64_t slow_from_step = 0;
  // Security (coordinator/README.md, "Authentication"): TLS to the
  // coordinator (--tls-ca; --tls-cert/--tls-key for mutual TLS) and the
  // job's join secret.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string join_secret;
  // --exit-with-parent: the kernel sends SIGHUP when the process that
  // started this one ends (PR_SET_PDEATHSIG), which stops the rank like
  // SIGTERM with its own reason; `launcher_pid` ($TANDEM_LAUNCHER_PID,
  // 0: unchecked) is that parent, checked once the signal is asked for, in
  // case it ended before.
  bool exit_with_parent = false;
  int64_t launcher_pid = 0;
};

// The exit status of a worker whose job restarts (Command KIND_RESTART):
// its launcher starts it again (EX_TEMPFAIL).
inline constexpr int kExitRestart = 75;

// Whether this binary has agent mode (false: agent_mode_unavailable.cc).
bool AgentModeBuilt();

// Runs one rank in agent mode on `runtime`; `observer` (may be null)
// receives every iteration's report. Returns the process's exit code and
// prints what failed on stderr.
int RunAgentMode(const AgentModeFlags& flags, const RuntimeOptions& runtime,
                 IterationObserver* observer);

}  // namespace tandem

#endif  // TANDEM_WORKER_AGENT_MODE_H_
