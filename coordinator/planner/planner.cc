#include "coordinator/planner/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/bytes.h"
#include "common/ir/validate.h"
#include "common/lowering/least_memory.h"
#include "common/status_macros.h"
#include "coordinator/passes/invariant_checkers.h"
#include "coordinator/passes/zero3_insert_pass.h"
#include "coordinator/planner/pass_registry.h"

namespace tandem {
namespace {

constexpr Policy kAllPolicies[] = {Policy::kOnDemand, Policy::kDeepSpeedZero3,
                                   Policy::kFsdp, Policy::kDeepCompile,
                                   Policy::kTandem};

// The passes, in order, with the four invariant checkers; the memory checker
// is left out when `check_memory` is false.
absl::StatusOr<std::unique_ptr<PassPipeline>> BuildPipeline(
    absl::string_view name, const std::vector<std::string>& passes,
    PassRecordSink* sink, bool check_memory) {
  auto pipeline = std::make_unique<PassPipeline>(std::string(name), sink);
  pipeline->AddInvariantChecker<GatherBeforeUseChecker>();
  pipeline->AddInvariantChecker<NoUseAfterReleaseChecker>();
  pipeline->AddInvariantChecker<ReduceOnceChecker>();
  if (check_memory) pipeline->AddInvariantChecker<MemoryBudgetChecker>();
  RETURN_IF_ERROR(PassRegistry::Default().AddTo(passes, *pipeline));
  return pipeline;
}

// Holds pass records until the run they belong to is the one returned.
class BufferedSink : public PassRecordSink {
 public:
  void Record(const PassRecord& record) override { records_.push_back(record); }
  void Clear() { records_.clear(); }
  void ForwardTo(PassRecordSink* sink) const {
    if (sink == nullptr) return;
    for (const PassRecord& record : records_) sink->Record(record);
  }

