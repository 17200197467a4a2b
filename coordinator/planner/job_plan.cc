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
struct ArchiveBound {
  // Every param's fp32 shard.
  int64_t shards = 0;
  // The largest unit's params gathered whole (each unit's params are
  // gathered for its forward under any schedule).
  int64_t largest_unit = 0;
  // What the forward saves for backward at the job's batch (the manifest's
  // saved_activation_bytes scaled from the example's shape; 0 when the
  // archive does not say, under activation checkpointing, or when the
  // job's shapes are not known at submit).
  int64_t activations = 0;
  // At the end of a forward every shard and every saved activation is
  // alive; during a unit's forward, its params gathered whole.
  int64_t total() const { return shards + std::max(largest_unit, activations); }
};

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

// Nullopt when the archive does not read (ValidateJobSpec reports that).
std::optional<ArchiveBound> ArchiveMemoryLowerBound(const v1::JobSpec& spec) {
  absl::StatusOr<v1::ArchiveManifest> manifest =
      ReadArchiveManifest(spec.model().path());
  if (!manifest.ok()) return std::nullopt;
  const int64_t world = std::max(1, spec.parallel().world_size());
  std::map<std::string, int64_t> numel;
  ArchiveBound bound;
  for (const v1::ArchiveParam& p : manifest->params()) {
    int64_t n = 1;
    for (int64_t d : p.shape()) n *= std::max<int64_t>(d, 0);
    numel[p.name()] = n;
    bound.shards += (n + world - 1) / world * int64_t{sizeof(float)};
  }
  for (const v1::ArchiveUnit& u : manifest->units()) {
    int64_t bytes = 0;
    for (const std::string& name : u.params()) {
      auto it = numel.find(name);
      if (it != numel.end()) bytes += it->second * int64_t{sizeof(float)};
    }
    bound.largest_unit = std::max(bound.largest_unit, bytes);
  }
  if (manifest->saved_activation_bytes() > 0 &&
      !spec.model().activation_checkpointing()) {
    if (std::optional<double> scale = ActivationScale(spec, *manifest)) {
      bound.activations = static_cast<int64_t>(
          static_cast<double>(manifest->saved_activation_bytes()) * *scale);
    }
  }
  return bound;
}

}  // namespace

absl::Status CheckBudgetFits(const v1::JobSpec& spec) {
  const int64_t budget = spec.memory().budget_bytes();
  if (budget <= 0) return absl::OkStatus();
  if (spec.model().kind() == "torchscript") {
    const std::optional<ArchiveBound> bound = ArchiveMemoryLowerBound(spec);
    if (!bound.has_value() || bound->total() <= budget) {
      return absl::OkStatus();
    }
    const std::string what =
        bound->activations > bound->largest_unit
            ? absl::StrCat(
                  "what the archive's params and activations take on each "
                  "rank at the end of a forward (every param's shard, ",
                  FormatBytes(bound->shards),
                  ", plus the activations its forward saves for backward at "
                  "batch.micro_batch ",
                  spec.batch().micro_batch(), ", ",
                  FormatBytes(bound->activations),
                  ", as measured at export and scaled to the job's batch)")
            : absl::StrCat(
                  "what the archive's params alone take on each rank (every "
                  "param's shard plus the largest unit's params gathered "
                  "whole, before any activation)");
    return absl::InvalidArgumentError(absl::StrCat(
        "memory.budget_bytes ", budget, " B is below ",
        FormatBytes(bound->total()), ", ", what,
        ": set memory.budget_bytes: ", PasteableBudget(bound->total()),
        " or more (the first profile measures the rest and names the "
        "smallest budget that fits), ",
        bound->activations > bound->largest_unit
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
