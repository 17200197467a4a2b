#include "coordinator/passes/decision_log.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/bytes.h"
#include "coordinator/analysis/group_sizes.h"

namespace tandem {
namespace {

// Differences below this (seconds) are rounding, not a change of plan: two
// listings of one plan can time apart by a few ulps.
constexpr double kRounding = 1e-12;

// Names listed in a label before "+N params".
constexpr size_t kNamesShown = 2;

}  // namespace

void DecisionLog::Start(const SimResult& baseline) {
  active_ = true;
  explanation_ = Explanation();
  explanation_.baseline_iteration_s = baseline.iteration_s;
  explanation_.baseline_exposed_comm_s = baseline.exposed_comm_s;
  explanation_.baseline_peak_bytes = baseline.peak_bytes;
  iteration_s_ = baseline.iteration_s;
  exposed_s_ = baseline.exposed_comm_s;
  peak_bytes_ = baseline.peak_bytes;
}

void DecisionLog::Record(Decision decision, const SimResult& after) {
  if (!active_) return;
  decision.pass = pass_;
  decision.gain_s = iteration_s_ - after.iteration_s;
  decision.exposed_gain_s = exposed_s_ - after.exposed_comm_s;
  decision.peak_delta_bytes = after.peak_bytes - peak_bytes_;
  iteration_s_ = after.iteration_s;
  exposed_s_ = after.exposed_comm_s;
  peak_bytes_ = after.peak_bytes;
  explanation_.decisions.push_back(std::move(decision));
}

void DecisionLog::RecordRest(absl::string_view pass, bool changed,
                             bool recorded, const SimResult& now,
                             const Binding& binding) {
  if (!active_) return;
  const bool moved = std::abs(now.iteration_s - iteration_s_) > kRounding ||
                     std::abs(now.exposed_comm_s - exposed_s_) > kRounding ||
                     now.peak_bytes != peak_bytes_;
  if (!moved && (recorded || !changed)) {
    // Rounding only: follow it so the chain stays exact.
    iteration_s_ = now.iteration_s;
    exposed_s_ = now.exposed_comm_s;
    return;
  }
  Decision rest;
  rest.kind = DecisionKind::kPass;
  rest.what = recorded ? absl::StrCat("the rest of what ", pass,
                                      " changed, beyond the decisions above")
                       : absl::StrCat("the plan as ", pass, " left it");
  rest.binding = binding;
  const std::string saved = pass_;
  pass_ = std::string(pass);
  Record(std::move(rest), now);
  pass_ = saved;
}

void DecisionLog::RecordPlanner(Decision decision, const SimResult& after) {
  const std::string saved = pass_;
  pass_ = "planner";
  Record(std::move(decision), after);
  pass_ = saved;
}

Binding MemoryBinding(const SimResult& sim, int64_t limit) {
  Binding b;
  b.kind = BindingKind::kMemory;
  b.node_id = sim.peak_node_id;
  b.bytes = sim.peak_bytes;
  b.limit_bytes = limit;
  return b;
}

Binding RestBinding(const SimResult& sim, int64_t limit) {
  if (sim.peak_bytes >= limit) return MemoryBinding(sim, limit);
  Binding b;
  if (sim.exposed_comm_s > kRounding) b.kind = BindingKind::kLink;
  return b;
}

std::string NodeLabel(const Graph& graph, const GraphIndex& index,
                      int32_t node_id) {
  const int pos = index.NodePos(node_id);
  if (pos < 0) return absl::StrCat("n", node_id);
  return absl::StrCat("n", node_id, " ", graph.nodes[pos].name);
}

std::string ParamsLabel(const Graph& graph, const GraphIndex& index,
                        const std::vector<int32_t>& param_ids) {
  std::string names;
  for (size_t i = 0; i < param_ids.size() && i < kNamesShown; ++i) {
    const int pos = index.ParamPos(param_ids[i]);
    absl::StrAppend(
        &names, i > 0 ? ", " : "",
        pos >= 0 ? graph.params[pos].name : absl::StrCat("p", param_ids[i]));
  }
  if (param_ids.size() > kNamesShown) {
    absl::StrAppend(&names, " +", param_ids.size() - kNamesShown, " params");
  }
  return names;
}

std::string GroupLabel(const Graph& graph, const GraphIndex& index,
                       const GatherGroup& group) {
  return absl::StrCat("g", group.id, " (",
                      ParamsLabel(graph, index, group.param_ids), ", ",
                      FormatBytesShort(GroupBytes(graph, index, group)), ")");
}

}  // namespace tandem