 private:
  std::vector<PassRecord> records_;
};

// A context holding the plan the job starts from: the on-demand baseline for
// ZeRO-3 (what workers run before any plan, so the memory checker judges
// every pass against it), an empty ZeRO-1 plan otherwise.
absl::StatusOr<std::unique_ptr<PlanningContext>> SeededContext(
    const Graph& graph, const HardwareModel& hw, const PlanOptions& options) {
  auto context = std::make_unique<PlanningContext>(graph, hw, options.planner);
  context->schedule().mode = options.mode;
  if (options.mode == ShardingMode::kZero3) {
    Zero3InsertPass baseline;
    RETURN_IF_ERROR(baseline.Run(*context).status());
  }
  RETURN_IF_ERROR(context->Resimulate());
  // The explanation starts from the schedule the job starts on before any
  // plan (for ZeRO-3 the seeded baseline; for ZeRO-1 zero1's default plan).
  ASSIGN_OR_RETURN(Schedule starting, StartingSchedule(graph, options.mode));
  ASSIGN_OR_RETURN(SimResult baseline, Simulate(graph, starting, hw));
  context->decisions().Start(baseline);
  return context;
}

// The least-memory plan (common/lowering/least_memory.h), simulated.
absl::StatusOr<PlanResult> LeastMemoryPlan(const Graph& graph,
                                           const HardwareModel& hw,
                                           ShardingMode mode) {
  PlanningContext context(graph, hw);
  ASSIGN_OR_RETURN(context.schedule(), LeastMemorySchedule(graph, mode));
  context.schedule().version = 0;
  RETURN_IF_ERROR(context.Resimulate());
  PlanResult result;
  result.schedule = context.schedule();
  result.sim = context.sim();
  result.feasible = result.sim.peak_bytes <= hw.budget();
  return result;
}

// What would fit, from what fills the least-memory plan's peak.
std::string WhatWouldFit(const Graph& graph, const SimResult& least,
                         ShardingMode mode) {
  const MemoryBreakdown& b = least.peak_breakdown;
  const int64_t sharded = b.sharded_params + b.gradients;
  bool checkpointed = false;
  for (const Node& node : graph.nodes) {
    checkpointed = checkpointed || node.recompute;
  }
  std::vector<std::string> ways;
  ways.push_back("raise memory.budget_bytes to at least that");
  if (mode == ShardingMode::kZero1) {
    ways.push_back(
        "use parallel.zero_stage 3, which shards params and gradients too");
  } else if (sharded > 0) {
    ways.push_back(absl::StrCat("shard over more ranks (sharded params and ",
                                "gradients hold ", FormatBytes(sharded),
                                " at the peak and shrink with the world)"));
  }
  if (b.activations > 0) {
    ways.push_back(absl::StrCat(
        checkpointed ? "use a smaller batch.micro_batch or batch.seq_len"
                     : "turn on model.activation_checkpointing or use a "
                       "smaller batch.micro_batch",
        " (activations hold ", FormatBytes(b.activations), " at the peak)"));
  }
  return absl::StrJoin(ways, "; or ");
}

// `measured_peak` > 0: the least-memory schedule's peak as measured under
// it, which the figure is then (the model's otherwise).
absl::Status Infeasible(const Graph& graph, const HardwareModel& hw,
                        ShardingMode mode, absl::string_view why,
                        int64_t measured_peak = 0) {
  absl::StatusOr<PlanResult> least = LeastMemoryPlan(graph, hw, mode);
  if (!least.ok()) return least.status();
  const int64_t smallest =
      measured_peak > 0 ? measured_peak : least->sim.peak_bytes;
  return absl::ResourceExhaustedError(absl::StrCat(
      "no plan fits the budget of ", FormatBytes(hw.budget()),
      " per rank: the smallest feasible budget is ", FormatBytes(smallest),
      measured_peak > 0 ? ", measured under that schedule" : "",
      " (memory.budget_bytes: ", PasteableBudget(smallest), ")",
      mode == ShardingMode::kZero1
          ? " (the ZeRO-1 plan with every optimizer state offloaded). "
          : " (the on-demand baseline with every optimizer state offloaded). ",
      "To fit: ", WhatWouldFit(graph, least->sim, mode), ". (", why, ")"));
}

// The least-memory fallback's explanation: one decision from the baseline
// the context's log started at to the fallback plan.
Explanation ExplainLeastMemory(const PlanningContext& context,
                               const PlanResult& least, absl::string_view why) {
  DecisionLog log;
  SimResult baseline;
  const Explanation& started = context.decisions().explanation();
  baseline.iteration_s = started.baseline_iteration_s;
  baseline.exposed_comm_s = started.baseline_exposed_comm_s;
  baseline.peak_bytes = started.baseline_peak_bytes;
  log.Start(baseline);
  Decision d;
  d.kind = DecisionKind::kLeastMemory;
  for (const OffloadEntry& entry : least.schedule.offloads) {
    d.offload_ids.push_back(entry.id);
    d.held_bytes += entry.bytes;
  }
  d.what = absl::StrCat("every optimizer state offloaded (",
                        least.schedule.offloads.size(),
                        " entries) on the baseline: the pipeline found no "
                        "plan within the budget (",
                        why, ")");
  d.binding = MemoryBinding(least.sim, context.budget());
  log.RecordPlanner(std::move(d), least.sim);
  return log.explanation();
}

}  // namespace

absl::string_view PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kOnDemand:
      return "on-demand";
    case Policy::kDeepSpeedZero3:
      return "deepspeed-zero3";
    case Policy::kFsdp:
      return "fsdp";
    case Policy::kDeepCompile:
      return "deepcompile";
    case Policy::kTandem:
      return "tandem";
  }
  return "?";
}

std::optional<Policy> ParsePolicy(absl::string_view name) {
  for (Policy policy : kAllPolicies) {
    if (PolicyName(policy) == name) return policy;
  }
  return std::nullopt;
}

std::vector<Policy> AllPolicies() {
  return std::vector<Policy>(std::begin(kAllPolicies), std::end(kAllPolicies));
}

absl::StatusOr<Graph> ApplyProfile(const Graph& graph, const Profile& profile) {
  // Valid for `graph`, checked where it came in (README.md, "The path of a
  // profile"): a calibration runs this up to about a hundred times.
  Graph out = graph;
  const GraphIndex index(out);
  for (const NodeTiming& timing : profile.nodes) {
    const int pos = index.NodePos(timing.node_id);
    if (pos < 0) continue;
    const double lost =
        profile.compute_s_per_allgather_byte *
            static_cast<double>(timing.allgather_overlap_bytes) +
        profile.compute_s_per_reduce_scatter_byte *
            static_cast<double>(timing.reduce_scatter_overlap_bytes) +
        profile.compute_s_per_copy_byte *
            static_cast<double>(timing.copy_overlap_bytes);
    out.nodes[pos].time_s = timing.time_s - std::min(lost, 0.9 * timing.time_s);
  }
  return out;
}

