// runtime_bench: iteration time of the worker runtime on a tiny Llama
// (4 layers, d_model 256, seq 128, micro-batch 4 per rank) at world 2 over
// Gloo on loopback, under three schedules -- gather on demand, prefetching
// (gathers hoisted two nodes ahead) and everything persistent -- and the
// profiler's cost (on vs off, interleaved blocks under one schedule).
// Then offload at a memory budget that forces part of the optimizer states
// out: the offload pass's adaptive plan (just enough states, reloads chained
// back from the optimizer by host-link time) against offloading every
// param's states; and ZeRO-1 (bucketed reduce-scatter, replicated params)
// against ZeRO-3 at the same world size. Offloaded states go to the CPU host
// tier (mmap'd files under $TANDEM_OFFLOAD_DIR or /tmp). Last, activation
// checkpointing at world 1 (one rank, so the process's counted peak is that
// rank's): the counted peak with and without it, against the drop the
// simulator predicts from the graph builder's estimates. `--case
// mixed_precision` measures bf16 (reduced in bf16 or f32) against f32: the
// counted peak against the predicted one, and the iteration time at world W.
// Ranks are threads of this process, each with its own process group, one
// intra-op thread and OPENBLAS_NUM_THREADS=1 (set it in the environment).
//
//   build/bench/runtime_bench [--steps N] [--layers L] [--world W]
//                             [--case all|checkpointing|mixed_precision]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ATen/Parallel.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/flags/command_line.h"
#include "common/flags/flag_checks.h"
#include "common/ir/text_format.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"
#include "common/sim/hardware_model.h"
#include "common/sim/simulator.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"
#include "worker/data/micro_batch.h"
#include "worker/data/token_source.h"
#include "worker/models/builtin_models.h"
#include "worker/runtime/communicator.h"
#include "worker/runtime/executor.h"
#include "worker/runtime/memory_meter.h"
#include "worker/runtime/process_group.h"
#include "worker/runtime/profiler.h"
#include "worker/runtime/standard_schedules.h"

ABSL_FLAG(int, steps, 10, "measured steps per schedule");
ABSL_FLAG(int, layers, 4, "tiny-llama's layers");
ABSL_FLAG(int, world, 2, "ranks (threads of this process, Gloo on loopback)");
ABSL_FLAG(std::string, case, "all",
          "all (the schedules), checkpointing or mixed_precision");

