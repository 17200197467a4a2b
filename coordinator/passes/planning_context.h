// What every planning pass reads and writes: the graph (node times from the
// aggregated profile where there is one), the hardware model and memory
// budget, and the schedule being built, with its latest simulation.
#ifndef TANDEM_COORDINATOR_PASSES_PLANNING_CONTEXT_H_
#define TANDEM_COORDINATOR_PASSES_PLANNING_CONTEXT_H_

#include <optional>

#include "absl/status/status.h"
#include "common/ir/graph.h"
#include "common/ir/profile.h"
#include "common/ir/schedule.h"
#include "common/sim/hardware_model.h"
#include "common/sim/simulator.h"
#include "coordinator/passes/decision_log.h"

namespace tandem {

// Knobs of Tandem's own passes (the reference policies carry their own).
struct PlannerOptions {
  // prefetch: issue a gather this much earlier than strictly needed, as a
  // fraction of its own transfer time, to absorb jitter.
  double prefetch_slack = 0.1;
  // prefetch: fuse neighbouring gathers when one collective of the sum is at
  // least this much cheaper than the two apart.
  double fusion_gain = 0.02;
  // unshard / offload: fraction of the budget kept free.
  double memory_margin = 0.02;
};

class PlanningContext {
 public:
  // `graph` must outlive the context and be valid (ValidateGraph).
  PlanningContext(const Graph& graph, HardwareModel hw,
                  PlannerOptions options = {});

  const Graph& graph() const { return *graph_; }
  const GraphIndex& index() const { return index_; }
  const HardwareModel& hw() const { return hw_; }
  const PlannerOptions& options() const { return options_; }
  int64_t budget() const { return hw_.budget(); }

  Schedule& schedule() { return schedule_; }
  const Schedule& schedule() const { return schedule_; }

  // Re-simulates the current schedule and caches the result; the pipeline
  // calls it after every pass that changed the plan. Passes that edit the
  // schedule and need fresh numbers call it themselves.
  absl::Status Resimulate();
  // The last simulation; Resimulate() must have succeeded once.
  const SimResult& sim() const { return *sim_; }
  bool has_sim() const { return sim_.has_value(); }

  // Simulated peak when the running pass started: the memory checker lets a
  // pass that starts over budget (before offload has run) leave it there, but
  // never raise it.
  int64_t peak_at_pass_start() const { return peak_at_pass_start_; }
  void set_peak_at_pass_start(int64_t bytes) { peak_at_pass_start_ = bytes; }

  // The explanation being built (decision_log.h); inactive until the planner
  // starts it, and then passes record their decisions.
  DecisionLog& decisions() { return decisions_; }
  const DecisionLog& decisions() const { return decisions_; }
  bool explaining() const { return decisions_.active(); }
  // Simulates `after` and records `decision` as taking the plan there; does
  // nothing (and simulates nothing) when not explaining.
  absl::Status Explain(Decision decision, const Schedule& after);
  // Budget less PlannerOptions::memory_margin of it: the limit the passes
  // plan to, and RestBinding's.
  int64_t memory_target() const;

 private:
  const Graph* graph_;
  GraphIndex index_;
  HardwareModel hw_;
  PlannerOptions options_;
  Schedule schedule_;
  std::optional<SimResult> sim_;
  int64_t peak_at_pass_start_ = 0;
  DecisionLog decisions_;
};

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PASSES_PLANNING_CONTEXT_H_
