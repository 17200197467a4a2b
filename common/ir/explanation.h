// Why a schedule is what it is (common/README.md, "Explanation"): the
// planner's decisions in the order it applied them, each with the pass that
// made it, what it gained and what it costs, and what stopped it going
// further. Stored with the schedule (Schedule::explanation), so it survives
// a coordinator restart; `tandem-plan --explain` and
// `tandem schedule JOB --explain` print it (FormatExplanation).
//
// Gains are measured, not estimated: the planner simulates the plan after
// each decision, and a decision's gain is the simulated iteration time
// before it less the time after it (likewise exposed communication and the
// peak). The states chain, from the baseline (the starting schedule the job
// runs before any plan) to the plan, so the gains add up to
// baseline_iteration_s − Prediction::iteration_s (and the exposed gains to
// baseline_exposed_comm_s − Prediction::exposed_comm_s) up to rounding. A
// decision's gain depends on the ones before it (attribution by successive
// re-simulation); intermediate states are what the planner simulated, not
// plans it would publish.
#ifndef TANDEM_COMMON_IR_EXPLANATION_H_
#define TANDEM_COMMON_IR_EXPLANATION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tandem {

enum class DecisionKind {
  // A gather issued at another node (earlier, to hide its transfer).
  kPrefetch,
  // Neighbouring gather groups fused into one collective.
  kFuse,
  // A group kept gathered from its first gather to its last release.
  kKeep,
  // A group's params made persistent (never released).
  kPersist,
  // Optimizer states moved to the host tier during forward.
  kOffload,
  // Offloaded optimizer states kept on the device again.
  kReturn,
  // ZeRO-1: gradients reduce-scattered in buckets during backward.
  kZero1Buckets,
  // A pass's changes taken as a whole (passes that do not itemize their
  // decisions, such as the reference policies'), or what a pass changed
  // beyond the decisions it listed.
  kPass,
  // A reference policy's plan chosen over Tandem's own (predicted faster).
  kPolicy,
  // The least-memory plan (every optimizer state offloaded), when no pass
  // pipeline fit the budget.
  kLeastMemory,
};
// "prefetch", "fuse", "keep", "persist", "offload", "return",
// "zero1-buckets", "pass", "policy", "least-memory".
absl::string_view DecisionKindName(DecisionKind kind);
std::optional<DecisionKind> ParseDecisionKind(absl::string_view name);

enum class BindingKind {
  // Nothing: the decision did all it set out to (e.g. the transfer is
  // hidden).
  kNone,
  // Device memory: the simulated peak at `node_id` (`bytes`) against the
  // limit the pass plans to (`limit_bytes`: the budget, less its margin).
  kMemory,
  // The communication link: collectives queue on it, so the transfer
  // cannot finish earlier (exposed communication remains).
  kLink,
  // The host link: optimizer-state copies to and from the host tier.
  kHostLink,
};
// "none", "memory", "link", "host-link".
absl::string_view BindingKindName(BindingKind kind);
std::optional<BindingKind> ParseBindingKind(absl::string_view name);

// What keeps a decision from going further.
struct Binding {
  BindingKind kind = BindingKind::kNone;
  // kMemory: the node where the peak is reached, the peak and the limit.
  std::optional<int32_t> node_id;
  int64_t bytes = 0;
  int64_t limit_bytes = 0;
  bool operator==(const Binding& other) const;
};

struct Decision {
  DecisionKind kind = DecisionKind::kPass;
  // The pass that made it (a pass-registry name, or "planner" for the
  // planner's own choices: kPolicy, kLeastMemory).
  std::string pass;
  // What was decided, for people: names the groups, params, entries and
  // nodes (e.g. "g3 (layers.0.attn, 2 params, 32MiB) gathered before n5
  // layers.0.attn instead of n7 layers.0.mlp").
  std::string what;
  // What it is about, for programs.
  std::vector<int32_t> group_ids;
  std::vector<int32_t> param_ids;
  std::vector<int32_t> offload_ids;
  // Where it acts (kPrefetch: the node the gather now comes before).
  std::optional<int32_t> node_id;
  // Simulated iteration time before it less after it (positive: faster).
  double gain_s = 0;
  // Simulated exposed communication before it less after it.
  double exposed_gain_s = 0;
  // Bytes it holds on the device (kPrefetch, kKeep, kPersist: the group's
  // full bytes, held longer or always) or moves over the host link
  // (kOffload, kReturn: optimizer-state bytes per rank); 0 when none.
  int64_t held_bytes = 0;
  // Simulated peak after it less before it (positive: more memory).
  int64_t peak_delta_bytes = 0;
  Binding binding;
  bool operator==(const Decision& other) const;
};

struct Explanation {
  // The starting schedule's simulated iteration time and exposed
  // communication, on the same graph and hardware model as the plan.
  double baseline_iteration_s = 0;
  double baseline_exposed_comm_s = 0;
  int64_t baseline_peak_bytes = 0;
  // In the order applied.
  std::vector<Decision> decisions;

  bool empty() const { return decisions.empty(); }
  // Σ gain_s and Σ exposed_gain_s.
  double TotalGain() const;
  double TotalExposedGain() const;
  bool operator==(const Explanation& other) const;
};

// A readable table: one line per decision (kind, pass, gain, exposed gain,
// bytes held, peak change, binding constraint, what), with the baseline,
// the plan's prediction (`plan_iteration_s`, `plan_exposed_comm_s`), the
// totals and how far they are from the predicted difference.
std::string FormatExplanation(const Explanation& explanation,
                              double plan_iteration_s,
                              double plan_exposed_comm_s);

}  // namespace tandem

#endif  // TANDEM_COMMON_IR_EXPLANATION_H_
