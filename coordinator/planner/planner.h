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
#include "absl/types/span.h"
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
// (nodes the profile does not cover keep their estimates). A measured time
// includes what transfers running alongside took from compute; that part
// (the node's overlap bytes times the profile's compute_s_per_*_byte) is
// taken out, since the simulator adds it back for whatever schedule it
// replays (at most 90% of a time is taken out).
//
// Every profile this header's functions take must be valid for their graph
// (ValidateProfile): the caller checks it once, where the profile comes in
// (the coordinator's ProfileAggregator, tandem-plan's --profile, the job
// report's stored window), and the planner does not check it again.
absl::StatusOr<Graph> ApplyProfile(const Graph& graph, const Profile& profile);

// Fits `hw`'s collective models from the profile's measured collectives
// (issue-to-done time against bytes); leaves the analytic model in place for
// a kind with no samples.
absl::Status FitCollectives(const Profile& profile, HardwareModel& hw);

// Sets hw's host link to the profile's measured host-tier copy rate (bytes
// over the copy stream's busy seconds), when copies ran in the window; else
// leaves it.
void FitHostLink(const Profile& profile, HardwareModel& hw);

// Sets hw's compute_s_per_*_byte to the profile's interference probe, where
// it measured one; else leaves them.
void FitInterference(const Profile& profile, HardwareModel& hw);

// Sets hw's collective scratch to the profile's (the worker's communicator's
// rule; none when the profile does not report one).
void FitCollectiveScratch(const Profile& profile, HardwareModel& hw);

// Calibrates the memory model to what the runtime held while it ran
// `profiled`, the schedule the profile was measured under, on `timed`
// (ApplyProfile's graph):
//   - each node's own memory (the profile's rise and net) against what the
//     simulator's model put on top of the memory at the node's start and
//     left at its end under `profiled`: the differences become the node's
//     measured_extra_bytes and measured_carry_bytes (simulator.h's memory
//     rules);
//   - hw.unmodeled_bytes: what is still missing at the peak, the profile's
//     peak less the simulated peak of `profiled` (0 when the model
//     over-counts or the profile has no peak), counted at every instant.
// It also turns on hw.collective_buffers (the worker's flat collective
// buffers). A plan the simulator then fits in the budget fits in the
// runtime's too.
absl::Status CalibrateMemory(Graph& timed, const Schedule& profiled,
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
  // PlanFromMeasurements: bytes of headroom beyond MemoryHeadroom's, e.g.
  // what a job's peaks exceeded an earlier plan's prediction by.
  int64_t extra_headroom_bytes = 0;
  // PlanFromMeasurements: schedules this job ran, each with the iteration
  // time it measured (the slowest rank's median): the evidence
  // RefitInterference fits the compute cost of transfers to.
  std::vector<std::pair<Schedule, double>> measured;
};

// A plan Plan() weighed and did not return: where it came from ("tandem",
// Tandem's own pipeline, or a reference policy's name), the schedule and its
// simulation.
struct PlanAlternative {
  std::string source;
  Schedule schedule;
  SimResult sim;
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
  // PlanFromMeasurements: the budget left free (MemoryHeadroom); the plan
  // was made for budget - headroom_bytes, or is the least-memory plan.
  int64_t headroom_bytes = 0;
  // Tandem's policy only: a reference policy's plan that fit and was
  // predicted faster than Tandem's own, returned instead (its provenance
  // ends with "chosen-over-tandem:<policy>").
  std::optional<Policy> adopted_policy;
  // Tandem's policy only: the fastest plan that fits and differs from the
  // one returned (Tandem's own pipeline's when a reference's was adopted,
  // else the fastest reference's), with the same budget and work. What a
  // job measures as a trial when it is predicted within the model's error
  // of the returned one (TrialCandidate).
  std::optional<PlanAlternative> runner_up;
  // PlanFromMeasurements given the schedule the profile ran under: that
  // schedule simulated under the same calibration (the re-fitted model's
  // price for it), so that a re-plan can tell a machine that changed for
  // every plan from one that changed the choice.
  std::optional<SimResult> profiled_sim;
};

// The runner-up worth measuring on the job: predicted at most `margin`
// (relative, e.g. 0.10) slower than the plan returned, where the cost model
// cannot tell the two apart (coordinator/README.md, "Trials"). Nullopt when
// there is none, or `margin` <= 0.
std::optional<PlanAlternative> TrialCandidate(const PlanResult& result,
                                              double margin);

// Runs the pipeline over `graph` (validated first) with its node times as
// they are. The schedule carries its explanation (common/ir/explanation.h):
// the decisions of every pass, priced by re-simulation from the starting
// schedule, then the planner's own (kPolicy when a reference policy's plan
// is adopted, which adds no gain of its own; kLeastMemory for the
// fallback), so the gains add up to baseline − plan. Tandem's policy (ZeRO-3)
// also plans every reference policy under the same model and returns the
// fastest plan that fits, so it is never predicted behind one. Tandem's policy
// (and a job's own passes) fails with ResourceExhausted when no plan fits the
// budget, naming the smallest feasible budget and what would fit; reference
// policies return their plan with feasible=false instead, as the real
// frameworks would run out of memory.
absl::StatusOr<PlanResult> Plan(const Graph& graph, const HardwareModel& hw,
                                const PlanOptions& options);

