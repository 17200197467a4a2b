#include "coordinator/planner/planner.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/bytes.h"
#include "common/ir/validate.h"
#include "common/lowering/anchored_schedule.h"
#include "common/status_macros.h"
#include "coordinator/passes/invariant_checkers.h"
#include "coordinator/passes/zero1_pass.h"
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
  return context;
}

// The least-memory plan: the baseline of `mode` with every optimizer state
// offloaded before the first node and reloaded after the last backward node.
absl::StatusOr<PlanResult> LeastMemoryPlan(const Graph& graph,
                                           const HardwareModel& hw,
                                           ShardingMode mode) {
  PlanningContext context(graph, hw);
  context.schedule().mode = mode;
  if (mode == ShardingMode::kZero1) {
    Zero1Pass zero1;
    RETURN_IF_ERROR(zero1.Run(context).status());
  } else {
    Zero3InsertPass baseline;
    RETURN_IF_ERROR(baseline.Run(context).status());
  }
  Schedule& schedule = context.schedule();
  schedule.provenance.passes = {
      mode == ShardingMode::kZero1 ? "zero1" : "zero3-insert",
      "offload-all-states"};
  int last_backward = -1;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (graph.nodes[i].phase == Phase::kBackward) {
      last_backward = static_cast<int>(i);
    }
  }
  if (!graph.nodes.empty()) {
    // Out before the first node, back after the last backward node (after
    // the last node without a backward).
    const int reload_at = last_backward >= 0
                              ? last_backward
                              : static_cast<int>(graph.nodes.size()) - 1;
    std::vector<StateCopy> copies;
    for (const Param& param : graph.params) {
      const int64_t bytes = ParamStateBytes(param, graph.world_size);
      if (bytes <= 0) continue;
      copies.push_back({{param.id},
                        bytes,
                        AnchoredSchedule::BeforeSlot(0),
                        AnchoredSchedule::AfterSlot(reload_at)});
    }
    SpliceStateOffloads(graph, context.index(), copies, schedule);
  }
  RETURN_IF_ERROR(context.Resimulate());
  PlanResult result;
  result.schedule = schedule;
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

absl::Status Infeasible(const Graph& graph, const HardwareModel& hw,
                        ShardingMode mode, absl::string_view why) {
  absl::StatusOr<PlanResult> least = LeastMemoryPlan(graph, hw, mode);
  if (!least.ok()) return least.status();
  return absl::ResourceExhaustedError(absl::StrCat(
      "no plan fits the budget of ", FormatBytes(hw.budget()),
      " per rank: the smallest feasible budget is ",
      FormatBytes(least->sim.peak_bytes),
      mode == ShardingMode::kZero1
          ? " (the ZeRO-1 plan with every optimizer state offloaded). "
          : " (the on-demand baseline with every optimizer state offloaded). ",
      "To fit: ", WhatWouldFit(graph, least->sim, mode), ". (", why, ")"));
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
  RETURN_IF_ERROR(ValidateProfile(profile, graph));
  Graph out = graph;
  const GraphIndex index(out);
  for (const NodeTiming& timing : profile.nodes) {
    const int pos = index.NodePos(timing.node_id);
    if (pos >= 0) out.nodes[pos].time_s = timing.time_s;
  }
  return out;
}