// A profile's stretch, 1 when not measured.
double Stretch(double measured) {
  return measured >= 1 ? std::min(measured, HardwareModel::kMaxStretch) : 1;
}

absl::Status FitCollectives(const Profile& profile, HardwareModel& hw) {
  std::vector<std::pair<int64_t, double>> allgather;
  std::vector<std::pair<int64_t, double>> reduce_scatter;
  // What each took alone: the part of its run compute ran alongside went
  // at 1/stretch of its alone rate (HardwareModel's stretch).
  auto alone = [](const CollectiveTiming& c, double stretch) {
    const double run = c.run_s > 0 ? c.run_s : c.issue_to_done_s;
    const double computing = std::clamp(c.computing_s, 0.0, run);
    return run - computing * (1 - 1 / stretch);
  };
  for (const CollectiveTiming& c : profile.collectives) {
    if (c.kind == CollectiveKind::kAllGather) {
      allgather.emplace_back(c.bytes,
                             alone(c, Stretch(profile.allgather_stretch)));
    } else if (c.kind == CollectiveKind::kReduceScatter) {
      reduce_scatter.emplace_back(
          c.bytes, alone(c, Stretch(profile.reduce_scatter_stretch)));
    }
  }
  if (!allgather.empty()) {
    absl::StatusOr<PiecewiseLinear> fit =
        PiecewiseLinear::Fit(std::move(allgather));
    if (!fit.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "profile: all-gather timings: ", fit.status().message()));
    }
    hw.allgather_fit = *std::move(fit);
  }
  if (!reduce_scatter.empty()) {
    absl::StatusOr<PiecewiseLinear> fit =
        PiecewiseLinear::Fit(std::move(reduce_scatter));
    if (!fit.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "profile: reduce-scatter timings: ", fit.status().message()));
    }
    hw.reduce_scatter_fit = *std::move(fit);
  }
  return absl::OkStatus();
}

void FitHostLink(const Profile& profile, HardwareModel& hw) {
  if (profile.host_copy_bytes <= 0 || profile.host_copy_s <= 0) return;
  hw.host_bytes_per_s =
      static_cast<double>(profile.host_copy_bytes) / profile.host_copy_s;
  hw.host_link_measured = true;
}

void FitCollectiveScratch(const Profile& profile, HardwareModel& hw) {
  hw.allgather_scratch = profile.allgather_scratch;
  hw.reduce_scatter_scratch = profile.reduce_scatter_scratch;
}

void FitInterference(const Profile& profile, HardwareModel& hw) {
  if (profile.compute_s_per_allgather_byte > 0) {
    hw.compute_s_per_allgather_byte = profile.compute_s_per_allgather_byte;
  }
  if (profile.compute_s_per_reduce_scatter_byte > 0) {
    hw.compute_s_per_reduce_scatter_byte =
        profile.compute_s_per_reduce_scatter_byte;
  }
  if (profile.compute_s_per_copy_byte > 0) {
    hw.compute_s_per_copy_byte = profile.compute_s_per_copy_byte;
  }
  if (profile.allgather_stretch > 0) {
    hw.allgather_stretch = Stretch(profile.allgather_stretch);
  }
  if (profile.reduce_scatter_stretch > 0) {
    hw.reduce_scatter_stretch = Stretch(profile.reduce_scatter_stretch);
  }
  if (profile.copy_stretch > 0) hw.copy_stretch = Stretch(profile.copy_stretch);
}

absl::Status CalibrateMemory(Graph& timed, const Schedule& profiled,
                             const Profile& profile, HardwareModel& hw) {
  hw.unmodeled_bytes = 0;
  for (Node& node : timed.nodes) {
    node.measured_extra_bytes = 0;
    node.measured_carry_bytes = 0;
  }
  if (profile.peak_bytes <= 0) return absl::OkStatus();
  // The profile comes from the Tandem worker, which packs collectives.
  hw.collective_buffers = true;
  RETURN_IF_ERROR(CalibrateNodeMemory(timed, profiled, profile.memory, hw));
  absl::StatusOr<SimResult> sim = Simulate(timed, profiled, hw);
  if (!sim.ok()) return sim.status();
  hw.unmodeled_bytes =
      std::max<int64_t>(0, profile.peak_bytes - sim->peak_bytes);
  return absl::OkStatus();
}

