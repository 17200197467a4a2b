// The planner's entry point, shared by the coordinator, `tandem-plan` and
// `bench/plan_bench`: PlanFromMeasurements turns (graph, profile, the
// schedule the profile was measured under, hardware, budget) into a plan:
// node times from the profile, collective rates fitted, the memory model
// calibrated to the runtime, the pipeline (a policy's, or passes a job
// names, both from the pass registry), and the least-memory fallback.
//
// Policies (each a schedule built from the same IR):
//   on-demand        zero3-insert alone.
//   deepspeed-zero3  DeepSpeed ZeRO-3's fixed knobs: prefetch bucket 5e7
//                    elements, at most 1e9 live params, params under 1e5
//                    elements persistent.
//   fsdp             FSDP: one unit per block, backward prefetch one unit
//                    ahead, no forward prefetch, at most two units gathered.
//   deepcompile      DeepCompile's published greedy passes: prefetch as early
//                    as memory allows (10% margin, 1e9/4e9-byte caps, 1.2
//                    fusion factor), unshard by gather time per byte stopping
//                    at the first misfit, offload by memory alone.
//   tandem           Tandem's own pipeline (coordinator/passes/README.md;
//                    zero1 and offload for ZeRO-1 jobs).
#ifndef TANDEM_COORDINATOR_PLANNER_PLANNER_H_
#define TANDEM_COORDINATOR_PLANNER_PLANNER_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/ir/graph.h"
#include "common/ir/profile.h"
#include "common/ir/schedule.h"
#include "common/lowering/lowering.h"
#include "common/sim/hardware_model.h"
#include "common/sim/simulator.h"
#include "coordinator/passes/pass_pipeline.h"
#include "coordinator/passes/planning_context.h"

namespace tandem {

enum class Policy { kOnDemand, kDeepSpeedZero3, kFsdp, kDeepCompile, kTandem };
absl::string_view PolicyName(Policy policy);
std::optional<Policy> ParsePolicy(absl::string_view name);
// In the order above.
std::vector<Policy> AllPolicies();

// A copy of `graph` with node times replaced by the profile's measurements
// (nodes the profile does not cover keep their estimates). Fails when the
// profile is for another graph or malformed (ValidateProfile).
absl::StatusOr<Graph> ApplyProfile(const Graph& graph, const Profile& profile);

// Fits `hw`'s collective models from the profile's measured collectives
// (issue-to-done time against bytes); leaves the analytic model in place for
// a kind with no samples.
absl::Status FitCollectives(const Profile& profile, HardwareModel& hw);

// Sets hw's host link to the profile's measured host-tier copy rate (bytes
// over the copy stream's busy seconds), when copies ran in the window; else
// leaves it.
void FitHostLink(const Profile& profile, HardwareModel& hw);

// Sets hw.unmodeled_bytes to what the runtime held beyond the simulator's
// memory model while it ran `profiled`, the schedule the profile was measured
// under: the profile's peak less the simulated peak of `profiled` on `timed`
// (ApplyProfile's graph), or 0 when the model over-counts or the profile has
// no peak. It also turns on hw.collective_buffers (the worker's flat
// collective buffers), measuring the gap with them counted. Every plan made
// with `hw` then counts those bytes at every instant, so a plan the simulator
// fits in the budget fits in the runtime's too.
absl::Status CalibrateMemory(const Graph& timed, const Schedule& profiled,
                             const Profile& profile, HardwareModel& hw);

// The policy's pipeline for `mode`, as pass-registry specs
// (coordinator/planner/pass_registry.h).
std::vector<std::string> PolicyPasses(Policy policy, ShardingMode mode);

struct PlanOptions {
  Policy policy = Policy::kTandem;
  // When not empty, this pipeline (pass-registry specs, e.g. from a job's
  // optimize.passes) instead of the policy's; it is planned like Tandem's
  // (least-memory fallback, ResourceExhausted when nothing fits).
  std::vector<std::string> passes;
  ShardingMode mode = ShardingMode::kZero3;
  PlannerOptions planner;
  // Receives one record per pass; may be null.
  PassRecordSink* sink = nullptr;
};

struct PlanResult {
  Schedule schedule;
  SimResult sim;
  // Wall time of the whole pipeline.
  double plan_wall_s = 0;
  // peak <= budget.
  bool feasible = false;
  // The hardware model the plan was made with (fits and calibration
  // included), for predictions and for printing what was assumed.
  HardwareModel hw;
  // The memory model counted what the runtime held beyond it (a profile and
  // the schedule it ran under were given).
  bool memory_calibrated = false;
  // Tandem's policy only: a reference policy's plan that fit and was
  // predicted faster than Tandem's own, returned instead (its provenance
  // ends with "chosen-over-tandem:<policy>").
  std::optional<Policy> adopted_policy;
};

// Runs the pipeline over `graph` (validated first) with its node times as
// they are. Tandem's policy (ZeRO-3) also plans every reference policy under
// the same model and returns the fastest plan that fits, so it is never
// predicted behind one. Tandem's policy (and a job's own passes) fails with
// ResourceExhausted when no plan fits the budget, naming the smallest
// feasible budget and what would fit; reference policies return their plan
// with feasible=false instead, as the real frameworks would run out of
// memory.
absl::StatusOr<PlanResult> Plan(const Graph& graph, const HardwareModel& hw,
                                const PlanOptions& options);

// A graph and hardware model fitted to a job's measurements: node times
// from `profile`, collective rates fitted to its collectives, the host link
// to its host-tier copies (FitHostLink), and the memory
// model calibrated to the runtime (CalibrateMemory) against `profiled`, the
// schedule the profile was measured under; when `profiled` is null, the
// starting schedule of `mode` for a profile of version 0, else the memory
// stays uncalibrated. With no profile, the inputs as they are.
struct Calibrated {
  Graph graph;
  HardwareModel hw;
  bool memory_calibrated = false;
};
absl::StatusOr<Calibrated> CalibrateToMeasurements(const Graph& graph,
                                                   HardwareModel hw,
                                                   const Profile* profile,
                                                   const Schedule* profiled,
                                                   ShardingMode mode);

// The one path from a job's measurements to a plan:
// CalibrateToMeasurements, then Plan. `profile` may be null
// (plan on the graph's estimates). `hw` holds what is declared (links,
// device memory, budget); the profile refines it. Errors name the input at
// fault ("invalid profile: ...").
absl::StatusOr<PlanResult> PlanFromMeasurements(const Graph& graph,
                                                HardwareModel hw,
                                                const Profile* profile,
                                                const Schedule* profiled,
                                                const PlanOptions& options);

// The smallest budget any plan fits: the on-demand baseline with every
// optimizer state offloaded.
absl::StatusOr<int64_t> SmallestFeasibleBudget(const Graph& graph,
                                               const HardwareModel& hw);

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PLANNER_PLANNER_H_
