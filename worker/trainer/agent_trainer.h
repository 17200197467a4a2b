// Agent mode: one rank of a job the coordinator runs. Registers, builds the
// model from the spec the coordinator returns, reports the graph, bootstraps
// the collectives from the coordinator's rendezvous store, trains, streams
// progress and profile windows, and applies every schedule version at the
// iteration all ranks agree on. It keeps training when the coordinator goes
// away and stops when the coordinator says the job ended.
//
// The coordinator is reached only through a CoordinatorClient (main wires
// the gRPC one; tests drive the trainer with a fake), and the device and
// collective backend come in as RuntimeOptions.
#ifndef TANDEM_WORKER_TRAINER_AGENT_TRAINER_H_
#define TANDEM_WORKER_TRAINER_AGENT_TRAINER_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "worker/agent/coordinator_client.h"
#include "worker/runtime/iteration_report.h"
#include "worker/trainer/runtime_options.h"

namespace tandem {

struct AgentTrainerOptions {
  std::string job_id;
  // -1: the coordinator assigns one (SLURM_PROCID, a completion index...).
  int requested_rank = -1;
  // The world size the launcher started (SLURM_NTASKS, ...); 0: unchecked.
  // A job of another size fails at once, saying so, instead of stalling in
  // the rendezvous.
  int expected_world = 0;
  std::string hostname;
  // Where this rank trains and the backend of its collectives (registered
  // with the coordinator as the worker's device).
  RuntimeOptions runtime;
  // Address Gloo binds for this rank's connections.
  std::string bind_host = "127.0.0.1";
  int threads = 0;
  // Host-tier directory for offloaded optimizer states (empty: the default).
  std::string offload_dir;
  std::chrono::milliseconds heartbeat_interval{1000};
  // Iterations per profile window sent to the coordinator (0: the spec's
  // optimize.warmup_steps, at least 1).
  int profile_window = 0;
  // Fault injection for drift tests: from iteration `slow_from_step` on,
  // every forward node sleeps `slow_node_ms` more.
  double slow_node_ms = 0;
  int64_t slow_from_step = 0;
  // Receives every iteration's report (the worker's metrics); may be null.
  IterationObserver* observer = nullptr;
  // Set by the process's SIGTERM/SIGINT handler (0: none, else the signal).
  // Once set, the rank tells the coordinator at once ("rank r stopped by
  // signal SIGTERM (scancel?)", a fatal error that fails the job), stops at
  // the next step, and exits the process if it is still blocked
  // (rendezvous, a collective) after `stop_grace`.
  const std::atomic<int>* stop_signal = nullptr;
  std::chrono::milliseconds stop_grace{10000};
  // Told true once registered and running, false when stopping: the
  // readiness a worker's health server reports.
  std::function<void(bool ready)> on_ready;
};

// Runs this rank of `options.job_id` through `client`; one JSON line per
// step goes to `out`. Returns OK when the job's steps are done;
// FailedPrecondition when the coordinator ended the job (cancelled or
// failed: the message says why) or this build cannot run `options.runtime`;
// InvalidArgument when the runtime's backend cannot carry its device (before
// registering) or the job's world size is not `expected_world`; Aborted
// when a stop signal arrived; other errors when this rank failed (it tells
// the coordinator first).
absl::Status RunAgent(CoordinatorClient& client,
                      const AgentTrainerOptions& options, std::ostream& out);

}  // namespace tandem

#endif  // TANDEM_WORKER_TRAINER_AGENT_TRAINER_H_