std::vector<std::string> PolicyPasses(Policy policy, ShardingMode mode) {
  switch (policy) {
    case Policy::kOnDemand:
      return {"zero3-insert"};
    // FSDP and DeepSpeed ZeRO-3 (DeepCompile's runtime) reduce-scatter every
    // micro-batch's gradients into sharded accumulators.
    case Policy::kDeepSpeedZero3:
      return {"deepspeed-persistence", "zero3-insert:reduce=micro-batch",
              "split-groups", "deepspeed-prefetch"};
    case Policy::kFsdp:
      return {"zero3-insert:grouping=unit,reduce=micro-batch", "fsdp-prefetch"};
    case Policy::kDeepCompile:
      // DeepCompile runs on ZeRO-3 (small params persistent), gathers param
      // by param, and schedules offloading before profiling the passes that
      // follow.
      return {"deepspeed-persistence", "zero3-insert:reduce=micro-batch",
              "split-groups",          "memory-only-offload",
              "greedy-prefetch",       "greedy-unshard"};
    case Policy::kTandem:
      // coordinator/passes/README.md.
      if (mode == ShardingMode::kZero1) return {"zero1", "offload"};
      // offload-unshard-search plans offload-lend → micro-batch-reduce-lend
      // → unshard → micro-batch-reduce-return → offload-return → prefetch
      // for several lend levels and unshard arrangements.
      return {"zero3-insert", "micro-batch-reduce", "offload", "prefetch",
              "offload-unshard-search"};
  }
  return {};
}

