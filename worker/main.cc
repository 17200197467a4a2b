// tandem-worker: one rank of a Tandem job.
//
//   tandem-worker --coordinator HOST:PORT --job ID [--rank R]
//                 [--bind-host H] [--threads N] [--profile-window N]
//                 [--health-listen HOST:PORT] [--world W]
//                 [--tls-ca FILE [--tls-cert FILE --tls-key FILE]]
//                 [--join-secret-file FILE]
//   tandem-worker --standalone --spec job.yaml --rank R --world W
//                 --rendezvous HOST:PORT [--schedule FILE]
//                 [--profile-out FILE] [--trace-out FILE] [--threads N]
//                 [--timeout-s S] [--graph-out FILE]
//                 [--alternate FILE [--block-steps N]]
//   both modes: [--device auto|cpu|cuda] [--metrics-listen HOST:PORT]
//               [--offload-dir DIR]
//
// Agent mode (the default) runs a rank of a coordinator's job: the spec,
// rank and rendezvous come from the coordinator. Standalone mode trains
// without one (rank 0 hosts the rendezvous store). Both print one JSON line
// per step on stdout. Only flag parsing and wiring live here; agent mode's
// wiring is agent_mode.cc, absent from builds without gRPC.
// --device picks where the rank trains: cpu (Gloo), cuda (NCCL, on GPU
// cuda:LOCAL_RANK, else SLURM_LOCALID, else 0) or auto (the default: cuda
// when this build has CUDA and a GPU is visible, else cpu).
// --metrics-listen serves Prometheus metrics at /metrics (port 0 picks one;
// stderr says which); --trace-out writes the last iteration's Chrome trace;
// --graph-out writes the iteration graph the rank derived (text form, for
// `tandem-plan --graph`) before it trains.
// --offload-dir holds the host tier's files when a schedule offloads
// optimizer states (default: $TANDEM_OFFLOAD_DIR, $TMPDIR or /tmp).
//
// Against an authenticating coordinator (coordinator/README.md,
// "Authentication") the worker presents the job's join secret, from
// --join-secret-file or $TANDEM_JOIN_SECRET (never a flag's value: argv is
// visible to every user of the host), over TLS with --tls-ca.
// --metrics-listen on an address other than loopback needs --insecure.
//
// In agent mode SIGTERM, SIGINT and SIGHUP stop the rank cleanly: it tells
// the coordinator (the job fails with "rank r stopped by signal SIGTERM")
// and exits with 128 + the signal. --exit-with-parent asks the kernel for
// SIGHUP when the launcher ends (tandem launch: no orphaned ranks).
// --health-listen serves grpc.health.v1.
//
// Flags are abseil flags (common/flags/command_line.h: --help lists them,
// an unknown one is refused with the valid ones). What a launcher sets is
// read where the flag is not given (common/flags/launcher_environment.h):
// --rank from RANK or SLURM_PROCID, --world from WORLD_SIZE or a Slurm
// task's SLURM_NTASKS, and in standalone mode --rendezvous from
// MASTER_ADDR:MASTER_PORT; LOCAL_RANK (else SLURM_LOCALID) picks the GPU.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/flags/command_line.h"
#include "common/flags/flag_checks.h"
#include "common/flags/launcher_environment.h"
#include "common/metrics/http_exporter.h"
#include "common/metrics/metrics_registry.h"
#include "common/security/listen_policy.h"
#include "worker/agent_mode.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/runtime/memory_meter.h"
#include "worker/runtime/process_group.h"
#include "worker/spec/job_spec_yaml.h"
#include "worker/standalone/standalone_trainer.h"
#include "worker/trainer/runtime_options.h"

// Both modes.
ABSL_FLAG(int, rank, -1,
          "this process's rank (default: $RANK, else $SLURM_PROCID; in agent "
          "mode, else the coordinator assigns one)");
ABSL_FLAG(int, world, -1,
          "the job's world size (default: $WORLD_SIZE, else $SLURM_NTASKS in "
          "a Slurm task; agent mode checks it against the job's)");
