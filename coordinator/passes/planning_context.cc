#include "coordinator/passes/planning_context.h"

#include <utility>

namespace tandem {

PlanningContext::PlanningContext(const Graph& graph, HardwareModel hw,
                                 PlannerOptions options)
    : graph_(&graph), index_(graph), hw_(std::move(hw)), options_(options) {
  schedule_.graph_hash = graph.StructuralHash();
  schedule_.budget_bytes = hw_.budget();
}

absl::Status PlanningContext::Resimulate() {
  absl::StatusOr<SimResult> result = Simulate(*graph_, schedule_, hw_);
  if (!result.ok()) return result.status();
  sim_ = *std::move(result);
  schedule_.prediction.iteration_s = sim_->iteration_s;
  schedule_.prediction.compute_s = sim_->compute_s;
  schedule_.prediction.comm_s = sim_->comm_s;
  schedule_.prediction.exposed_comm_s = sim_->exposed_comm_s;
  schedule_.prediction.copy_s = sim_->copy_s;
  schedule_.prediction.peak_bytes = sim_->peak_bytes;
  return absl::OkStatus();
}

absl::Status PlanningContext::Explain(Decision decision,
                                      const Schedule& after) {
  if (!explaining()) return absl::OkStatus();
  absl::StatusOr<SimResult> sim = Simulate(*graph_, after, hw_);
  if (!sim.ok()) return sim.status();
  decisions_.Record(std::move(decision), *sim);
  return absl::OkStatus();
}

int64_t PlanningContext::memory_target() const {
  return budget() - static_cast<int64_t>(options_.memory_margin *
                                         static_cast<double>(budget()));
}

}  // namespace tandem