absl::StatusOr<PlanResult> Plan(const Graph& graph, const HardwareModel& hw,
                                const PlanOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(ValidateGraph(graph));
  if (hw.world_size != graph.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the hardware model is for ", hw.world_size, " ranks but graph '",
        graph.name, "' for ", graph.world_size,
        "; set the hardware's world=", graph.world_size));
  }
  // A job's own passes are planned like Tandem's.
  const bool tandem_like =
      options.policy == Policy::kTandem || !options.passes.empty();
  if (!tandem_like && options.mode != ShardingMode::kZero3) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy ", PolicyName(options.policy),
                     " plans ZeRO-3 jobs only; use the tandem policy for "
                     "ZeRO-1"));
  }

  ASSIGN_OR_RETURN(std::unique_ptr<PlanningContext> context,
                   SeededContext(graph, hw, options));
  const std::vector<std::string> passes =
      options.passes.empty() ? PolicyPasses(options.policy, options.mode)
                             : options.passes;
  const std::string name =
      options.passes.empty() ? std::string(PolicyName(options.policy)) : "job";
  BufferedSink records;
  ASSIGN_OR_RETURN(std::unique_ptr<PassPipeline> pipeline,
                   BuildPipeline(name, passes, &records,
                                 /*check_memory=*/true));
  absl::Status status = pipeline->Run(*context).status();

  PlanResult result;
  if (tandem_like) {
    if (status.ok() && context->sim().peak_bytes > hw.budget()) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("the plan's simulated peak is ",
                       FormatBytes(context->sim().peak_bytes)));
    }
    if (!status.ok() && status.code() == absl::StatusCode::kResourceExhausted) {
      // Tandem's passes found no plan within the budget. The least-memory
      // plan (what SmallestFeasibleBudget measures) may still fit: return
      // it rather than fail a budget the error message would call feasible.
      ASSIGN_OR_RETURN(PlanResult least,
                       LeastMemoryPlan(graph, hw, options.mode));
      if (!least.feasible) {
        return Infeasible(graph, hw, options.mode, status.message());
      }
      result = std::move(least);
      records.Clear();
      result.schedule.explanation =
          ExplainLeastMemory(*context, result, status.message());
    } else if (!status.ok()) {
      return status;
    } else {
      result.schedule = context->schedule();
      result.sim = context->sim();
      result.schedule.explanation = context->decisions().explanation();
    }
  } else {
    if (status.code() == absl::StatusCode::kResourceExhausted) {
      // The framework would run out of memory; plan it anyway, unchecked for
      // memory, and report it infeasible.
      ASSIGN_OR_RETURN(context, SeededContext(graph, hw, options));
      records.Clear();
      ASSIGN_OR_RETURN(pipeline, BuildPipeline(name, passes, &records,
                                               /*check_memory=*/false));
      status = pipeline->Run(*context).status();
    }
    RETURN_IF_ERROR(status);
    result.schedule = context->schedule();
    result.sim = context->sim();
    result.schedule.explanation = context->decisions().explanation();
  }
  records.ForwardTo(options.sink);
  result.feasible = result.sim.peak_bytes <= hw.budget();
  if (options.policy == Policy::kTandem && options.passes.empty() &&
      options.mode == ShardingMode::kZero3) {
    // Never behind, predicted: under the same calibrated model, the
    // reference policies' plans too; the fastest that fits wins.
    const double own_iteration_s = result.sim.iteration_s;
    // Every plan that fits, Tandem's own first: the fastest is returned, the
    // fastest different one is the runner-up.
    std::vector<PlanAlternative> fits;
    std::vector<std::optional<Policy>> fits_policy;
    if (result.feasible) {
      fits.push_back({"tandem", result.schedule, result.sim});
      fits_policy.push_back(std::nullopt);
    }
    for (Policy reference : kAllPolicies) {
      if (reference == Policy::kTandem) continue;
      PlanOptions other;
      other.policy = reference;
      other.planner = options.planner;
      absl::StatusOr<PlanResult> theirs = Plan(graph, hw, other);
      if (!theirs.ok() || !theirs->feasible) continue;
      fits.push_back({std::string(PolicyName(reference)),
                      std::move(theirs->schedule), std::move(theirs->sim)});
      fits_policy.push_back(reference);
    }
    // Ties keep the earlier: Tandem's own before the references.
    auto faster = [&](size_t a, size_t b) {
      return fits[a].sim.iteration_s < fits[b].sim.iteration_s * (1 - 1e-9);
    };
    std::optional<size_t> best;
    for (size_t i = 0; i < fits.size(); ++i) {
      if (!best.has_value() || faster(i, *best)) best = i;
    }
    std::optional<size_t> second;
    for (size_t i = 0; best.has_value() && i < fits.size(); ++i) {
      if (i == *best || SamePlan(fits[i].schedule, fits[*best].schedule)) {
        continue;
      }
      if (!second.has_value() || faster(i, *second)) second = i;
    }
    if (best.has_value() && fits_policy[*best].has_value()) {
      result.schedule = fits[*best].schedule;
      result.sim = fits[*best].sim;
      result.adopted_policy = fits_policy[*best];
    }
    if (second.has_value()) {
      result.runner_up = std::move(fits[*second]);
      result.runner_up->schedule.budget_bytes = hw.budget();
    }
    if (result.adopted_policy.has_value()) {
      result.schedule.provenance.passes.push_back(absl::StrCat(
          "chosen-over-tandem:", PolicyName(*result.adopted_policy)));
      // The adopted plan's own decisions chain from the same baseline to
      // it; the choice itself changes nothing further.
      Decision chosen;
      chosen.kind = DecisionKind::kPolicy;
      chosen.pass = "planner";
      chosen.what = absl::StrFormat(
          "%s's plan (predicted %.6f s) chosen over Tandem's own pipeline "
          "(%.6f s): the fastest plan that fits",
          PolicyName(*result.adopted_policy), result.sim.iteration_s,
          own_iteration_s);
      result.schedule.explanation.decisions.push_back(std::move(chosen));
    }
  }
  result.plan_wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  result.schedule.budget_bytes = hw.budget();
  result.schedule.provenance.plan_wall_s = result.plan_wall_s;
  result.hw = hw;
  return result;
}