ABSL_FLAG(int, threads, 0, "compute threads (0: libtorch's default)");
ABSL_FLAG(std::string, device, "auto",
          "auto (cuda when built with it and a GPU is visible), cpu (Gloo) or "
          "cuda (NCCL, on cuda:$LOCAL_RANK)");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus /metrics on HOST:PORT (port 0 picks a free one)");
ABSL_FLAG(std::string, offload_dir, "",
          "the host tier's files when a schedule offloads optimizer states "
          "(default: $TANDEM_OFFLOAD_DIR, $TMPDIR or /tmp)");
// Agent mode.
ABSL_FLAG(std::string, coordinator, "",
          "agent mode: the coordinator's HOST:PORT");
ABSL_FLAG(std::string, job, "", "agent mode: the job id to join");
ABSL_FLAG(std::string, bind_host, "127.0.0.1",
          "agent mode: the address this rank's peers reach it at");
ABSL_FLAG(std::string, health_listen, "",
          "agent mode: serve grpc.health.v1 on HOST:PORT");
ABSL_FLAG(std::string, tls_ca, "",
          "agent mode: reach the coordinator over TLS, trusting this PEM CA");
ABSL_FLAG(std::string, tls_cert, "",
          "agent mode: this worker's PEM client certificate, for a "
          "coordinator with --tls-client-ca (with --tls-key)");
ABSL_FLAG(std::string, tls_key, "", "agent mode: the PEM key of --tls-cert");
ABSL_FLAG(std::string, join_secret_file, "",
          "agent mode: a file holding the job's join secret, which an "
          "authenticating coordinator requires (default: $TANDEM_JOIN_SECRET)");
ABSL_FLAG(bool, exit_with_parent, false,
          "agent mode: stop (SIGHUP, reported to the coordinator) when the "
          "process that started this one ends, however it ends; tandem "
          "launch passes it, with $TANDEM_LAUNCHER_PID");
ABSL_FLAG(bool, insecure, false,
          "serve a non-loopback --metrics-listen in the clear (a private "
          "network you trust)");
ABSL_FLAG(int, profile_window, 0,
          "agent mode: iterations per profile window (0: the job's "
          "optimize.warmup_steps)");
ABSL_FLAG(int, slow_from_step, 0,
          "testing: from this step on, sleep --slow-node-ms in every node");
ABSL_FLAG(double, slow_node_ms, 0,
          "testing: milliseconds to sleep in every node from --slow-from-step");
// Standalone mode.
ABSL_FLAG(bool, standalone, false,
          "train without a coordinator (rank 0 hosts the rendezvous store)");
ABSL_FLAG(std::string, spec, "", "standalone: the YAML job spec");
ABSL_FLAG(std::string, rendezvous, "",
          "standalone: rank 0's HOST:PORT for the rendezvous store (default: "
          "$MASTER_ADDR:$MASTER_PORT)");
ABSL_FLAG(std::string, schedule, "",
          "standalone: train under this schedule (text form) instead of "
          "on demand");
ABSL_FLAG(std::string, alternate, "",
          "standalone: alternate this schedule (text form) with --schedule's "
          "in blocks of --block-steps steps, as the coordinator's "
          "comparisons do");
ABSL_FLAG(int, block_steps, 4, "standalone: steps per block with --alternate");
ABSL_FLAG(std::string, profile_out, "",
          "standalone: write the profile (text form) here");
ABSL_FLAG(std::string, trace_out, "",
          "standalone: write the last iteration's Chrome trace here, one file "
          "per rank ({rank} in it is replaced by the rank; without it, at "
          "world > 1, FILE.rankR)");
ABSL_FLAG(std::string, graph_out, "",
          "standalone: write the iteration graph (text form) here before "
          "training");
ABSL_FLAG(int, timeout_s, 300,
          "standalone: seconds to wait for the rendezvous and collectives");

