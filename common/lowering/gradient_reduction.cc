#include "common/lowering/gradient_reduction.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "common/lowering/anchored_schedule.h"

namespace tandem {

absl::string_view GradientReductionName(GradientReduction reduction) {
  switch (reduction) {
    case GradientReduction::kNone:
      return "none";
    case GradientReduction::kOnce:
      return "once";
    case GradientReduction::kPerMicroBatch:
      return "micro-batch";
  }
  return "?";
}

std::vector<std::vector<GradientProduction>> GradientProductions(
    const Graph& graph) {
  const GraphIndex index(graph);
  std::vector<std::vector<GradientProduction>> out(graph.params.size());
  for (size_t pos = 0; pos < graph.nodes.size(); ++pos) {
    const Node& node = graph.nodes[pos];
    if (node.phase != Phase::kBackward) continue;
    const int at = static_cast<int>(pos);
    for (int32_t id : node.param_ids) {
      const int p = index.ParamPos(id);
      // A frozen param's backward use produces no gradient of it.
      if (p < 0 || !graph.params[p].trainable) continue;
      std::vector<GradientProduction>& runs = out[p];
      if (!runs.empty() && runs.back().micro_batch == node.micro_batch) {
        runs.back().last_pos = at;
      } else {
        runs.push_back({node.micro_batch, at, at});
      }
    }
  }
  return out;
}

std::vector<GradientReduction> GradientReductions(const Graph& graph,
                                                  const Schedule& schedule) {
  const GraphIndex index(graph);
  std::vector<int> count(graph.params.size(), 0);
  for (const Action& a : schedule.actions) {
    if (a.kind != ActionKind::kReduceScatter) continue;
    for (int32_t id : a.param_ids) {
      const int p = index.ParamPos(id);
      if (p >= 0) ++count[p];
    }
  }
  std::vector<GradientReduction> out(graph.params.size());
  for (size_t p = 0; p < count.size(); ++p) {
    out[p] = count[p] == 0   ? GradientReduction::kNone
             : count[p] == 1 ? GradientReduction::kOnce
                             : GradientReduction::kPerMicroBatch;
  }
  return out;
}

void SetGradientReduction(const Graph& graph,
                          absl::Span<const int32_t> param_ids,
                          GradientReduction reduction, Schedule& schedule) {
  const GraphIndex index(graph);
  const std::vector<std::vector<GradientProduction>> productions =
      GradientProductions(graph);
  absl::flat_hash_set<int32_t> moving;
  // Reduction points: node position -> params reduced after it, in the
  // order given.
  std::map<int, std::vector<int32_t>> points;
  for (int32_t id : param_ids) {
    const int p = index.ParamPos(id);
    if (p < 0 || productions[p].empty() || !moving.insert(id).second) {
      continue;
    }
    if (reduction == GradientReduction::kOnce) {
      points[productions[p].back().last_pos].push_back(id);
    } else if (reduction == GradientReduction::kPerMicroBatch) {
      for (const GradientProduction& run : productions[p]) {
        points[run.last_pos].push_back(id);
      }
    }
  }
  if (moving.empty()) return;

  AnchoredSchedule anchored(graph, index, schedule);
  for (int s = 0; s < anchored.num_slots(); ++s) {
    std::vector<Action>& slot = anchored.slot(s);
    for (Action& a : slot) {
      if (a.kind != ActionKind::kReduceScatter) continue;
      a.param_ids.erase(
          std::remove_if(a.param_ids.begin(), a.param_ids.end(),
                         [&](int32_t id) { return moving.contains(id); }),
          a.param_ids.end());
    }
    slot.erase(std::remove_if(slot.begin(), slot.end(),
                              [](const Action& a) {
                                return a.kind == ActionKind::kReduceScatter &&
                                       a.param_ids.empty();
                              }),
               slot.end());
  }
  for (auto& [pos, ids] : points) {
    std::vector<Action>& slot = anchored.slot(AnchoredSchedule::AfterSlot(pos));
    auto existing = std::find_if(slot.begin(), slot.end(), [](const Action& a) {
      return a.kind == ActionKind::kReduceScatter;
    });
    if (existing != slot.end()) {
      existing->param_ids.insert(existing->param_ids.end(), ids.begin(),
                                 ids.end());
    } else {
      slot.push_back({ActionKind::kReduceScatter, graph.nodes[pos].id,
                      AnchorPosition::kAfter, 0, std::move(ids), 0});
    }
  }
  anchored.WriteTo(schedule);
}

}  // namespace tandem
