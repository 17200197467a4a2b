// From a job spec to the planner's inputs: which pipeline the job runs
// (optimize.policy or optimize.passes, checked against the pass registry at
// submit) and the hardware model, built from what the spec declares and what
// the workers report about their devices. Nothing here assumes a particular
// accelerator: link rates are fitted from the job's profiles
// (CalibrateToMeasurements), memory comes from the devices themselves.
#ifndef TANDEM_COORDINATOR_PLANNER_JOB_PLAN_H_
#define TANDEM_COORDINATOR_PLANNER_JOB_PLAN_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/sim/hardware_model.h"
#include "coordinator/planner/planner.h"
#include "tandem/v1/job.pb.h"

namespace tandem {

// optimize.policy and optimize.passes against the registry, one message per
// problem with its field path (common/job/job_spec.h's PlanSpecCheck).
std::vector<std::string> CheckOptimizeSpec(const v1::OptimizeSpec& optimize,
                                           int32_t zero_stage);

// The pipeline a (validated) spec runs.
PlanOptions PlanOptionsFromSpec(const v1::JobSpec& spec);

// At submit, for a (validated) spec with memory.budget_bytes set:
// InvalidArgument when the budget is below the peak of the least-memory
// schedule by the analytic memory model (SmallestFeasibleBudget on the
// model's graph; the runtime holds more, so no budget that fits is
// refused), naming the smallest budget that fits as a value to paste. An
// archive (model.kind torchscript) gets the graph its workers derive, built
// from its manifest: its params, a node per unit, and what each unit's
// forward saves for backward (measured at export, scaled to the job's
// batch); its workspace is not known, so the peak stays a lower bound, and
// the first profile checks the rest (PlanningManager).
absl::Status CheckBudgetFits(const v1::JobSpec& spec);

// What one rank said about its device when it registered.
struct RankDevice {
  std::string hostname;
  // "cpu" or "cuda:<n>".
  std::string device;
  // A GPU's memory, or on CPU the host's available memory (all ranks on the
  // host share it); 0: not reported.
  int64_t memory_bytes = 0;
};

// Host-link rates assumed until a profile measures the host-tier copies
// (DescribeHardware says which), bytes/s: on CPU the host tier is
// memory-mapped files (a memcpy), on a GPU a PCIe 4.0 x16 link.
inline constexpr double kAssumedCpuHostBytesPerS = 5e9;
inline constexpr double kAssumedGpuHostBytesPerS = 25e9;

// The device memory a job is planned with when none is declared or
// reported: no limit.
inline constexpr int64_t kUnlimitedMemoryBytes =
    std::numeric_limits<int64_t>::max() / 4;

struct JobHardware {
  HardwareModel hw;
  // One line per assumption made (what was neither declared nor reported),
  // for the schedule's event.
  std::vector<std::string> assumptions;
};

// The job's hardware: spec.hardware where declared; else ranks_per_node
// from the hostnames, device memory from the reports (the smallest rank's
// share: a CPU host's memory divided among its ranks), the host link by
// device kind. The budget is memory.budget_bytes, or the device memory when
// 0. With neither declared nor reported memory, the budget is unlimited and
// the assumptions say so.
JobHardware HardwareForJob(const v1::JobSpec& spec,
                           const std::vector<RankDevice>& ranks);

// One line describing a hardware model, e.g. for tandem-plan and events:
// "2 ranks, 2 per node; links: fitted all-gather (5 points), ...".
std::string DescribeHardware(const HardwareModel& hw);

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PLANNER_JOB_PLAN_H_