namespace tandem {
namespace {

struct Sample {
  double iteration_s = 0;
  double exposed_s = 0;
  int64_t peak_bytes = 0;
  bool profiled = false;
  double copy_wait_s = 0;
  int64_t offloaded_bytes = 0;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

using MakeSchedule = std::function<absl::StatusOr<Schedule>(const Graph&)>;

// Runs `steps` measured steps (after 2 warm-up steps) on `world` rank
// threads; returns rank 0's samples. `profile_on(step)` says whether the
// profiler records that step.
std::vector<Sample> Run(const ModelConfig& config, int world, int steps,
                        const MakeSchedule& make,
                        const std::function<bool(int)>& profile_on) {
  static int run = 0;
  const std::string prefix = absl::StrCat("bench", run++);
  c10d::TCPStoreOptions server_opts;
  server_opts.port = 0;
  server_opts.isServer = true;
  server_opts.waitWorkers = false;
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server_opts);
  std::vector<Sample> samples;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      auto fail = [rank](const absl::Status& s) {
        std::fprintf(stderr, "rank %d: %s\n", rank,
                     std::string(s.message()).c_str());
        std::exit(1);
      };
      c10d::TCPStoreOptions opts;
      opts.port = server->getPort();
      auto store = c10::make_intrusive<c10d::PrefixStore>(
          prefix, c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts));
      auto group = CreateProcessGroupFromStore(store, rank, world,
                                               CollectiveBackend::kGloo,
                                               std::chrono::seconds(120));
      if (!group.ok()) fail(group.status());
      Communicator comm(*group);
      auto program = BuildModelProgram(config, 1);
      if (!program.ok()) fail(program.status());
      auto graph = DeriveGraph(*program, world, 1,
                               int64_t{config.micro_batch} * config.seq_len);
      if (!graph.ok()) fail(graph.status());
      // The planner reads the builder's time and memory estimates.
      auto estimates = BuildModelGraph(config);
      if (!estimates.ok()) fail(estimates.status());
      if (absl::Status s = AnnotateEstimates(*estimates, *graph); !s.ok()) {
        fail(s);
      }
      auto schedule = make(*graph);
      if (!schedule.ok()) fail(schedule.status());
      auto params = ShardedParamStore::Create(*program, rank, world);
      if (!params.ok()) fail(params.status());
      ExecutorOptions options;
      auto executor =
          Executor::Create(&*program, *graph, params->get(), &comm,
                           CountingCpuAllocator::Get(), *schedule, options);
      if (!executor.ok()) fail(executor.status());
      auto data = MakeSyntheticTokens(1, config.vocab, config.seq_len);
      for (int step = 0; step < steps + 2; ++step) {
        const bool profiled = profile_on(step);
        (*executor)->profiler().set_enabled(profiled);
        auto batches =
            ReadRankBatches(*data, step, 1, rank, world, config.micro_batch);
        if (!batches.ok()) fail(batches.status());
        auto stats = (*executor)->RunStep(*batches);
        if (!stats.ok()) fail(stats.status());
        if (rank == 0 && step >= 2) {
          samples.push_back({stats->iteration_s, stats->exposed_comm_s,
                             stats->peak_bytes, profiled, stats->exposed_copy_s,
                             stats->offloaded_bytes});
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return samples;
}

struct Summary {
  double iteration_s = 0;
  double exposed_s = 0;
  double copy_wait_s = 0;
  int64_t peak_bytes = 0;
  int64_t offloaded_bytes = 0;
};

Summary Summarize(const std::vector<Sample>& samples) {
  std::vector<double> it, ex, copy;
  Summary out;
  for (const Sample& x : samples) {
    it.push_back(x.iteration_s);
    ex.push_back(x.exposed_s);
    copy.push_back(x.copy_wait_s);
    out.peak_bytes = std::max(out.peak_bytes, x.peak_bytes);
    out.offloaded_bytes = std::max(out.offloaded_bytes, x.offloaded_bytes);
  }
  out.iteration_s = Median(it);
  out.exposed_s = Median(ex);
  out.copy_wait_s = Median(copy);
  return out;
}

// The planner's binary, built next to this one: the bench plans with the
// exact planner a job runs, and the worker never includes the coordinator.
std::string TandemPlanPath() {
  if (const char* path = std::getenv("TANDEM_PLAN")) return path;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "tandem-plan";
  std::string dir(self, static_cast<size_t>(n));
  dir.resize(dir.rfind('/'));
  return dir + "/../coordinator/tandem-plan";
}

// Tandem's adaptive offload (zero3-insert, offload, prefetch) at `budget`,
// planned by tandem-plan on the H100 analytic links.
absl::StatusOr<Schedule> PlanAdaptiveOffload(const Graph& graph, int world,
                                             int64_t budget) {
  const std::string base =
      absl::StrCat("/tmp/runtime_bench_", getpid(), "_", world);
  {
    std::ofstream out(base + ".graph");
    out << PrintGraph(graph);
  }
  const std::string command = absl::StrCat(
      TandemPlanPath(), " --graph ", base, ".graph --hw world=", world,
      " --budget ", budget,
      " --passes zero3-insert,offload,prefetch --summary --schedule-out ", base,
      ".schedule > /dev/null");
  const int rc = std::system(command.c_str());
  std::ifstream in(base + ".schedule");
  std::stringstream text;
  text << in.rdbuf();
  std::remove((base + ".graph").c_str());
  std::remove((base + ".schedule").c_str());
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("'", command, "' failed (exit ", rc,
                     "); build tandem-plan or set TANDEM_PLAN"));
  }
  absl::StatusOr<Schedule> schedule = ParseSchedule(text.str());
  if (schedule.ok()) schedule->version = 1;
  return schedule;
}

// Offload-all against adaptive offload at a budget that forces part of the
// states out, then ZeRO-1 against ZeRO-3.
void RunOffloadAndZero1(const ModelConfig& config, int world, int steps) {
  // The budget: the prefetching plan's simulated peak less a part of the
  // optimizer states at that peak -- the largest part (of those tried) for
  // which the adaptive plan still keeps some states on the device.
  int64_t budget = 0;
  double fraction = 0;
  {
    absl::StatusOr<Program> program = BuildModelProgram(config, 1);
    absl::StatusOr<Graph> graph = DeriveGraph(
        *program, world, 1, int64_t{config.micro_batch} * config.seq_len);
    absl::StatusOr<Graph> estimates = BuildModelGraph(config);
    if (!graph.ok() || !estimates.ok() ||
        !AnnotateEstimates(*estimates, *graph).ok()) {
      std::fprintf(stderr, "cannot build the graph\n");
      std::exit(1);
    }
    absl::StatusOr<Schedule> base = OnDemandSchedule(*graph, 1);
    absl::StatusOr<Schedule> prefetch = HoistGathers(*graph, *base, 2);
    absl::StatusOr<SimResult> sim =
        Simulate(*graph, *prefetch, HardwareModel::H100(world));
    if (!sim.ok()) {
      std::fprintf(stderr, "%s\n", std::string(sim.status().message()).c_str());
      std::exit(1);
    }
    for (double f : {0.5, 0.4, 0.3, 0.2, 0.1}) {
      fraction = f;
      budget = sim->peak_bytes -
               static_cast<int64_t>(f * sim->peak_breakdown.optimizer_states);
      absl::StatusOr<Schedule> plan =
          PlanAdaptiveOffload(*graph, world, budget);
      if (plan.ok() && plan->offloads.size() < graph->params.size()) break;
    }
  }
  auto plan_adaptive = [world,
                        budget](const Graph& g) -> absl::StatusOr<Schedule> {
    return PlanAdaptiveOffload(g, world, budget);
  };
  auto offload_all = [world,
                      budget](const Graph& g) -> absl::StatusOr<Schedule> {
    // Every param's states, copied out after the first node and back
    // during the second half of backward, on the same prefetching plan.
    auto base = OnDemandSchedule(g, 1);
    if (!base.ok()) return base;
    auto prefetch = HoistGathers(g, *base, 2);
    if (!prefetch.ok()) return prefetch;
    std::vector<int32_t> all;
    for (const Param& p : g.params) all.push_back(p.id);
    const int backward = (static_cast<int>(g.nodes.size()) - 1) / 2;
    return OffloadStates(g, *prefetch, all, backward / 2);
  };
  {
    absl::StatusOr<Program> program = BuildModelProgram(config, 1);
    absl::StatusOr<Graph> graph = DeriveGraph(
        *program, world, 1, int64_t{config.micro_batch} * config.seq_len);
    absl::StatusOr<Graph> estimates = BuildModelGraph(config);
    (void)AnnotateEstimates(*estimates, *graph);
    absl::StatusOr<Schedule> adaptive = plan_adaptive(*graph);
    if (!adaptive.ok()) {
      std::fprintf(stderr, "adaptive plan: %s\n",
                   std::string(adaptive.status().message()).c_str());
      std::exit(1);
    }
    int64_t moved = 0;
    for (const OffloadEntry& o : adaptive->offloads) moved += o.bytes;
    std::printf(
        "\noffload at a budget of %.1f MiB per rank (simulated; the prefetch "
        "plan peaks %.0f%% of its optimizer states above it): adaptive moves "
        "%zu of %zu params' states (%.1f MiB per rank)\n",
        budget / 1048576.0, 100 * fraction, adaptive->offloads.size(),
        graph->params.size(), moved / 1048576.0);
  }
  std::printf("%-16s %12s %14s %12s %12s %14s\n", "schedule", "iteration_s",
              "exposed_comm_s", "copy_wait_s", "peak_MiB", "offloaded_MiB");
  const std::pair<const char*, MakeSchedule> offload_schedules[] = {
      {"prefetch",
       [](const Graph& g) -> absl::StatusOr<Schedule> {
         auto base = OnDemandSchedule(g, 1);
         if (!base.ok()) return base;
         return HoistGathers(g, *base, 2);
       }},
      {"offload-all", offload_all},
      {"adaptive", plan_adaptive},
  };
  for (const auto& [name, make] : offload_schedules) {
    const Summary r =
        Summarize(Run(config, world, steps, make, [](int) { return true; }));
    std::printf("%-16s %12.4f %14.4f %12.4f %12.1f %14.1f\n", name,
                r.iteration_s, r.exposed_s, r.copy_wait_s,
                r.peak_bytes / 1048576.0, r.offloaded_bytes / 1048576.0);
  }

  std::printf("\nZeRO-1 against ZeRO-3, world %d\n", world);
  std::printf("%-16s %12s %14s %12s\n", "schedule", "iteration_s",
              "exposed_comm_s", "peak_MiB");
  const std::pair<const char*, MakeSchedule> stages[] = {
      {"zero3 on-demand",
       [](const Graph& g) { return OnDemandSchedule(g, 1); }},
      {"zero3 prefetch",
       [](const Graph& g) -> absl::StatusOr<Schedule> {
         auto base = OnDemandSchedule(g, 1);
         if (!base.ok()) return base;
         return HoistGathers(g, *base, 2);
       }},
      {"zero1", [](const Graph& g) { return Zero1Schedule(g, 1); }},
  };
  for (const auto& [name, make] : stages) {
    const Summary r =
        Summarize(Run(config, world, steps, make, [](int) { return true; }));
    std::printf("%-16s %12.4f %14.4f %12.1f\n", name, r.iteration_s,
                r.exposed_s, r.peak_bytes / 1048576.0);
  }
}

// The simulator's peak for the graph builder's graph of `config` under the
// on-demand schedule, on the H100 memory model with the worker's collective
// buffers; exits on an error.
int64_t SimulatedOnDemandPeak(const ModelConfig& config) {
  absl::StatusOr<Graph> graph = BuildModelGraph(config);
  absl::StatusOr<Schedule> schedule =
      graph.ok() ? OnDemandSchedule(*graph, 1)
                 : absl::StatusOr<Schedule>(graph.status());
  HardwareModel hw = HardwareModel::H100(1);
  hw.collective_buffers = true;
  absl::StatusOr<SimResult> sim =
      schedule.ok() ? Simulate(*graph, *schedule, hw)
                    : absl::StatusOr<SimResult>(schedule.status());
  if (!sim.ok()) {
    std::fprintf(stderr, "%s\n", std::string(sim.status().message()).c_str());
    std::exit(1);
  }
  return sim->peak_bytes;
}

// Activation checkpointing at world 1 on `config`'s model: the counted peak
// (max over the measured steps) and median iteration with and without it
// under the on-demand schedule, and the drop in peak the simulator predicts
// for the two graphs (the builder's activation and workspace bytes) on the
// H100 memory model with the worker's collective buffers. Bytes the model
// does not count (what CalibrateMemory measures) are the same in both runs
// and cancel in the drop.
void RunCheckpointingMemory(ModelConfig config, int steps) {
  config.world_size = 1;
  std::printf(
      "\nactivation checkpointing, world 1 (%d layers, d_model %d, %d heads, "
      "seq %d, micro-batch %d), on-demand\n",
      config.layers, config.d_model, config.heads, config.seq_len,
      config.micro_batch);
  std::printf("%-16s %12s %12s %14s\n", "model", "iteration_s", "peak_MiB",
              "simulated_MiB");
  auto on_demand = [](const Graph& g) { return OnDemandSchedule(g, 1); };
  int64_t measured[2] = {0, 0};
  int64_t simulated[2] = {0, 0};
  for (int checkpointing = 0; checkpointing < 2; ++checkpointing) {
    config.activation_checkpointing = checkpointing == 1;
    simulated[checkpointing] = SimulatedOnDemandPeak(config);
    const Summary r =
        Summarize(Run(config, 1, steps, on_demand, [](int) { return true; }));
    measured[checkpointing] = r.peak_bytes;
    std::printf("%-16s %12.4f %12.2f %14.2f\n",
                checkpointing ? "checkpointing" : "no checkpointing",
                r.iteration_s, r.peak_bytes / 1048576.0,
                simulated[checkpointing] / 1048576.0);
  }
  const double drop = static_cast<double>(measured[0] - measured[1]);
  const double predicted = static_cast<double>(simulated[0] - simulated[1]);
  std::printf(
      "peak drop: counted %.2f MiB (%.1f%% of the peak), predicted %.2f MiB; "
      "prediction %+.1f%% of the counted drop\n",
      drop / 1048576.0, 100.0 * drop / static_cast<double>(measured[0]),
      predicted / 1048576.0, 100.0 * (predicted - drop) / drop);
}

// Mixed precision on `config`'s model: at world 1 the counted peak of f32,
// bf16 reducing in bf16 and bf16 reducing in f32 under on-demand, against
// the simulator's prediction with the bytes it does not model (the f32
// run's counted peak less its simulated one) added; then the iteration time
// of the three at `world` ranks, where gathers and bf16 reduces move half
// the bytes.
void RunMixedPrecision(ModelConfig config, int world, int steps) {
  struct Variant {
    const char* name;
    DType dtype;
    DType reduce;
  };
  const Variant variants[] = {{"f32", DType::kF32, DType::kF32},
                              {"bf16", DType::kBF16, DType::kBF16},
                              {"bf16 reduce f32", DType::kBF16, DType::kF32}};
  auto on_demand = [](const Graph& g) { return OnDemandSchedule(g, 1); };
  std::printf(
      "\nmixed precision, world 1 (%d layers, d_model %d, seq %d, "
      "micro-batch %d), on-demand\n",
      config.layers, config.d_model, config.seq_len, config.micro_batch);
  std::printf("%-16s %12s %12s %14s %12s\n", "model", "iteration_s", "peak_MiB",
              "predicted_MiB", "error");
  int64_t unmodeled = 0;
  for (const Variant& v : variants) {
    ModelConfig c = config;
    c.world_size = 1;
    c.dtype = v.dtype;
    c.reduce_dtype = v.reduce;
    const int64_t simulated = SimulatedOnDemandPeak(c);
    const Summary r =
        Summarize(Run(c, 1, steps, on_demand, [](int) { return true; }));
    if (v.dtype == DType::kF32) unmodeled = r.peak_bytes - simulated;
    const int64_t predicted = simulated + unmodeled;
    std::printf("%-16s %12.4f %12.2f %14.2f %+11.1f%%\n", v.name, r.iteration_s,
                r.peak_bytes / 1048576.0, predicted / 1048576.0,
                100.0 * (static_cast<double>(predicted) /
                             static_cast<double>(r.peak_bytes) -
                         1));
  }
  if (world < 2) return;
  std::printf("\nmixed precision, world %d, on-demand\n", world);
  std::printf("%-16s %12s %14s\n", "model", "iteration_s", "exposed_comm_s");
  for (const Variant& v : variants) {
    ModelConfig c = config;
    c.world_size = world;
    c.dtype = v.dtype;
    c.reduce_dtype = v.reduce;
    const Summary r =
        Summarize(Run(c, world, steps, on_demand, [](int) { return true; }));
    std::printf("%-16s %12.4f %14.4f\n", v.name, r.iteration_s, r.exposed_s);
  }
}

int Main(int argc, char** argv) {
  const CommandLineSpec spec{
      "runtime_bench",
      "usage: runtime_bench [--steps N] [--layers L] [--world W] "
      "[--case all|checkpointing|mixed_precision]\n"};
  ParseCommandLineOrExit(spec, argc, argv);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int layers = absl::GetFlag(FLAGS_layers);
  const int world = absl::GetFlag(FLAGS_world);
  const std::string which = absl::GetFlag(FLAGS_case);
  ExitIfInvalid(
      spec, {CheckPositive("--steps", steps), CheckPositive("--layers", layers),
             CheckPositive("--world", world),
             CheckOneOf("--case", which,
                        {"all", "checkpointing", "mixed_precision"})});
  CountingCpuAllocator::Install();
  at::set_num_threads(1);
  absl::StatusOr<ModelConfig> config = ParseModelConfig(
      absl::StrCat("preset=tiny-llama layers=", layers, " world=", world));
  if (!config.ok()) return 2;
  if (which == "checkpointing") {
    RunCheckpointingMemory(*config, steps);
    return 0;
  }
  if (which == "mixed_precision") {
    RunMixedPrecision(*config, world, steps);
    return 0;
  }
  std::printf(
      "tiny Llama: %d layers, d_model %d, seq %d, micro-batch %d per "
      "rank, world %d, %d measured steps (median)\n",
      config->layers, config->d_model, config->seq_len, config->micro_batch,
      world, steps);
  std::printf("%-12s %12s %14s %12s\n", "schedule", "iteration_s",
              "exposed_comm_s", "peak_MiB");
  const std::pair<const char*, MakeSchedule> schedules[] = {
      {"on-demand", [](const Graph& g) { return OnDemandSchedule(g, 1); }},
      {"prefetch",
       [](const Graph& g) -> absl::StatusOr<Schedule> {
         auto base = OnDemandSchedule(g, 1);
         if (!base.ok()) return base;
         return HoistGathers(g, *base, 2);
       }},
      {"persistent",
       [](const Graph& g) { return AllPersistentSchedule(g, 1); }},
  };
  for (const auto& [name, make] : schedules) {
    const std::vector<Sample> s =
        Run(*config, world, steps, make, [](int) { return true; });
    std::vector<double> it, ex;
    int64_t peak = 0;
    for (const Sample& x : s) {
      it.push_back(x.iteration_s);
      ex.push_back(x.exposed_s);
      peak = std::max(peak, x.peak_bytes);
    }
    std::printf("%-12s %12.4f %14.4f %12.1f\n", name, Median(it), Median(ex),
                peak / 1048576.0);
  }
  // Profiler cost, two ways. (1) A/B: steps alternate profiler on and off
  // under one schedule, so drift in machine load hits both alike.
  const int overhead_steps = 2 * steps;
  const std::vector<Sample> s =
      Run(*config, world, overhead_steps, schedules[0].second,
          [](int step) { return step % 2 == 0; });
  std::vector<double> on, off;
  for (const Sample& x : s) (x.profiled ? on : off).push_back(x.iteration_s);
  const double m_on = Median(on), m_off = Median(off);
  std::printf(
      "profiler A/B: on %.4f s, off %.4f s median: %+.2f%% (%zu/%zu "
      "steps, on-demand)\n",
      m_on, m_off, 100.0 * (m_on - m_off) / m_off, on.size(), off.size());
  // (2) Direct: the bookkeeping the executor does per iteration when
  // profiling (per node two clock reads, two meter reads, a node time and a
  // memory sample; per collective one timing), timed in a loop.
  const int nodes = 2 * (2 * config->layers + 4) + 1;
  const int collectives =
      2 * (2 * config->layers + 3) + (2 * config->layers + 3);
  MemoryMeter* meter = CountingCpuAllocator::Get();
  Profiler profiler(true, nodes);
  constexpr int kIterations = 20000;
  const auto start = std::chrono::steady_clock::now();
  volatile int64_t sink = 0;
  for (int it = 0; it < kIterations; ++it) {
    profiler.BeginIteration(it, 1);
    for (int n = 0; n < nodes; ++n) {
      const int64_t before = meter->current_bytes();
      const auto t0 = std::chrono::steady_clock::now();
      const auto t1 = std::chrono::steady_clock::now();
      profiler.RecordNode(n, std::chrono::duration<double>(t1 - t0).count());
      profiler.RecordMemory(n, before, meter->current_bytes());
    }
    for (int c = 0; c < collectives; ++c) {
      CollectiveTiming t;
      t.kind = c % 3 == 2 ? CollectiveKind::kReduceScatter
                          : CollectiveKind::kAllGather;
      t.group_id = c;
      t.node_id = c % nodes;
      t.bytes = 1 << 20;
      t.issue_to_done_s = 1e-3;
      profiler.RecordCollective(t);
    }
    profiler.EndIteration(0.1, 1);
    sink = sink + profiler.iterations();
  }
  const double per_iteration =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count() /
      kIterations;
  std::printf(
      "profiler bookkeeping: %.2f us per iteration (%d nodes, %d "
      "collectives) = %.4f%% of the on-demand iteration (%.4f s)\n",
      per_iteration * 1e6, nodes, collectives, 100.0 * per_iteration / m_off,
      m_off);
  RunOffloadAndZero1(*config, world, steps);
  RunCheckpointingMemory(*config, steps);
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