namespace {

// `profile` with every duration it measured multiplied by `scale`: node
// times, collectives, host copies and the compute seconds per byte moved.
Profile ScaledTimes(const Profile& profile, double scale) {
  Profile out = profile;
  out.iteration_s *= scale;
  for (NodeTiming& n : out.nodes) n.time_s *= scale;
  for (CollectiveTiming& c : out.collectives) {
    c.issue_to_done_s *= scale;
    c.run_s *= scale;
    c.exposed_s *= scale;
    c.computing_s *= scale;
  }
  out.host_copy_s *= scale;
  out.compute_s_per_allgather_byte *= scale;
  out.compute_s_per_reduce_scatter_byte *= scale;
  out.compute_s_per_copy_byte *= scale;
  return out;
}

// CalibrateToMeasurements without the time scale; `ran` is the schedule
// the profile was measured under, when known.
absl::StatusOr<Calibrated> CalibrateUnscaled(
    const Graph& graph, HardwareModel hw, const Profile& profile,
    const std::optional<Schedule>& ran) {
  Calibrated out{graph, std::move(hw), false};
  absl::StatusOr<Graph> timed = ApplyProfile(graph, profile);
  if (!timed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid profile: ", timed.status().message()));
  }
  out.graph = *std::move(timed);
  RETURN_IF_ERROR(FitCollectives(profile, out.hw));
  FitHostLink(profile, out.hw);
  FitInterference(profile, out.hw);
  FitCollectiveScratch(profile, out.hw);
  if (ran.has_value()) {
    absl::Status calibrated = CalibrateMemory(out.graph, *ran, profile, out.hw);
    if (!calibrated.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: ", calibrated.message()));
    }
    out.memory_calibrated = true;
  }
  return out;
}

}  // namespace

absl::StatusOr<Calibrated> CalibrateToMeasurements(const Graph& graph,
                                                   HardwareModel hw,
                                                   const Profile* profile,
                                                   const Schedule* profiled,
                                                   ShardingMode mode) {
  if (profile == nullptr) return Calibrated{graph, std::move(hw), false};
  std::optional<Schedule> ran;
  if (profiled != nullptr) {
    ran = *profiled;
  } else if (profile->schedule_version == 0) {
    ASSIGN_OR_RETURN(ran, StartingSchedule(graph, mode));  // times unused
  }
  ASSIGN_OR_RETURN(Calibrated out, CalibrateUnscaled(graph, hw, *profile, ran));
  if (!ran.has_value() || !(profile->iteration_s > 0)) return out;
  // The schedule the profile ran under, simulated from the profile's
  // medians, against the iteration it measured: the time scale.
  absl::StatusOr<SimResult> sim = Simulate(out.graph, *ran, out.hw);
  if (!sim.ok() || !(sim->iteration_s > 0)) return out;
  const double scale =
      std::clamp(profile->iteration_s / sim->iteration_s,
                 HardwareModel::kMinTimeScale, HardwareModel::kMaxTimeScale);
  if (std::abs(scale - 1) < 1e-9) return out;
  hw.collective_latency_s *= scale;
  ASSIGN_OR_RETURN(out, CalibrateUnscaled(graph, std::move(hw),
                                          ScaledTimes(*profile, scale), ran));
  out.hw.time_scale = scale;
  return out;
}