// A graph and hardware model fitted to a job's measurements: node times
// from `profile`, collective rates fitted to its collectives, the host link
// to its host-tier copies (FitHostLink), compute's share lost to transfers
// to its interference probe (FitInterference), the collectives' scratch
// (FitCollectiveScratch), and the memory
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

// The budget a plan leaves free (the memory guard, worker/README.md): the
// worker's guard band (kMemoryGuardBand of `budget`), which a step's peak
// must stay under, plus the spread of the measured peaks (profile
// peak_bytes - peak_min_bytes), plus `extra`. The memory model is calibrated
// to the window's largest peak, so a plan whose peaks vary as the window's
// did peaks where predicted at most. The spread is kept free as well
// because another plan's timing lands buffers on other nodes' peaks (a
// collective's, a copy's) than the profiled one did, by about as much as the
// window's own peaks moved. What a plan's timing adds beyond that, the
// memory guard measures and `extra` keeps (GuardHeadroom). 0 when `budget`
// is 0.
int64_t MemoryHeadroom(int64_t budget, const Profile* profile, int64_t extra);

// The extra headroom (MemoryHeadroom's `extra`) a plan keeps after a plan
// tripped the worker's memory guard: what the tripped plan's largest step
// peak exceeded its predicted peak by, plus the spread of its step peaks
// (largest - smallest). The overshoot is what that plan's timing added
// above the model in the steps it ran; the spread is room for the steps it
// did not run: peaks that vary with timing (the collectives' and copies'
// buffers land at other points of the iteration from step to step) reach a
// window's largest only now and then, and a longer run goes higher by about
// as much again. `predicted_peak` 0 (unknown): the spread alone.
int64_t GuardHeadroom(int64_t predicted_peak, int64_t min_peak,
                      int64_t max_peak);

// Re-fits the contention between transfers and compute to what schedules
// measured: scales the profile's interference figures both ways, what
// transfers take from compute (compute_s_per_*_byte, times k) and how much
// compute stretches transfers (each *_stretch's excess over 1, times k), by
// the k in [0, 4] whose calibration (CalibrateToMeasurements with the scaled
// figures) simulates `measured` closest to their measured times (least
// squares of log(simulated / measured), pulled gently toward k = 1, the
// probe itself, so that evidence that cannot tell, such as schedules with
// little overlap, leaves the probe's figures). Returns k and the
// calibration made with it; k = 1 and a plain calibration when the profile
// has no probe figures or nothing was measured.
struct InterferenceRefit {
  double scale = 1;
  // Sum of squared log errors over `measured` at `scale`, and at 1.
  double error = 0;
  double probe_error = 0;
};
absl::StatusOr<Calibrated> CalibrateWithEvidence(
    const Graph& graph, const HardwareModel& hw, const Profile* profile,
    const Schedule* profiled, ShardingMode mode,
    const std::vector<std::pair<Schedule, double>>& measured,
    InterferenceRefit* refit = nullptr);

// The one path from a job's measurements to a plan:
// CalibrateWithEvidence (CalibrateToMeasurements, its interference figures
// re-fitted to options.measured), then Plan against the budget less
// MemoryHeadroom; when nothing fits that, the least-memory plan if it fits the
// budget itself, else ResourceExhausted naming the smallest budget that fits.
// `profile` may be null (plan on the graph's estimates). `hw` holds what is
// declared (links, device memory, budget); the profile refines it. Errors name
// the input at fault ("invalid profile: ...").
absl::StatusOr<PlanResult> PlanFromMeasurements(const Graph& graph,
                                                HardwareModel hw,
                                                const Profile* profile,
                                                const Schedule* profiled,
                                                const PlanOptions& options);

// Calibrates the memory model on nodes' own memory (MemorySample rise and
// net, as the worker measures them) under the schedule they ran: each
// node's measured_extra_bytes is what it rose beyond what the model puts on
// top at its start, its measured_carry_bytes what it left beyond the
// model's (the first profile's calibration, which also fits what the
// runtime holds beyond both from the measured peak; the coordinator's check
// of an archive at submit uses the exporter's measurements).
absl::Status CalibrateNodeMemory(Graph& timed, const Schedule& profiled,
                                 absl::Span<const MemorySample> samples,
                                 const HardwareModel& hw);

// The smallest budget any plan fits: the peak of the least-memory schedule
// (common/lowering/least_memory.h) under `hw`'s memory model.
absl::StatusOr<int64_t> SmallestFeasibleBudget(
    const Graph& graph, const HardwareModel& hw,
    ShardingMode mode = ShardingMode::kZero3);

// memory.budget_bytes as a user writes it: `bytes` rounded up to a MiB,
// e.g. "21MiB".
std::string PasteableBudget(int64_t bytes);

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PLANNER_PLANNER_H_
