#include "coordinator/planner/job_plan.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/archive/model_archive.h"
#include "common/bytes.h"
#include "common/did_you_mean.h"
#include "common/job/job_spec.h"
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
// linearly), so that the figure stays a lower bound. Nullopt when the
// job's shapes are not known at submit (a tensors file with dims beyond the
// micro-batch that may vary).
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
  if (spec.model().dtype() == v1::DTYPE_BF16) scale *= 0.5;
  return scale;
}

// The iteration graph an archive's workers derive (worker/runtime/
// program.h, DeriveGraph: params in manifest order, then the nodes
// AppendIterationNodes lays out for both), for the memory model at submit. Each
// forward node keeps what its unit saves for backward
// (ArchiveUnit.saved_activation_bytes, or the manifest's total spread evenly
// over the units in archives written before the exporter measured it per unit)
// scaled to the job's batch; none under activation checkpointing (every unit
// but the last recomputes) or when the job's shapes are not known at submit.
// Workspace is not known: 0, so the peak stays a lower bound. `activations` is
// what the forward nodes keep, summed over one micro-batch.
struct ArchiveGraph {
  Graph graph;
  int64_t activations = 0;
};

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
    saved[i] = static_cast<int64_t>(bytes * *scale);
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
  return out;
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
    const ArchiveGraph archive = BuildArchiveGraph(spec, *manifest);
    JobHardware hardware = HardwareForJob(spec, {});
    hardware.hw.host_bytes_per_s = 1e18;
    absl::StatusOr<int64_t> smallest = SmallestFeasibleBudget(
        archive.graph, hardware.hw, PlanOptionsFromSpec(spec).mode);
    if (!smallest.ok() || *smallest <= budget) return absl::OkStatus();
    const std::string activations =
        archive.activations > 0
            ? absl::StrCat(
                  ", plus the activations its forward saves for backward at "
                  "batch.micro_batch ",
                  spec.batch().micro_batch(), ", ",
                  FormatBytes(archive.activations),
                  ", as measured at export and scaled to the job's batch")
            : std::string();
    return absl::InvalidArgumentError(absl::StrCat(
        "memory.budget_bytes ", budget, " B is below ", FormatBytes(*smallest),
        ", the peak of the least-memory schedule (every optimizer state "
        "offloaded) by the memory model on the archive's params (each "
        "rank's shards and gradient shards, a unit's params gathered whole "
        "and its gradients)",
        activations, "; no schedule needs less: set memory.budget_bytes: ",
        PasteableBudget(*smallest),
        " or more (the first profile measures the rest and names the "
        "smallest budget that fits), ",
        archive.activations > 0 && !spec.model().activation_checkpointing()
            ? "turn on model.activation_checkpointing, "
            : "",
        "or shard over more ranks"));
  }
  // ValidateJobSpec reports a model that does not build.
  absl::StatusOr<ModelConfig> config = ModelConfigFromJobSpec(spec);
  if (!config.ok()) return absl::OkStatus();
  absl::StatusOr<Graph> graph = BuildModelGraph(*config);
  if (!graph.ok()) return absl::OkStatus();
  JobHardware hardware = HardwareForJob(spec, {});
  // A lower bound: with instant host copies no state waits on the device for
  // the link, so no plan the link allows peaks lower.
  hardware.hw.host_bytes_per_s = 1e18;
  absl::StatusOr<int64_t> smallest = SmallestFeasibleBudget(
      *graph, hardware.hw, PlanOptionsFromSpec(spec).mode);
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