absl::StatusOr<Calibrated> CalibrateWithEvidence(
    const Graph& graph, const HardwareModel& hw, const Profile* profile,
    const Schedule* profiled, ShardingMode mode,
    const std::vector<std::pair<Schedule, double>>& measured,
    InterferenceRefit* refit) {
  const bool probed =
      profile != nullptr &&
      (profile->compute_s_per_allgather_byte > 0 ||
       profile->compute_s_per_reduce_scatter_byte > 0 ||
       profile->compute_s_per_copy_byte > 0 || profile->allgather_stretch > 1 ||
       profile->reduce_scatter_stretch > 1 || profile->copy_stretch > 1);
  if (!probed || measured.empty()) {
    return CalibrateToMeasurements(graph, hw, profile, profiled, mode);
  }
  // The calibration with the probe's contention, both ways, scaled by k:
  // the per-byte costs times k, each stretch's excess over 1 times k (at
  // most HardwareModel::kMaxStretch).
  auto calibrate = [&](double k) -> absl::StatusOr<Calibrated> {
    Profile scaled = *profile;
    scaled.compute_s_per_allgather_byte *= k;
    scaled.compute_s_per_reduce_scatter_byte *= k;
    scaled.compute_s_per_copy_byte *= k;
    for (double* stretch :
         {&scaled.allgather_stretch, &scaled.reduce_scatter_stretch,
          &scaled.copy_stretch}) {
      if (*stretch > 0) {
        *stretch = std::min(1 + k * (Stretch(*stretch) - 1),
                            HardwareModel::kMaxStretch);
      }
    }
    return CalibrateToMeasurements(graph, hw, &scaled, profiled, mode);
  };
  // How far that calibration simulates the measured schedules from what
  // they measured.
  auto error_at = [&](double k) -> absl::StatusOr<double> {
    ASSIGN_OR_RETURN(Calibrated c, calibrate(k));
    double error = 0;
    for (const auto& [schedule, seconds] : measured) {
      if (!(seconds > 0)) continue;
      absl::StatusOr<SimResult> sim = Simulate(c.graph, schedule, c.hw);
      if (!sim.ok() || !(sim->iteration_s > 0)) continue;
      const double e = std::log(sim->iteration_s / seconds);
      error += e * e;
    }
    return error;
  };
  constexpr double kMaxScale = 4;
  constexpr double kStep = 0.25;
  constexpr double kPull = 1e-8;
  auto objective = [&](double k) -> absl::StatusOr<double> {
    ASSIGN_OR_RETURN(const double e, error_at(k));
    return e + kPull * (k - 1) * (k - 1);
  };
  // A coarse grid, then golden-section search around its best point.
  double best_k = 1;
  double best = std::numeric_limits<double>::infinity();
  for (double k = 0; k <= kMaxScale + 1e-9; k += kStep) {
    ASSIGN_OR_RETURN(const double e, objective(k));
    if (e < best) {
      best = e;
      best_k = k;
    }
  }
  double lo = std::max(0.0, best_k - kStep);
  double hi = std::min(kMaxScale, best_k + kStep);
  constexpr double kGolden = 0.6180339887498949;
  for (int i = 0; i < 20; ++i) {
    const double a = hi - kGolden * (hi - lo);
    const double b = lo + kGolden * (hi - lo);
    ASSIGN_OR_RETURN(const double ea, objective(a));
    ASSIGN_OR_RETURN(const double eb, objective(b));
    if (ea < eb) {
      hi = b;
    } else {
      lo = a;
    }
    for (const auto& [k, e] : {std::pair{a, ea}, std::pair{b, eb}}) {
      if (e < best) {
        best = e;
        best_k = k;
      }
    }
  }
  if (refit != nullptr) {
    refit->scale = best_k;
    ASSIGN_OR_RETURN(refit->error, error_at(best_k));
    ASSIGN_OR_RETURN(refit->probe_error, error_at(1));
  }
  return calibrate(best_k);
}

absl::Status CalibrateNodeMemory(Graph& timed, const Schedule& profiled,
                                 absl::Span<const MemorySample> samples,
                                 const HardwareModel& hw) {
  for (Node& node : timed.nodes) {
    node.measured_extra_bytes = 0;
    node.measured_carry_bytes = 0;
  }
  absl::StatusOr<SimResult> sim = Simulate(timed, profiled, hw);
  if (!sim.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the schedule the profile was measured under (v", profiled.version,
        ") does not replay on the graph: ", sim.status().message()));
  }
  // Each node's own memory as measured, against what the model put on top
  // of the memory at its start and left at its end under the same
  // schedule. Measured against the profiled schedule, so a plan that
  // changes what the model counts (gradients freed earlier, say) changes
  // the prediction by the model's difference.
  const GraphIndex index(timed);
  for (const MemorySample& sample : samples) {
    const int pos = index.NodePos(sample.node_id);
    if (pos < 0 || (sample.rise_bytes == 0 && sample.net_bytes == 0)) continue;
    const NodeTimelineEntry& modeled = sim->nodes[pos];
    timed.nodes[pos].measured_extra_bytes =
        std::max<int64_t>(0, sample.rise_bytes - modeled.modeled_rise_bytes);
    timed.nodes[pos].measured_carry_bytes =
        sample.net_bytes - modeled.modeled_net_bytes;
  }
  return absl::OkStatus();
}