namespace {

constexpr char kUsage[] =
    "usage: tandem-worker --coordinator HOST:PORT --job ID [--rank R] "
    "[--bind-host H] [--threads N] [--profile-window N] "
    "[--health-listen HOST:PORT] [--world W] [--tls-ca FILE [--tls-cert "
    "FILE --tls-key FILE]] [--join-secret-file FILE]\n"
    "       tandem-worker --standalone --spec job.yaml --rank R --world W "
    "--rendezvous HOST:PORT [--schedule FILE] [--alternate FILE "
    "[--block-steps N]] [--profile-out FILE] "
    "[--trace-out FILE] [--threads N] [--timeout-s S] [--graph-out FILE]\n"
    "       both modes: [--device auto|cpu|cuda] [--metrics-listen HOST:PORT] "
    "[--offload-dir DIR]\n"
    "\n"
    "Launchers' variables are defaults for the flags they match: RANK (else "
    "SLURM_PROCID) for --rank, WORLD_SIZE (else SLURM_NTASKS) for --world, "
    "MASTER_ADDR:MASTER_PORT for --rendezvous; LOCAL_RANK (else "
    "SLURM_LOCALID) picks the GPU.\n";

const tandem::CommandLineSpec kCommandLine{"tandem-worker", kUsage};

int Fail(const std::string& message) {
  std::fprintf(stderr, "tandem-worker: %s\n", message.c_str());
  return 2;
}

// A value a launcher's variable gives for a flag that was not: sets `value`
// and says on stderr where it came from. Returns 0, or the exit status of
// a malformed variable.
template <typename T>
int FromEnvironment(absl::StatusOr<std::optional<tandem::Sourced<T>>> from,
                    const char* what, T* value) {
  if (!from.ok()) return Fail(std::string(from.status().message()));
  if (from->has_value()) {
    *value = (*from)->value;
    std::cerr << "tandem-worker: " << what << " " << *value << " from $"
              << (*from)->source << "\n";
  }
  return 0;
}

// The worker's Prometheus series and their HTTP exporter.
struct MetricsExport {
  tandem::metrics::Registry registry;
  std::unique_ptr<tandem::WorkerMetrics> observer;
  std::unique_ptr<tandem::metrics::HttpExporter> exporter;
};

absl::StatusOr<std::unique_ptr<MetricsExport>> StartMetrics(
    const std::string& listen) {
  auto m = std::make_unique<MetricsExport>();
  absl::StatusOr<std::unique_ptr<tandem::WorkerMetrics>> observer =
      tandem::WorkerMetrics::Create(m->registry);
  if (!observer.ok()) return observer.status();
  m->observer = *std::move(observer);
  absl::StatusOr<std::unique_ptr<tandem::metrics::HttpExporter>> exporter =
      tandem::metrics::HttpExporter::Start(listen, &m->registry);
  if (!exporter.ok()) {
    return absl::Status(
        exporter.status().code(),
        absl::StrCat("--metrics-listen: ", exporter.status().message()));
  }
  m->exporter = *std::move(exporter);
  std::fprintf(stderr, "tandem-worker: metrics on port %d\n",
               m->exporter->port());
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any tensor exists: storages keep the allocator they were made
  // with.
  tandem::CountingCpuAllocator::Install();

  tandem::ParseCommandLineOrExit(kCommandLine, argc, argv);
  const bool standalone = absl::GetFlag(FLAGS_standalone);
  const std::string spec_path = absl::GetFlag(FLAGS_spec);
  const std::string schedule_path = absl::GetFlag(FLAGS_schedule);
  const std::string alternate_path = absl::GetFlag(FLAGS_alternate);
  const int block_steps = absl::GetFlag(FLAGS_block_steps);
  const std::string profile_out = absl::GetFlag(FLAGS_profile_out);
  const std::string graph_out = absl::GetFlag(FLAGS_graph_out);
  const std::string offload_dir = absl::GetFlag(FLAGS_offload_dir);
  const std::string metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  const std::string trace_out = absl::GetFlag(FLAGS_trace_out);
  const std::string device = absl::GetFlag(FLAGS_device);
  const int threads = absl::GetFlag(FLAGS_threads);
  const int timeout_s = absl::GetFlag(FLAGS_timeout_s);
  const int slow_from_step = absl::GetFlag(FLAGS_slow_from_step);
  tandem::AgentModeFlags agent;
  agent.coordinator = absl::GetFlag(FLAGS_coordinator);
  agent.job_id = absl::GetFlag(FLAGS_job);
  agent.bind_host = absl::GetFlag(FLAGS_bind_host);
  agent.health_listen = absl::GetFlag(FLAGS_health_listen);
  agent.profile_window = absl::GetFlag(FLAGS_profile_window);
  agent.slow_node_ms = absl::GetFlag(FLAGS_slow_node_ms);
  agent.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  agent.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  agent.tls_key = absl::GetFlag(FLAGS_tls_key);
  const std::string join_secret_file = absl::GetFlag(FLAGS_join_secret_file);
  tandem::ExitIfInvalid(
      kCommandLine,
      {absl::GetFlag(FLAGS_rank) >= -1
           ? absl::OkStatus()
           : tandem::CheckAtLeast("--rank", absl::GetFlag(FLAGS_rank), 0),
       absl::GetFlag(FLAGS_world) == -1
           ? absl::OkStatus()
           : tandem::CheckAtLeast("--world", absl::GetFlag(FLAGS_world), 1),
       tandem::CheckAtLeast("--threads", threads, 0),
       tandem::CheckAtLeast("--block-steps", block_steps, 1),
       tandem::CheckPositive("--timeout-s", timeout_s),
       tandem::CheckAtLeast("--profile-window", agent.profile_window, 0),
       tandem::CheckAtLeast("--slow-from-step", slow_from_step, 0),
       tandem::CheckAtLeast("--slow-node-ms", agent.slow_node_ms, 0.0),
       tandem::CheckOneOf("--device", device, {"auto", "cpu", "cuda"}),
       metrics_listen.empty()
           ? absl::OkStatus()
           : tandem::CheckHostPort("--metrics-listen", metrics_listen,
                                   tandem::PortZero::kAllowed),
       // The exporter has no TLS or tokens of its own: only loopback, or
       // --insecure (a private network; worker/README.md, "Security").
       metrics_listen.empty()
           ? absl::OkStatus()
           : tandem::CheckListen("--metrics-listen", metrics_listen,
                                 {false, false, absl::GetFlag(FLAGS_insecure)}),
       agent.health_listen.empty()
           ? absl::OkStatus()
           : tandem::CheckHostPort("--health-listen", agent.health_listen,
                                   tandem::PortZero::kAllowed),
       agent.coordinator.empty()
           ? absl::OkStatus()
           : tandem::CheckHostPort("--coordinator", agent.coordinator,
                                   tandem::PortZero::kRejected)});

  // A launcher's variables, for the flags not given.
  const tandem::Environment env = tandem::Environment::Process();
  int rank = absl::GetFlag(FLAGS_rank);
  int world = absl::GetFlag(FLAGS_world);
  std::string rendezvous = absl::GetFlag(FLAGS_rendezvous);
  int rc = 0;
  if (rank < 0) {
    rc = FromEnvironment(tandem::RankFromEnvironment(env), "rank", &rank);
  }
  if (rc == 0 && world < 0) {
    rc = FromEnvironment(tandem::WorldSizeFromEnvironment(env), "world size",
                         &world);
  }
  if (rc == 0 && standalone && rendezvous.empty()) {
    rc = FromEnvironment(tandem::RendezvousFromEnvironment(env), "rendezvous",
                         &rendezvous);
  }
  if (rc != 0) return rc;
  if (!standalone) {
    absl::StatusOr<std::string> secret =
        tandem::ReadJoinSecret(join_secret_file, env);
    if (!secret.ok()) return Fail(std::string(secret.status().message()));
    agent.join_secret = *std::move(secret);
    agent.exit_with_parent = absl::GetFlag(FLAGS_exit_with_parent);
    // tandem launch's pid; a value that is no pid is no check.
    const std::optional<std::string> launcher = env.Get("TANDEM_LAUNCHER_PID");
    int64_t pid = 0;
    if (agent.exit_with_parent && launcher.has_value() &&
        absl::SimpleAtoi(*launcher, &pid) && pid > 0) {
      agent.launcher_pid = pid;
    }
  }

  if (standalone) {
    if (spec_path.empty() || rendezvous.empty() || rank < 0 || world < 1) {
      tandem::ExitWithUsageError(
          kCommandLine,
          "standalone mode needs --spec, --rank, --world and --rendezvous "
          "(or RANK, WORLD_SIZE and MASTER_ADDR/MASTER_PORT)");
    }
    if (rank >= world) {
      return Fail(absl::StrCat("--rank ", rank, " must be < --world ", world));
    }
  } else {
    if (!tandem::AgentModeBuilt()) {
      return tandem::RunAgentMode(agent, {}, nullptr);  // says why it cannot
    }
    if (agent.coordinator.empty() || agent.job_id.empty()) {
      tandem::ExitWithUsageError(
          kCommandLine,
          "agent mode needs --coordinator and --job (or use --standalone)");
    }
  }
  // Both modes: the device (and with it the collectives' backend) is known
  // before anything touches the network.
  absl::StatusOr<tandem::DeviceChoice> choice =
      tandem::ParseDeviceChoice(device);
  if (!choice.ok()) return Fail(std::string(choice.status().message()));
  absl::StatusOr<int> local_rank = tandem::LocalRankFromEnvironment();
  if (!local_rank.ok()) return Fail(std::string(local_rank.status().message()));
  absl::StatusOr<tandem::RuntimeOptions> runtime =
      tandem::ResolveRuntimeOptions(*choice, *local_rank,
                                    tandem::ThisBuildsCuda());
  if (!runtime.ok()) return Fail(std::string(runtime.status().message()));

  std::unique_ptr<MetricsExport> metrics;
  if (!metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsExport>> started =
        StartMetrics(metrics_listen);
    if (!started.ok()) return Fail(std::string(started.status().message()));
    metrics = *std::move(started);
  }
  tandem::IterationObserver* observer =
      metrics != nullptr ? metrics->observer.get() : nullptr;
  if (!standalone) {
    agent.rank = rank;
    agent.world = world > 0 ? world : 0;
    agent.threads = threads;
    agent.offload_dir = offload_dir;
    agent.slow_from_step = slow_from_step;
    return tandem::RunAgentMode(agent, *runtime, observer);
  }

  tandem::StandaloneOptions options;
  absl::StatusOr<tandem::v1::JobSpec> spec = tandem::LoadJobSpec(spec_path);
  if (!spec.ok()) return Fail(std::string(spec.status().message()));
  options.spec = *std::move(spec);
  absl::Status status =
      tandem::ParseRendezvousAddress(rendezvous, &options.rendezvous);
  if (!status.ok()) return Fail(std::string(status.message()));
  options.rendezvous.rank = rank;
  options.rendezvous.world_size = world;
  options.rendezvous.timeout = std::chrono::seconds(timeout_s);
  options.schedule_path = schedule_path;
  options.alternate_path = alternate_path;
  options.block_steps = block_steps;
  options.profile_out = profile_out;
  options.graph_out = graph_out;
  options.trace_out = trace_out;
  options.observer = observer;
  options.threads = threads;
  options.offload_dir = offload_dir;
  options.runtime = *runtime;
  std::fprintf(stderr, "tandem-worker rank %d: %s\n", rank,
               tandem::DescribeRuntime(*runtime).c_str());

  status = tandem::RunStandalone(options, std::cout);
  if (!status.ok()) {
    std::fprintf(stderr, "tandem-worker rank %d: %s\n", rank,
                 std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
