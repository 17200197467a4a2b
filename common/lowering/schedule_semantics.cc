#include "common/lowering/schedule_semantics.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/lowering/anchored_schedule.h"
#include "common/lowering/gradient_reduction.h"

namespace tandem {
namespace {

constexpr size_t kMaxListed = 5;

std::string NodeRef(const Node& n) {
  return absl::StrCat("n", n.id, " '", n.name, "'");
}

absl::Status ToStatus(const std::vector<Violation>& violations,
                      absl::string_view fix) {
  if (violations.empty()) return absl::OkStatus();
  std::vector<std::string> listed;
  for (size_t i = 0; i < violations.size() && i < kMaxListed; ++i) {
    listed.push_back(violations[i].message);
  }
  std::string msg = absl::StrJoin(listed, "; ");
  if (violations.size() > kMaxListed) {
    absl::StrAppend(&msg, "; and ", violations.size() - kMaxListed, " more");
  }
  absl::StrAppend(&msg, ". ", fix);
  return absl::InvalidArgumentError(msg);
}

std::vector<Violation> Only(std::vector<Violation> all,
                            std::initializer_list<ViolationKind> kinds) {
  std::vector<Violation> out;
  for (Violation& v : all) {
    if (std::find(kinds.begin(), kinds.end(), v.kind) != kinds.end()) {
      out.push_back(std::move(v));
    }
  }
  return out;
}

}  // namespace

std::vector<Violation> FindGatherViolations(const Graph& graph,
                                            const Schedule& schedule) {
  const GraphIndex index(graph);
  const std::vector<std::vector<int>> slots =
      ActionIndicesBySlot(graph, index, schedule);
  const absl::flat_hash_set<int32_t> persistent(
      schedule.persistent_param_ids.begin(),
      schedule.persistent_param_ids.end());
  absl::flat_hash_map<int32_t, int32_t> group_of;
  absl::flat_hash_map<int32_t, size_t> group_pos;
  for (size_t i = 0; i < schedule.groups.size(); ++i) {
    group_pos[schedule.groups[i].id] = i;
    for (int32_t p : schedule.groups[i].param_ids) {
      group_of[p] = schedule.groups[i].id;
    }
  }
  enum class State { kNever, kInFlight, kReady, kReleased };
  std::vector<State> state(schedule.groups.size(), State::kNever);
  std::vector<Violation> out;

  auto apply = [&](int action_index, const Node& node) {
    const Action& a = schedule.actions[action_index];
    if (a.kind != ActionKind::kAllGather && a.kind != ActionKind::kWait &&
        a.kind != ActionKind::kRelease) {
      return;
    }
    auto it = group_pos.find(a.group_id);
    if (it == group_pos.end()) return;
    State& s = state[it->second];
    const std::string where =
        absl::StrCat(ActionKindName(a.kind), " g", a.group_id, " ",
                     AnchorPositionName(a.position), " ", NodeRef(node));
    switch (a.kind) {
      case ActionKind::kAllGather:
        if (s == State::kInFlight || s == State::kReady) {
          out.push_back({ViolationKind::kGatherMisuse,
                         absl::StrCat(where,
                                      " gathers a group that is "
                                      "already gathered")});
        }
        s = State::kInFlight;
        break;
      case ActionKind::kWait:
        if (s != State::kInFlight) {
          out.push_back(
              {ViolationKind::kGatherMisuse,
               absl::StrCat(where, " waits for no gather in flight")});
        } else {
          s = State::kReady;
        }
        break;
      case ActionKind::kRelease:
        if (s == State::kInFlight) {
          out.push_back({ViolationKind::kGatherMisuse,
                         absl::StrCat(where,
                                      " releases a gather still in "
                                      "flight (WAIT first)")});
        } else if (s != State::kReady) {
          out.push_back({ViolationKind::kGatherMisuse,
                         absl::StrCat(where,
                                      " releases a group that is not "
                                      "gathered")});
        }
        s = State::kReleased;
        break;
      default:
        break;
    }
  };

  for (size_t pos = 0; pos < graph.nodes.size(); ++pos) {
    const Node& node = graph.nodes[pos];
    for (int ai : slots[AnchoredSchedule::BeforeSlot(pos)]) apply(ai, node);
    for (int32_t p : node.param_ids) {
      if (persistent.contains(p)) continue;
      auto g = group_of.find(p);
      if (g == group_of.end()) {
        out.push_back({ViolationKind::kUseBeforeGather,
                       absl::StrCat(NodeRef(node), " uses p", p,
                                    ", which is in no gather group and not "
                                    "persistent")});
        continue;
      }
      switch (state[group_pos[g->second]]) {
        case State::kReady:
          break;
        case State::kNever:
          out.push_back({ViolationKind::kUseBeforeGather,
                         absl::StrCat(NodeRef(node), " uses p", p, " of g",
                                      g->second, " before any gather")});
          break;
        case State::kInFlight:
          out.push_back(
              {ViolationKind::kUseBeforeGather,
               absl::StrCat(NodeRef(node), " uses p", p, " of g", g->second,
                            " before its gather completes (no "
                            "WAIT)")});
          break;
        case State::kReleased:
          out.push_back({ViolationKind::kUseAfterRelease,
                         absl::StrCat(NodeRef(node), " uses p", p, " of g",
                                      g->second, " after its release")});
          break;
      }
    }
    for (int ai : slots[AnchoredSchedule::AfterSlot(pos)]) apply(ai, node);
  }
  for (size_t i = 0; i < schedule.groups.size(); ++i) {
    if (state[i] == State::kInFlight || state[i] == State::kReady) {
      const bool all_persistent =
          std::all_of(schedule.groups[i].param_ids.begin(),
                      schedule.groups[i].param_ids.end(),
                      [&](int32_t p) { return persistent.contains(p); });
      if (!all_persistent) {
        out.push_back({ViolationKind::kGatherMisuse,
                       absl::StrCat("g", schedule.groups[i].id,
                                    " is still gathered at the end of the "
                                    "iteration (release it, or make its "
                                    "params persistent)")});
      }
    }
  }
  return out;
}

std::vector<Violation> FindReduceViolations(const Graph& graph,
                                            const Schedule& schedule) {
  const GraphIndex index(graph);
  const std::vector<std::vector<GradientProduction>> productions =
      GradientProductions(graph);
  // Program order key of an action: 2*pos for before, 2*pos+1 for after.
  absl::flat_hash_map<int32_t, std::vector<size_t>> reduces;
  for (const Action& a : schedule.actions) {
    if (a.kind != ActionKind::kReduceScatter) continue;
    const int pos = index.NodePos(a.node_id);
    if (pos < 0) continue;
    const size_t key =
        2 * static_cast<size_t>(pos) + (a.position == AnchorPosition::kAfter);
    for (int32_t id : a.param_ids) reduces[id].push_back(key);
  }
  auto done_key = [](const GradientProduction& run) {
    return 2 * static_cast<size_t>(run.last_pos) + 1;
  };
  std::vector<Violation> out;
  for (size_t p = 0; p < graph.params.size(); ++p) {
    const Param& param = graph.params[p];
    const std::vector<GradientProduction>& runs = productions[p];
    auto r = reduces.find(param.id);
    std::vector<size_t> keys;
    if (r != reduces.end()) keys = r->second;
    std::sort(keys.begin(), keys.end());
    const std::string name = absl::StrCat("p", param.id, " '", param.name, "'");
    if (runs.empty()) {
      if (!keys.empty()) {
        out.push_back(
            {ViolationKind::kReduceCount,
             absl::StrCat(name,
                          param.trainable ? " gets no gradient"
                                          : " is frozen (it has no gradient)",
                          " but is reduced ", keys.size(), " time(s)")});
      }
      continue;
    }
    if (keys.size() == 1) {
      // Accumulated over every micro-batch, reduced once.
      if (keys[0] < done_key(runs.back())) {
        out.push_back(
            {ViolationKind::kReduceTooEarly,
             absl::StrCat(name,
                          " is reduced before its gradient is complete (last "
                          "produced by ",
                          NodeRef(graph.nodes[runs.back().last_pos]), ")")});
      }
      continue;
    }
    if (keys.size() != runs.size()) {
      out.push_back(
          {ViolationKind::kReduceCount,
           absl::StrCat(name, " is reduced ", keys.size(),
                        " times, expected exactly once",
                        runs.size() > 1
                            ? absl::StrCat(" or once per micro-batch (",
                                           runs.size(), ")")
                            : "")});
      continue;
    }
    // Reduced per micro-batch: the j-th reduce-scatter after micro-batch j's
    // last producer and before micro-batch j+1's first, so each takes exactly
    // one micro-batch's contribution.
    for (size_t j = 0; j < runs.size(); ++j) {
      if (keys[j] < done_key(runs[j])) {
        out.push_back(
            {ViolationKind::kReduceTooEarly,
             absl::StrCat(name, "'s reduce-scatter ", j + 1, " of ",
                          runs.size(), " runs before micro-batch ",
                          runs[j].micro_batch,
                          "'s gradient is complete (last produced by ",
                          NodeRef(graph.nodes[runs[j].last_pos]), ")")});
        break;
      }
      if (j + 1 < runs.size() &&
          keys[j] > 2 * static_cast<size_t>(runs[j + 1].first_pos)) {
        out.push_back(
            {ViolationKind::kReduceMixesMicroBatches,
             absl::StrCat(name, "'s reduce-scatter ", j + 1, " of ",
                          runs.size(), " runs after micro-batch ",
                          runs[j + 1].micro_batch,
                          " started producing its gradient (at ",
                          NodeRef(graph.nodes[runs[j + 1].first_pos]),
                          "), so it would take part of two micro-batches")});
        break;
      }
    }
  }
  return out;
}

absl::Status CheckScheduleSemantics(const Graph& graph,
                                    const Schedule& schedule) {
  std::vector<Violation> all = FindGatherViolations(graph, schedule);
  std::vector<Violation> reduce = FindReduceViolations(graph, schedule);
  all.insert(all.end(), reduce.begin(), reduce.end());
  return ToStatus(all,
                  "Every use needs ALLGATHER then WAIT of its group (or a "
                  "persistent param), no use after RELEASE, and each gradient "
                  "one REDUCE_SCATTER after its last backward node (or one "
                  "after each micro-batch's last).");
}

absl::Status CheckGatherBeforeUse(const Graph& graph,
                                  const Schedule& schedule) {
  return ToStatus(
      Only(FindGatherViolations(graph, schedule),
           {ViolationKind::kUseBeforeGather, ViolationKind::kGatherMisuse}),
      "Issue ALLGATHER and WAIT of a param's group before every use.");
}

absl::Status CheckNoUseAfterRelease(const Graph& graph,
                                    const Schedule& schedule) {
  return ToStatus(Only(FindGatherViolations(graph, schedule),
                       {ViolationKind::kUseAfterRelease}),
                  "Release a group only after the last use in its phase, or "
                  "gather it again.");
}

absl::Status CheckReduceOnce(const Graph& graph, const Schedule& schedule) {
  return ToStatus(FindReduceViolations(graph, schedule),
                  "Reduce-scatter each gradient exactly once, after the last "
                  "backward node that produces it, or once per micro-batch, "
                  "after that micro-batch's last.");
}

}  // namespace tandem