absl::StatusOr<PlanResult> PlanFromMeasurements(const Graph& graph,
                                                HardwareModel hw,
                                                const Profile* profile,
                                                const Schedule* profiled,
                                                const PlanOptions& options) {
  ASSIGN_OR_RETURN(Calibrated calibrated,
                   CalibrateWithEvidence(graph, hw, profile, profiled,
                                         options.mode, options.measured));
  // Planned for the budget less the headroom the memory guard needs; the
  // least-memory plan may use the budget itself (nothing needs less).
  const int64_t budget = calibrated.hw.budget();
  const int64_t headroom =
      MemoryHeadroom(budget, profile, options.extra_headroom_bytes);
  HardwareModel planning = calibrated.hw;
  if (headroom > 0)
    planning.budget_bytes = std::max<int64_t>(1, budget - headroom);
  absl::StatusOr<PlanResult> planned =
      Plan(calibrated.graph, planning, options);
  if (headroom > 0 && !planned.ok() &&
      planned.status().code() == absl::StatusCode::kResourceExhausted) {
    ASSIGN_OR_RETURN(
        PlanResult least,
        LeastMemoryPlan(calibrated.graph, calibrated.hw, options.mode));
    int64_t measured = 0;
    if (profile != nullptr &&
        profile->schedule_version == kLeastMemoryVersion &&
        profile->peak_bytes > 0) {
      // Measured under this very schedule: the measurement, not the model.
      measured = profile->peak_bytes;
      least.sim.peak_bytes = measured;
      least.schedule.prediction.peak_bytes = measured;
      least.feasible = measured <= budget;
    }
    if (!least.feasible) {
      return Infeasible(calibrated.graph, calibrated.hw, options.mode,
                        planned.status().message(), measured);
    }
    least.schedule.provenance.passes.push_back("least-memory");
    planned = std::move(least);
  }
  if (!planned.ok()) return planned.status();
  PlanResult result = *std::move(planned);
  result.hw = calibrated.hw;
  result.schedule.budget_bytes = budget;
  result.feasible = result.sim.peak_bytes <= budget;
  result.headroom_bytes = headroom;
  result.memory_calibrated = calibrated.memory_calibrated;
  if (profiled != nullptr) {
    absl::StatusOr<SimResult> sim =
        Simulate(calibrated.graph, *profiled, calibrated.hw);
    if (sim.ok()) result.profiled_sim = *std::move(sim);
  }
  std::vector<Schedule*> planned_here = {&result.schedule};
  if (result.runner_up.has_value()) {
    result.runner_up->schedule.budget_bytes = budget;
    planned_here.push_back(&result.runner_up->schedule);
  }
  for (Schedule* s : planned_here) {
    if (profile == nullptr) continue;
    s->provenance.window_first_iteration = profile->first_iteration;
    s->provenance.window_last_iteration = profile->last_iteration;
    // The node times were measured at this work: so is the prediction.
    s->prediction.work = profile->work;
  }
  return result;
}

std::optional<PlanAlternative> TrialCandidate(const PlanResult& result,
                                              double margin) {
  if (margin <= 0 || !result.runner_up.has_value() ||
      result.runner_up->sim.iteration_s >
          result.sim.iteration_s * (1 + margin)) {
    return std::nullopt;
  }
  return result.runner_up;
}

absl::StatusOr<int64_t> SmallestFeasibleBudget(const Graph& graph,
                                               const HardwareModel& hw,
                                               ShardingMode mode) {
  RETURN_IF_ERROR(ValidateGraph(graph));
  HardwareModel unlimited = hw;
  unlimited.budget_bytes = 0;
  ASSIGN_OR_RETURN(PlanResult least, LeastMemoryPlan(graph, unlimited, mode));
  return least.sim.peak_bytes;
}

std::string PasteableBudget(int64_t bytes) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  return absl::StrCat((std::max<int64_t>(bytes, 1) + kMiB - 1) / kMiB, "MiB");
}

int64_t GuardHeadroom(int64_t predicted_peak, int64_t min_peak,
                      int64_t max_peak) {
  const int64_t over =
      predicted_peak > 0 ? std::max<int64_t>(0, max_peak - predicted_peak) : 0;
  return over + std::max<int64_t>(0, max_peak - min_peak);
}

int64_t MemoryHeadroom(int64_t budget, const Profile* profile, int64_t extra) {
  if (budget <= 0) return 0;
  int64_t spread = 0;
  if (profile != nullptr && profile->peak_min_bytes > 0) {
    spread =
        std::max<int64_t>(0, profile->peak_bytes - profile->peak_min_bytes);
  }
  const int64_t band = static_cast<int64_t>(
      std::ceil(kMemoryGuardBand * static_cast<double>(budget)));
  return std::min(budget, band + spread + std::max<int64_t>(0, extra));
}

}  // namespace tandem
