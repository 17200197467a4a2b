#include "coordinator/planner/job_plan.h"

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/archive/model_archive.h"
#include "common/archive/safetensors.h"
#include "common/bytes.h"
#include "common/did_you_mean.h"
#include "common/job/job_spec.h"
#include "common/lowering/lowering.h"
#include "common/models/graph_builder.h"
#include "coordinator/planner/pass_registry.h"

namespace tandem {

std::vector<std::string> CheckOptimizeSpec(const v1::OptimizeSpec& optimize,
                                           int32_t zero_stage) {
  std::vector<std::string> problems;
  if (!optimize.policy().empty() && optimize.passes_size() > 0) {
    problems.push_back(absl::StrCat(
        "optimize.policy '", optimize.policy(),
        "' and optimize.passes are both set; set the policy to run its "
        "pipeline, or only passes to run your own"));
  }
  if (!optimize.policy().empty()) {
    const std::optional<Policy> policy = ParsePolicy(optimize.policy());
    if (!policy.has_value()) {
      std::vector<std::string> names;
      for (Policy p : AllPolicies()) names.emplace_back(PolicyName(p));
      problems.push_back(absl::StrCat("optimize.policy '", optimize.policy(),
                                      "' is not a policy",
                                      DidYouMean(optimize.policy(), names),
                                      "; use ", absl::StrJoin(names, ", ")));
    } else if (*policy != Policy::kTandem && zero_stage == 1) {
      problems.push_back(absl::StrCat(
          "optimize.policy '", optimize.policy(),
          "' plans ZeRO-3 jobs only; use tandem with parallel.zero_stage 1"));
    }
  }
  for (int i = 0; i < optimize.passes_size(); ++i) {
    absl::Status status = PassRegistry::Default().Check(optimize.passes(i));
    if (!status.ok()) {
      problems.push_back(
          absl::StrCat("optimize.passes[", i, "]: ", status.message()));
    }
  }
  return problems;
}

PlanOptions PlanOptionsFromSpec(const v1::JobSpec& spec) {
  PlanOptions options;
  options.mode = spec.parallel().zero_stage() == 1 ? ShardingMode::kZero1
                                                   : ShardingMode::kZero3;
  options.passes.assign(spec.optimize().passes().begin(),
                        spec.optimize().passes().end());
  if (options.passes.empty()) {
    options.policy =
        ParsePolicy(spec.optimize().policy()).value_or(Policy::kTandem);
  }
  return options;
}

JobHardware HardwareForJob(const v1::JobSpec& spec,
                           const std::vector<RankDevice>& ranks) {
  JobHardware out;
  HardwareModel& hw = out.hw;
  const v1::HardwareSpec& declared = spec.hardware();
  hw.world_size = std::max(spec.parallel().world_size(), 1);

  std::map<std::string, int> per_host;
  bool any_gpu = false;
  for (const RankDevice& r : ranks) {
    ++per_host[r.hostname];
    any_gpu = any_gpu || absl::StartsWith(r.device, "cuda");
  }
  if (declared.ranks_per_node() > 0) {
    hw.ranks_per_node = declared.ranks_per_node();
  } else if (!per_host.empty()) {
    int most = 0;
    for (const auto& [host, n] : per_host) most = std::max(most, n);
    hw.ranks_per_node = most;
  } else {
    hw.ranks_per_node = hw.world_size;
    out.assumptions.push_back("all ranks on one node (none reported a host)");
  }

  // Links: the profile's collectives replace these with fits; until then a
  // declared rate, or the analytic defaults.
  if (declared.intra_node_gbps() > 0) {
    hw.intra_node_bytes_per_s = declared.intra_node_gbps() * 1e9;
  }
  if (declared.inter_node_gbps() > 0) {
    hw.inter_node_bytes_per_s = declared.inter_node_gbps() * 1e9;
  }
  if (declared.collective_latency_us() > 0) {
    hw.collective_latency_s = declared.collective_latency_us() * 1e-6;
  }
  // The host link until a profile's copies measure it (FitHostLink).
  if (declared.host_gbps() > 0) {
    hw.host_bytes_per_s = declared.host_gbps() * 1e9;
  } else {
    hw.host_bytes_per_s =
        any_gpu ? kAssumedGpuHostBytesPerS : kAssumedCpuHostBytesPerS;
  }

  // Memory per rank: declared, else the smallest share a device reports.
  int64_t memory = declared.device_memory_bytes();
  if (memory <= 0) {
    for (const RankDevice& r : ranks) {
      if (r.memory_bytes <= 0) continue;
      const bool shared = !absl::StartsWith(r.device, "cuda");
      const int64_t share =
          shared ? r.memory_bytes / std::max(per_host[r.hostname], 1)
                 : r.memory_bytes;
      memory = memory <= 0 ? share : std::min(memory, share);
    }
  }
  if (memory <= 0) {
    memory = kUnlimitedMemoryBytes;
    if (spec.memory().budget_bytes() <= 0) {
      out.assumptions.push_back(
          "no memory limit (no rank reported its device memory; set "
          "memory.budget_bytes or hardware.device_memory_bytes)");
    }
  }
  hw.device_memory_bytes = std::max(memory, spec.memory().budget_bytes());
  hw.budget_bytes = spec.memory().budget_bytes();
  return out;
}

std::string DescribeHardware(const HardwareModel& hw) {
  auto link = [](const PiecewiseLinear& fit, double rate) {
    return fit.empty()
               ? absl::StrFormat("%.3g GB/s (analytic)", rate / 1e9)
               : absl::StrCat("fitted (", fit.points().size(), " sizes)");
  };
  const double link_rate = hw.world_size <= hw.ranks_per_node
                               ? hw.intra_node_bytes_per_s
                               : hw.inter_node_bytes_per_s;
  std::string out = absl::StrFormat(
      "%d ranks, %d per node; all-gather %s, reduce-scatter %s, latency "
      "%.3g us; host link %.3g GB/s (%s); device memory %s, budget %s",
      hw.world_size, hw.ranks_per_node, link(hw.allgather_fit, link_rate),
      link(hw.reduce_scatter_fit, link_rate), hw.collective_latency_s * 1e6,
      hw.host_bytes_per_s / 1e9, hw.host_link_measured ? "measured" : "assumed",
      FormatBytes(hw.device_memory_bytes), FormatBytes(hw.budget()));
  if (hw.unmodeled_bytes > 0) {
    absl::StrAppend(&out, "; runtime holds ", FormatBytes(hw.unmodeled_bytes),
                    " beyond the memory model");
  }
  // The communicator's scratch, as the profile reported it.
  auto scratch = [](const CollectiveScratch& s) {
    return s.cap_bytes > 0 ? absl::StrCat(s.copies, "x (at most ",
                                          FormatBytes(s.cap_bytes), ")")
                           : absl::StrCat(s.copies, "x");
  };
  if (hw.collective_buffers && (hw.allgather_scratch.copies > 0 ||
                                hw.reduce_scatter_scratch.copies > 0)) {
    absl::StrAppend(&out, "; collectives hold scratch: all-gather ",
                    scratch(hw.allgather_scratch), ", reduce-scatter ",
                    scratch(hw.reduce_scatter_scratch), " their padded bytes");
  }
  if (hw.compute_s_per_allgather_byte > 0 ||
      hw.compute_s_per_reduce_scatter_byte > 0 ||
      hw.compute_s_per_copy_byte > 0) {
    absl::StrAppend(
        &out,
        absl::StrFormat("; transfers take compute: %.3g s per GB all-gathered, "
                        "%.3g reduce-scattered, %.3g copied (measured)",
                        hw.compute_s_per_allgather_byte * 1e9,
                        hw.compute_s_per_reduce_scatter_byte * 1e9,
                        hw.compute_s_per_copy_byte * 1e9));
  }
  if (hw.stretched()) {
    absl::StrAppend(
        &out, absl::StrFormat("; compute makes transfers %.2fx (all-gather), "
                              "%.2fx (reduce-scatter), %.2fx (copy) as long "
                              "(measured)",
                              hw.allgather_stretch, hw.reduce_scatter_stretch,
                              hw.copy_stretch));
  }
  if (hw.time_scale != 1) {
    absl::StrAppend(
        &out, absl::StrFormat(
                  "; measured times scaled by %.3f (the profiled schedule's "
                  "iteration against its nodes' and collectives' medians)",
                  hw.time_scale));
  }
  return out;
}

namespace {

// What an archive needs on each rank before any schedule choice, by parts.
// How the saved activations scale from the example batch to the job's: in
// proportion to the micro-batch, and along a token input's sequence in
// proportion to a longer one (at least linear) and to the square of a
// shorter one (attention's part shrinks with the square, the rest
// linearly), so that the figure stays a lower bound; in the example's
// dtype (DTypeScale gives the job's). Nullopt when the job's shapes are not
// known at submit (a tensors file with dims beyond the micro-batch that may
// vary).
std::optional<double> ActivationScale(const v1::JobSpec& spec,
                                      const v1::ArchiveManifest& manifest) {
  if (manifest.inputs().empty() || manifest.inputs(0).shape().empty() ||
      manifest.inputs(0).shape(0) <= 0 || spec.batch().micro_batch() <= 0) {
    return std::nullopt;
  }
  double scale = static_cast<double>(spec.batch().micro_batch()) /
                 static_cast<double>(manifest.inputs(0).shape(0));
  const bool tensors = spec.data().kind() == "tensors";
  for (const v1::ArchiveInput& in : manifest.inputs()) {
    const bool varies =
        std::any_of(in.dynamic_dims().begin(), in.dynamic_dims().end(),
                    [](int32_t d) { return d > 0; });
    if (!varies) continue;
    if (tensors) return std::nullopt;
    if (in.role() != "tokens" || in.shape_size() < 2 || in.shape(1) <= 0) {
      continue;
    }
    const double r = static_cast<double>(spec.batch().seq_len()) /
                     static_cast<double>(in.shape(1));
    scale *= r >= 1 ? r : r * r;
    break;  // one sequence length for every token input
  }
  return scale;
}

// What a job's dtype makes of what the exporter measured in f32: bf16
// halves it.
double DTypeScale(const v1::JobSpec& spec) {
  return spec.model().dtype() == v1::DTYPE_BF16 ? 0.5 : 1;
}

// The scratch the workers' communicator holds beyond a reduce-scatter's
// flat buffers (worker/runtime/communicator.cc, ReduceScatterScratch), as
// far as the spec tells it: on Gloo (hardware.device cpu) at world 3 or
// more, one copy of the padded input, capped at the pieces in flight
// (max_in_flight pieces of chunk_bytes from each of world - 2 peers). With
// comm.chunk_bytes automatic the workers choose pieces or whole messages
// by the link they measure at start; the pieces' cap, the smaller, keeps
// the check a lower bound. None where the device is not declared (NCCL's
// buffers are not counted).
CollectiveScratch SubmitReduceScatterScratch(const v1::JobSpec& spec) {
  const int64_t world = spec.parallel().world_size();
  if (world <= 2 || spec.hardware().device() != "cpu") return {};
  const int64_t chunk = spec.comm().chunk_bytes() > 0
                            ? spec.comm().chunk_bytes()
                            : kDefaultCommChunkBytes;
  const int64_t in_flight = spec.comm().max_in_flight() > 0
                                ? spec.comm().max_in_flight()
                                : kDefaultCommMaxInFlight;
  const int64_t pieces = in_flight * (world - 2);
  // A chunk past every collective: whole messages, one uncapped copy.
  if (chunk > std::numeric_limits<int64_t>::max() / pieces) return {1, 0};
  return {1, pieces * chunk};
}

// The hardware the checks at submit price a job on, workers not yet
// known. A lower bound: with instant host copies no state waits on the
// device for the link, so no plan the link allows peaks lower; the
// communicator's scratch counts where the memory model counts the
// collectives' buffers (an archive's units measured at export).
JobHardware SubmitHardware(const v1::JobSpec& spec) {
  JobHardware hardware = HardwareForJob(spec, {});
  hardware.hw.host_bytes_per_s = 1e18;
  hardware.hw.reduce_scatter_scratch = SubmitReduceScatterScratch(spec);
  return hardware;
}

// The iteration graph an archive's workers derive (worker/runtime/
// program.h, DeriveGraph: params in manifest order, then the nodes
// AppendIterationNodes lays out for both), for the memory model at submit. Each
// forward node keeps what its unit saves for backward
// (ArchiveUnit.saved_activation_bytes, or the manifest's total spread evenly
// over the units in archives written before the exporter measured it per unit)
// scaled to the job's batch; none under activation checkpointing (every unit
// but the last recomputes) or when the job's shapes are not known at submit.
// `activations` is what the forward nodes keep, summed over one micro-batch.
// `samples`: each node's own memory as the exporter measured it
// (ArchiveUnit.memory) at the job's batch, for CalibrateNodeMemory; empty
// when the archive has none or the job's shapes are not known. `runtime`:
// what a rank holds beyond the memory model whatever the schedule (the
// buffers, the loaded TorchScript modules, a micro-batch of the inputs).
struct ArchiveGraph {
  Graph graph;
  int64_t activations = 0;
  std::vector<MemorySample> samples;
  int64_t runtime = 0;
};

// A unit's own memory at the job's batch: the exporter's two micro-batches
// (the example's and twice it) interpolated linearly to `micro_batch` (the
// job's, in the example's other dims, scaled as ActivationScale scales the
// saved activations), times `dtype_scale`; in proportion from one.
// Nullopt when the unit has no measurement for `recompute`.
std::optional<std::array<int64_t, 4>> UnitMemoryAt(const v1::ArchiveUnit& unit,
                                                   bool recompute,
                                                   double micro_batch,
                                                   double dtype_scale) {
  std::vector<const v1::ArchiveUnitMemory*> at;
  for (const v1::ArchiveUnitMemory& m : unit.memory()) {
    if (m.recompute() != recompute || m.micro_batch() <= 0) continue;
    if (std::none_of(at.begin(), at.end(), [&](const auto* a) {
          return a->micro_batch() == m.micro_batch();
        })) {
      at.push_back(&m);
    }
  }
  if (at.empty()) return std::nullopt;
  auto fields = [](const v1::ArchiveUnitMemory& m) {
    return std::array<double, 4>{static_cast<double>(m.forward_rise_bytes()),
                                 static_cast<double>(m.forward_net_bytes()),
                                 static_cast<double>(m.backward_rise_bytes()),
                                 static_cast<double>(m.backward_net_bytes())};
  };
  const std::array<double, 4> a = fields(*at[0]);
  const double ma = static_cast<double>(at[0]->micro_batch());
  std::array<int64_t, 4> out{};
  for (int i = 0; i < 4; ++i) {
    double v = a[i] * micro_batch / ma;
    if (at.size() >= 2) {
      const double mb = static_cast<double>(at[1]->micro_batch());
      v = a[i] + (fields(*at[1])[i] - a[i]) / (mb - ma) * (micro_batch - ma);
    }
    out[i] = static_cast<int64_t>(v * dtype_scale);
  }
  out[0] = std::max<int64_t>(out[0], 0);  // rises
  out[2] = std::max<int64_t>(out[2], 0);
  return out;
}

// What a rank of an archive's job holds beyond the memory model whatever
// the schedule: the buffers (floating ones in the compute dtype), what
// loading the units' and glues' TorchScript modules keeps, and one
// micro-batch of the inputs at the job's shape (a token input's second dim
// is the job's seq_len).
int64_t ArchiveRuntimeBytes(const v1::JobSpec& spec,
                            const v1::ArchiveManifest& m) {
  const bool bf16 = spec.model().dtype() == v1::DTYPE_BF16;
  int64_t bytes = 0;
  for (const v1::ArchiveBuffer& b : m.buffers()) {
    int64_t n = 1;
    for (int64_t d : b.shape()) n *= std::max<int64_t>(d, 0);
    const bool floating =
        absl::StartsWith(b.dtype(), "float") || b.dtype() == "bfloat16";
    bytes += n * (floating && bf16 ? 2 : DTypeElementBytes(b.dtype()));
  }
  for (const v1::ArchiveUnit& u : m.units()) bytes += u.loaded_bytes();
  for (const v1::ArchiveGlue& g : m.glues()) bytes += g.loaded_bytes();
  for (const v1::ArchiveInput& in : m.inputs()) {
    int64_t n = 1;
    for (int i = 0; i < in.shape_size(); ++i) {
      int64_t d = std::max<int64_t>(in.shape(i), 0);
      if (i == 0) d = std::max(1, spec.batch().micro_batch());
      if (i == 1 && in.role() == "tokens" && spec.batch().seq_len() > 0) {
        d = spec.batch().seq_len();
      }
      n *= d;
    }
    bytes += n * DTypeElementBytes(in.dtype());
  }
  return bytes;
}

ArchiveGraph BuildArchiveGraph(const v1::JobSpec& spec,
                               const v1::ArchiveManifest& m) {
  ArchiveGraph out;
  Graph& g = out.graph;
  g.name = m.name();
  g.world_size = std::max(1, spec.parallel().world_size());
  g.micro_batches = std::max(1, spec.batch().grad_accum());
  g.tokens_per_micro_batch =
      int64_t{spec.batch().micro_batch()} * std::max(1, spec.batch().seq_len());
  const DType dtype =
      spec.model().dtype() == v1::DTYPE_BF16 ? DType::kBF16 : DType::kF32;
  if (dtype == DType::kBF16 && spec.train().reduce_dtype() == v1::DTYPE_F32) {
    g.reduce_dtype = DType::kF32;
  }
  std::map<std::string, int32_t> ids;
  for (const v1::ArchiveParam& p : m.params()) {
    Param param;
    param.id = static_cast<int32_t>(g.params.size());
    param.name = p.name();
    for (int64_t d : p.shape()) param.shape.push_back(std::max<int64_t>(d, 0));
    param.dtype = dtype;
    param.unit = p.units().empty() ? std::string() : p.units(0);
    param.trainable = p.requires_grad();
    ids[p.name()] = param.id;
    g.params.push_back(std::move(param));
  }
  const bool checkpointing = spec.model().activation_checkpointing();
  const std::optional<double> scale = ActivationScale(spec, m);
  bool per_unit = false;
  for (const v1::ArchiveUnit& u : m.units()) {
    per_unit = per_unit || u.saved_activation_bytes() > 0;
  }
  const int n = m.units_size();
  std::vector<int64_t> saved(n, 0);
  for (int i = 0; i < n && scale.has_value(); ++i) {
    if (checkpointing && i + 1 < n) continue;
    const double bytes =
        per_unit ? static_cast<double>(m.units(i).saved_activation_bytes())
                 : static_cast<double>(m.saved_activation_bytes()) / n;
    saved[i] = static_cast<int64_t>(bytes * *scale * DTypeScale(spec));
    out.activations += saved[i];
  }
  std::vector<IterationUnit> units(n);
  for (int i = 0; i < n; ++i) {
    units[i].name = m.units(i).name();
    for (const std::string& name : m.units(i).params()) {
      auto it = ids.find(name);
      if (it != ids.end()) units[i].param_ids.push_back(it->second);
    }
    units[i].recompute = checkpointing && i + 1 < n;
    units[i].activation_bytes = saved[i];
  }
  AppendIterationNodes(units, g);
  out.runtime = ArchiveRuntimeBytes(spec, m);

  // Nodes k·2n + i (unit i's forward of micro-batch k) and k·2n + 2n-1-i
  // (its backward), as AppendIterationNodes lays them out.
  if (!scale.has_value() || n == 0) return out;
  const double micro_batch = static_cast<double>(m.inputs(0).shape(0)) * *scale;
  std::vector<std::array<int64_t, 4>> own(n);
  for (int i = 0; i < n; ++i) {
    std::optional<std::array<int64_t, 4>> at = UnitMemoryAt(
        m.units(i), units[i].recompute, micro_batch, DTypeScale(spec));
    if (!at.has_value()) return out;  // all units or none
    own[i] = *at;
  }
  for (int32_t k = 0; k < g.micro_batches; ++k) {
    for (int i = 0; i < n; ++i) {
      MemorySample forward;
      forward.node_id = k * 2 * n + i;
      forward.rise_bytes = own[i][0];
      forward.net_bytes = own[i][1];
      MemorySample backward;
      backward.node_id = k * 2 * n + 2 * n - 1 - i;
      backward.rise_bytes = own[i][2];
      backward.net_bytes = own[i][3];
      out.samples.push_back(forward);
      out.samples.push_back(backward);
    }
  }
  return out;
}

// The least-memory peak of an archive's job by the memory model, calibrated
// with the exporter's measurements of the units' own memory where the
// archive has them, as a first profile calibrates it (what the memory guard
// then holds the job to); the runtime's fixed holdings on top.
absl::StatusOr<int64_t> ArchiveSmallestBudget(const v1::JobSpec& spec,
                                              ArchiveGraph archive) {
  JobHardware hardware = SubmitHardware(spec);
  const ShardingMode mode = PlanOptionsFromSpec(spec).mode;
  if (!archive.samples.empty()) {
    absl::StatusOr<Schedule> ran = StartingSchedule(archive.graph, mode);
    HardwareModel calibrated = hardware.hw;
    calibrated.collective_buffers = true;  // the worker's, as measured
    if (ran.ok() &&
        CalibrateNodeMemory(archive.graph, *ran, archive.samples, calibrated)
            .ok()) {
      hardware.hw = calibrated;
    }
  }
  hardware.hw.unmodeled_bytes = archive.runtime;
  return SmallestFeasibleBudget(archive.graph, hardware.hw, mode);
}

}  // namespace

absl::Status CheckBudgetFits(const v1::JobSpec& spec) {
  const int64_t budget = spec.memory().budget_bytes();
  if (budget <= 0) return absl::OkStatus();
  if (spec.model().kind() == "torchscript") {
    // ValidateJobSpec reports an archive that does not read.
    absl::StatusOr<v1::ArchiveManifest> manifest =
        ReadArchiveManifest(spec.model().path());
    if (!manifest.ok()) return absl::OkStatus();
    ArchiveGraph archive = BuildArchiveGraph(spec, *manifest);
    const int64_t activations = archive.activations;
    const bool measured = !archive.samples.empty();
    absl::StatusOr<int64_t> smallest =
        ArchiveSmallestBudget(spec, std::move(archive));
    if (!smallest.ok() || *smallest <= budget) return absl::OkStatus();
    const std::string saved =
        activations > 0
            ? absl::StrCat(
                  ", plus the activations its forward saves for backward at "
                  "batch.micro_batch ",
                  spec.batch().micro_batch(), ", ", FormatBytes(activations),
                  measured ? ", what its units' forwards and backwards hold "
                             "beyond them"
                           : "",
                  ", as measured at export and scaled to the job's batch")
            : std::string();
    return absl::InvalidArgumentError(absl::StrCat(
        "memory.budget_bytes ", budget, " B is below ", FormatBytes(*smallest),
        ", the peak of the least-memory schedule (every optimizer state "
        "offloaded) by the memory model on the archive's params (each "
        "rank's shards and gradient shards, a unit's params gathered whole "
        "and its gradients)",
        saved,
        ", and what a rank holds whatever the schedule (the archive's "
        "buffers, its loaded units and a micro-batch of inputs)",
        "; no schedule needs less: set memory.budget_bytes: ",
        PasteableBudget(*smallest),
        measured ? " or more, "
                 : " or more (the first profile measures the rest and names "
                   "the smallest budget that fits), ",
        activations > 0 && !spec.model().activation_checkpointing()
            ? "turn on model.activation_checkpointing, "
            : "",
        "or shard over more ranks"));
  }
  // ValidateJobSpec reports a model that does not build.
  absl::StatusOr<ModelConfig> config = ModelConfigFromJobSpec(spec);
  if (!config.ok()) return absl::OkStatus();
  absl::StatusOr<Graph> graph = BuildModelGraph(*config);
  if (!graph.ok()) return absl::OkStatus();
  absl::StatusOr<int64_t> smallest = SmallestFeasibleBudget(
      *graph, SubmitHardware(spec).hw, PlanOptionsFromSpec(spec).mode);
  // The least-memory schedule, the guard's fallback, may use the budget
  // itself (the guard band binds the other schedules): a budget at least
  // its peak never fails for memory.
  if (!smallest.ok() || *smallest <= budget) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "memory.budget_bytes ", budget, " B is below ", FormatBytes(*smallest),
      ", the peak of the least-memory schedule (every optimizer state "
      "offloaded) by the memory model, and no schedule needs less: set "
      "memory.budget_bytes: ",
      PasteableBudget(*smallest),
      " or more (the first profile measures what the workers hold), or "
      "shard over more ranks"));
}

}  // namespace tandem
