// The explanation being built while a pipeline runs (common/ir/explanation.h):
// passes record each decision with the simulation of the plan right after
// it, and the log prices it against the state the previous decision left:
// gain = iteration time before − after (likewise exposed communication and
// the peak). Starting from the baseline's simulation, the recorded states
// chain to the final plan, so the gains add up to baseline − plan.
//
// The pipeline calls set_pass() before each pass and RecordRest() after it:
// what a pass changed beyond the decisions it recorded (all of it, for
// passes that record none, such as the reference policies') becomes one
// kPass decision, so the chain never breaks. Before Start() the log is
// inactive and passes skip the extra simulations (PlanningContext::Explain).
#ifndef TANDEM_COORDINATOR_PASSES_DECISION_LOG_H_
#define TANDEM_COORDINATOR_PASSES_DECISION_LOG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/ir/explanation.h"
#include "common/ir/graph.h"
#include "common/ir/schedule.h"
#include "common/sim/simulator.h"

namespace tandem {

class DecisionLog {
 public:
  // Starts a new explanation from the baseline's simulation.
  void Start(const SimResult& baseline);
  bool active() const { return active_; }

  // The pass whose decisions follow.
  void set_pass(absl::string_view pass) { pass_ = std::string(pass); }

  // Records `decision` (kind, what, ids, held bytes and binding filled by the
  // caller) as taking the plan from the last recorded state to the one
  // simulated as `after`: sets its pass, gain_s, exposed_gain_s and
  // peak_delta_bytes. No-op when inactive.
  void Record(Decision decision, const SimResult& after);

  // After `pass` ran, the plan simulates as `now`: records the difference
  // from the last recorded state as a kPass decision when there is one, or
  // when the pass changed the plan and recorded nothing. `binding` is what
  // the caller judges binds the plan now (RestBinding).
  void RecordRest(absl::string_view pass, bool changed, bool recorded,
                  const SimResult& now, const Binding& binding);

  // Records a decision of the planner itself (pass "planner") that replaced
  // the plan with one simulated as `after`.
  void RecordPlanner(Decision decision, const SimResult& after);

  size_t size() const { return explanation_.decisions.size(); }
  const Explanation& explanation() const { return explanation_; }

 private:
  bool active_ = false;
  std::string pass_;
  Explanation explanation_;
  double iteration_s_ = 0;
  double exposed_s_ = 0;
  int64_t peak_bytes_ = 0;
};

// Memory binds: the simulated peak of `sim`, where it is reached, against
// `limit`.
Binding MemoryBinding(const SimResult& sim, int64_t limit);
// What binds a plan as a whole: memory when its peak is at or above
// `limit` (the budget less the planner's margin), else the link when
// communication is still exposed, else nothing.
Binding RestBinding(const SimResult& sim, int64_t limit);

// Labels for Decision::what: "n5 layers.0.attn", "g3 (layers.0.attn.wq +1
// param, 32MiB)", "p3,p4 (layers.0.attn.wq, layers.0.attn.wk)".
std::string NodeLabel(const Graph& graph, const GraphIndex& index,
                      int32_t node_id);
std::string GroupLabel(const Graph& graph, const GraphIndex& index,
                       const GatherGroup& group);
std::string ParamsLabel(const Graph& graph, const GraphIndex& index,
                        const std::vector<int32_t>& param_ids);

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_PASSES_DECISION_LOG_H_