absl::Status FitCollectives(const Profile& profile, HardwareModel& hw) {
  std::vector<std::pair<int64_t, double>> allgather;
  std::vector<std::pair<int64_t, double>> reduce_scatter;
  for (const CollectiveTiming& c : profile.collectives) {
    if (c.kind == CollectiveKind::kAllGather) {
      allgather.emplace_back(c.bytes,
                             c.run_s > 0 ? c.run_s : c.issue_to_done_s);
    } else if (c.kind == CollectiveKind::kReduceScatter) {
      reduce_scatter.emplace_back(c.bytes,
                                  c.run_s > 0 ? c.run_s : c.issue_to_done_s);
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

absl::Status CalibrateMemory(const Graph& timed, const Schedule& profiled,
                             const Profile& profile, HardwareModel& hw) {
  hw.unmodeled_bytes = 0;
  if (profile.peak_bytes <= 0) return absl::OkStatus();
  // The profile comes from the Tandem worker, which packs collectives.
  hw.collective_buffers = true;
  absl::StatusOr<SimResult> sim = Simulate(timed, profiled, hw);
  if (!sim.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the schedule the profile was measured under (v", profiled.version,
        ") does not replay on the graph: ", sim.status().message()));
  }
  hw.unmodeled_bytes =
      std::max<int64_t>(0, profile.peak_bytes - sim->peak_bytes);
  return absl::OkStatus();
}

std::vector<std::string> PolicyPasses(Policy policy, ShardingMode mode) {
  switch (policy) {
    case Policy::kOnDemand:
      return {"zero3-insert"};
    case Policy::kDeepSpeedZero3:
      return {"deepspeed-persistence", "zero3-insert", "split-groups",
              "deepspeed-prefetch"};
    case Policy::kFsdp:
      return {"zero3-insert:grouping=unit", "fsdp-prefetch"};
    case Policy::kDeepCompile:
      // DeepCompile runs on ZeRO-3 (small params persistent), gathers param
      // by param, and schedules offloading before profiling the passes that
      // follow.
      return {"deepspeed-persistence", "zero3-insert",    "split-groups",
              "memory-only-offload",   "greedy-prefetch", "greedy-unshard"};
    case Policy::kTandem:
      // coordinator/passes/README.md.
      if (mode == ShardingMode::kZero1) return {"zero1", "offload"};
      return {"zero3-insert", "offload",        "prefetch", "offload-lend",
              "unshard",      "offload-return", "prefetch"};
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
    } else if (!status.ok()) {
      return status;
    } else {
      result.schedule = context->schedule();
      result.sim = context->sim();
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
  }
  records.ForwardTo(options.sink);
  result.feasible = result.sim.peak_bytes <= hw.budget();
  if (options.policy == Policy::kTandem && options.passes.empty() &&
      options.mode == ShardingMode::kZero3) {
    // Never behind, predicted: under the same calibrated model, the
    // reference policies' plans too; the fastest that fits wins.
    for (Policy reference : kAllPolicies) {
      if (reference == Policy::kTandem) continue;
      PlanOptions other;
      other.policy = reference;
      other.planner = options.planner;
      absl::StatusOr<PlanResult> theirs = Plan(graph, hw, other);
      if (!theirs.ok() || !theirs->feasible) continue;
      if (theirs->sim.iteration_s < result.sim.iteration_s * (1 - 1e-9)) {
        result.schedule = theirs->schedule;
        result.sim = theirs->sim;
        result.adopted_policy = reference;
      }
    }
    if (result.adopted_policy.has_value()) {
      result.schedule.provenance.passes.push_back(absl::StrCat(
          "chosen-over-tandem:", PolicyName(*result.adopted_policy)));
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

absl::StatusOr<Calibrated> CalibrateToMeasurements(const Graph& graph,
                                                   HardwareModel hw,
                                                   const Profile* profile,
                                                   const Schedule* profiled,
                                                   ShardingMode mode) {
  Calibrated out{graph, std::move(hw), false};
  if (profile == nullptr) return out;
  absl::StatusOr<Graph> timed = ApplyProfile(graph, *profile);
  if (!timed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid profile: ", timed.status().message()));
  }
  out.graph = *std::move(timed);
  RETURN_IF_ERROR(FitCollectives(*profile, out.hw));
  FitHostLink(*profile, out.hw);
  std::optional<Schedule> ran;
  if (profiled != nullptr) {
    ran = *profiled;
  } else if (profile->schedule_version == 0) {
    ASSIGN_OR_RETURN(ran, StartingSchedule(out.graph, mode));
  }
  if (ran.has_value()) {
    absl::Status calibrated =
        CalibrateMemory(out.graph, *ran, *profile, out.hw);
    if (!calibrated.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: ", calibrated.message()));
    }
    out.memory_calibrated = true;
  }
  return out;
}

absl::StatusOr<PlanResult> PlanFromMeasurements(const Graph& graph,
                                                HardwareModel hw,
                                                const Profile* profile,
                                                const Schedule* profiled,
                                                const PlanOptions& options) {
  ASSIGN_OR_RETURN(Calibrated calibrated,
                   CalibrateToMeasurements(graph, std::move(hw), profile,
                                           profiled, options.mode));
  ASSIGN_OR_RETURN(PlanResult result,
                   Plan(calibrated.graph, calibrated.hw, options));
  result.memory_calibrated = calibrated.memory_calibrated;
  if (profile != nullptr) {
    result.schedule.provenance.window_first_iteration =
        profile->first_iteration;
    result.schedule.provenance.window_last_iteration = profile->last_iteration;
  }
  return result;
}

absl::StatusOr<int64_t> SmallestFeasibleBudget(const Graph& graph,
                                               const HardwareModel& hw) {
  RETURN_IF_ERROR(ValidateGraph(graph));
  HardwareModel unlimited = hw;
  unlimited.budget_bytes = 0;
  ASSIGN_OR_RETURN(PlanResult least,
                   LeastMemoryPlan(graph, unlimited, ShardingMode::kZero3));
  return least.sim.peak_bytes;
}

}  // namespace tandem
