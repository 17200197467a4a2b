// tandem-worker: one rank of a Tandem job.
//
//   tandem-worker --coordinator HOST:PORT --job ID [--rank R]
//                 [--bind-host H] [--threads N] [--profile-window N]
//                 [--health-listen HOST:PORT] [--world W]
//   tandem-worker --standalone --spec job.yaml --rank R --world W
//                 --rendezvous HOST:PORT [--schedule FILE]
//                 [--profile-out FILE] [--trace-out FILE] [--threads N]
//                 [--timeout-s S] [--graph-out FILE]
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
// In agent mode SIGTERM and SIGINT stop the rank cleanly: it tells the
// coordinator (the job fails with "rank r stopped by signal SIGTERM") and
// exits with 128 + the signal. --health-listen serves grpc.health.v1.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/http_exporter.h"
#include "common/metrics/metrics_registry.h"
#include "worker/agent_mode.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/runtime/memory_meter.h"
#include "worker/runtime/process_group.h"
#include "worker/spec/job_spec_yaml.h"
#include "worker/standalone/standalone_trainer.h"
#include "worker/trainer/runtime_options.h"

namespace {

constexpr char kUsage[] =
    "usage: tandem-worker --coordinator HOST:PORT --job ID [--rank R] "
    "[--bind-host H] [--threads N] [--profile-window N] "
    "[--health-listen HOST:PORT] [--world W]\n"
    "       tandem-worker --standalone --spec job.yaml --rank R --world W "
    "--rendezvous HOST:PORT [--schedule FILE] [--profile-out FILE] "
    "[--trace-out FILE] [--threads N] [--timeout-s S] [--graph-out FILE]\n"
    "       both modes: [--device auto|cpu|cuda] [--metrics-listen HOST:PORT] "
    "[--offload-dir DIR]\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "tandem-worker: %s\n", message.c_str());
  return 2;
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

  bool standalone = false;
  std::string spec_path, rendezvous, schedule_path, profile_out, graph_out;
  std::string offload_dir;
  std::string metrics_listen, trace_out;
  std::string device = "auto";
  tandem::AgentModeFlags agent;
  int rank = -1, world = -1, threads = 0, timeout_s = 300;
  int slow_from_step = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    auto int_value = [&](int* out) {
      std::string text;
      return value(&text) && absl::SimpleAtoi(text, out);
    };
    bool ok = true;
    if (arg == "--standalone") {
      standalone = true;
    } else if (arg == "--spec") {
      ok = value(&spec_path);
    } else if (arg == "--rendezvous") {
      ok = value(&rendezvous);
    } else if (arg == "--schedule") {
      ok = value(&schedule_path);
    } else if (arg == "--profile-out") {
      ok = value(&profile_out);
    } else if (arg == "--graph-out") {
      ok = value(&graph_out);
    } else if (arg == "--offload-dir") {
      ok = value(&offload_dir);
    } else if (arg == "--trace-out") {
      ok = value(&trace_out);
    } else if (arg == "--metrics-listen") {
      ok = value(&metrics_listen);
    } else if (arg == "--rank") {
      ok = int_value(&rank);
    } else if (arg == "--world") {
      ok = int_value(&world);
    } else if (arg == "--threads") {
      ok = int_value(&threads);
    } else if (arg == "--timeout-s") {
      ok = int_value(&timeout_s);
    } else if (arg == "--device") {
      ok = value(&device);
    } else if (arg == "--coordinator") {
      ok = value(&agent.coordinator);
    } else if (arg == "--job") {
      ok = value(&agent.job_id);
    } else if (arg == "--bind-host") {
      ok = value(&agent.bind_host);
    } else if (arg == "--health-listen") {
      ok = value(&agent.health_listen);
    } else if (arg == "--profile-window") {
      ok = int_value(&agent.profile_window);
    } else if (arg == "--slow-from-step") {
      ok = int_value(&slow_from_step);
    } else if (arg == "--slow-node-ms") {
      std::string text;
      ok = value(&text) && absl::SimpleAtod(text, &agent.slow_node_ms) &&
           agent.slow_node_ms >= 0;
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      return Fail(absl::StrCat("unknown flag '", arg, "'\n", kUsage));
    }
    if (!ok) {
      return Fail(absl::StrCat(arg, " needs a ",
                               arg == "--rank" || arg == "--world" ||
                                       arg == "--threads" ||
                                       arg == "--timeout-s"
                                   ? "integer"
                                   : "value",
                               "\n", kUsage));
    }
  }
  if (standalone) {
    if (spec_path.empty() || rendezvous.empty() || rank < 0 || world < 1) {
      return Fail(absl::StrCat(
          "--spec, --rank, --world and --rendezvous are required\n", kUsage));
    }
    if (rank >= world) {
      return Fail(absl::StrCat("--rank ", rank, " must be < --world ", world));
    }
  } else {
    if (!tandem::AgentModeBuilt()) {
      return tandem::RunAgentMode(agent, {}, nullptr);  // says why it cannot
    }
    if (agent.coordinator.empty() || agent.job_id.empty()) {
      return Fail(absl::StrCat(
          "agent mode needs --coordinator and --job (or use --standalone)\n",
          kUsage));
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
