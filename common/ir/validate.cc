#include "common/ir/validate.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/ir/profile_fields.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

// Error lists name at most this many offenders, then "and N more".
constexpr size_t kMaxListed = 5;

// Collects problems of one kind so one error can name several offenders.
class Problems {
 public:
  explicit Problems(std::string what) : what_(std::move(what)) {}
  void Add(std::string item) {
    if (items_.size() < kMaxListed) items_.push_back(std::move(item));
    ++count_;
  }
  bool empty() const { return count_ == 0; }
  absl::Status ToStatus(absl::string_view fix) const {
    if (count_ == 0) return absl::OkStatus();
    std::string msg = absl::StrCat(what_, ": ", absl::StrJoin(items_, "; "));
    if (count_ > items_.size()) {
      absl::StrAppend(&msg, "; and ", count_ - items_.size(), " more");
    }
    absl::StrAppend(&msg, ". ", fix);
    return absl::InvalidArgumentError(msg);
  }

 private:
  std::string what_;
  std::vector<std::string> items_;
  size_t count_ = 0;
};

bool FiniteNonNegative(double v) { return std::isfinite(v) && v >= 0; }

// A profile field's value as errors show it.
template <typename Record>
std::string FieldText(const Record& record, const ProfileField<Record>& f) {
  return std::visit([&](auto member) { return absl::StrCat(record.*member); },
                    f.member);
}

std::string NodeRef(const Node& n) {
  return absl::StrCat("node n", n.id, " '", n.name, "'");
}

std::string ParamRef(const Param& p) {
  return absl::StrCat("param p", p.id, " '", p.name, "'");
}

}  // namespace

absl::Status ValidateGraph(const Graph& graph) {
  if (graph.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("graph world_size must be >= 1, got ", graph.world_size));
  }
  if (graph.micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "graph micro_batches must be >= 1, got ", graph.micro_batches));
  }
  if (graph.tokens_per_micro_batch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("graph tokens_per_micro_batch must be >= 0, got ",
                     graph.tokens_per_micro_batch));
  }

  // Params: ids, names, shapes.
  absl::flat_hash_set<int32_t> param_ids;
  absl::flat_hash_set<absl::string_view> param_names;
  Problems bad_param_ids("invalid param ids");
  Problems bad_param_names("invalid param names");
  Problems bad_shapes("invalid param shapes");
  for (const Param& p : graph.params) {
    if (p.id < 0) {
      bad_param_ids.Add(absl::StrCat(ParamRef(p), " has a negative id"));
    } else if (!param_ids.insert(p.id).second) {
      bad_param_ids.Add(absl::StrCat("p", p.id, " is defined twice"));
    }
    if (p.name.empty()) {
      bad_param_names.Add(absl::StrCat("p", p.id, " has no name"));
    } else if (!param_names.insert(p.name).second) {
      bad_param_names.Add(absl::StrCat("'", p.name, "' is defined twice"));
    }
    if (p.shape.empty()) {
      bad_shapes.Add(absl::StrCat(ParamRef(p), " has an empty shape"));
      continue;
    }
    bool dims_ok = true;
    for (int64_t d : p.shape) {
      if (d < 1) {
        bad_shapes.Add(absl::StrCat(ParamRef(p), " has dimension ", d));
        dims_ok = false;
        break;
      }
    }
    if (dims_ok && p.numel() > Param::kMaxNumel) {
      bad_shapes.Add(absl::StrCat(ParamRef(p), " has more than 2^48 elements"));
    }
  }
  RETURN_IF_ERROR(bad_param_ids.ToStatus("Give every param a unique id >= 0."));
  RETURN_IF_ERROR(
      bad_param_names.ToStatus("Give every param a unique, non-empty name."));
  RETURN_IF_ERROR(bad_shapes.ToStatus(
      "Every dimension must be >= 1 (scalars are shape [1])."));

  // Nodes: ids and names first, so twins can be looked up.
  absl::flat_hash_map<int32_t, size_t> node_pos;
  absl::flat_hash_set<absl::string_view> node_names;
  Problems bad_node_ids("invalid node ids");
  Problems bad_node_names("invalid node names");
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& n = graph.nodes[i];
    if (n.id < 0) {
      bad_node_ids.Add(absl::StrCat(NodeRef(n), " has a negative id"));
    } else if (!node_pos.emplace(n.id, i).second) {
      bad_node_ids.Add(absl::StrCat("n", n.id, " is defined twice"));
    }
    if (n.name.empty()) {
      bad_node_names.Add(absl::StrCat("n", n.id, " has no name"));
    } else if (!node_names.insert(n.name).second) {
      bad_node_names.Add(absl::StrCat("'", n.name, "' is defined twice"));
    }
  }
  RETURN_IF_ERROR(bad_node_ids.ToStatus("Give every node a unique id >= 0."));
  RETURN_IF_ERROR(
      bad_node_names.ToStatus("Give every node a unique, non-empty name."));

  Problems unknown_params("nodes use unknown params");
  Problems bad_numbers("nodes with negative or non-finite values");
  Problems bad_micro_batches("nodes with a micro-batch out of range");
  Problems bad_twins("backward nodes without a valid forward twin");
  Problems bad_forward("forward nodes with backward-only attributes");
  Problems bad_order("nodes out of phase order");
  Problems bad_optimizer("optimizer nodes that name params");
  absl::flat_hash_map<int32_t, int32_t> twin_of_forward;  // fwd -> bwd id
  bool seen_optimizer = false;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& n = graph.nodes[i];
    for (int32_t pid : n.param_ids) {
      if (!param_ids.contains(pid)) {
        unknown_params.Add(absl::StrCat(NodeRef(n), " uses p", pid));
      }
    }
    if (!FiniteNonNegative(n.flops) || !FiniteNonNegative(n.time_s) ||
        n.activation_bytes < 0 || n.workspace_bytes < 0) {
      bad_numbers.Add(absl::StrCat(
          NodeRef(n), " (flops=", n.flops, " time=", n.time_s,
          " act=", n.activation_bytes, " ws=", n.workspace_bytes, ")"));
    }
    if (n.phase != Phase::kOptimizer &&
        (n.micro_batch < 0 || n.micro_batch >= graph.micro_batches)) {
      bad_micro_batches.Add(absl::StrCat(NodeRef(n), " has mb=", n.micro_batch,
                                         ", graph has ", graph.micro_batches));
    }
    switch (n.phase) {
      case Phase::kForward:
        if (n.forward_id.has_value() || n.recompute) {
          bad_forward.Add(NodeRef(n));
        }
        if (seen_optimizer) {
          bad_order.Add(absl::StrCat(NodeRef(n), " runs after the optimizer"));
        }
        break;
      case Phase::kBackward: {
        if (seen_optimizer) {
          bad_order.Add(absl::StrCat(NodeRef(n), " runs after the optimizer"));
        }
        if (!n.forward_id.has_value()) {
          bad_twins.Add(
              absl::StrCat(NodeRef(n), " names no forward node (of=)"));
          break;
        }
        auto it = node_pos.find(*n.forward_id);
        if (it == node_pos.end()) {
          bad_twins.Add(
              absl::StrCat(NodeRef(n), " names unknown node n", *n.forward_id));
          break;
        }
        const Node& f = graph.nodes[it->second];
        if (f.phase != Phase::kForward) {
          bad_twins.Add(absl::StrCat(NodeRef(n), " names ", NodeRef(f),
                                     ", which is not a forward node"));
        } else if (it->second >= i) {
          bad_twins.Add(absl::StrCat(NodeRef(n), " runs before its forward ",
                                     NodeRef(f)));
        } else if (f.micro_batch != n.micro_batch) {
          bad_twins.Add(absl::StrCat(NodeRef(n), " is in micro-batch ",
                                     n.micro_batch, " but its forward ",
                                     NodeRef(f), " is in ", f.micro_batch));
        } else if (f.param_ids != n.param_ids) {
          bad_twins.Add(
              absl::StrCat(NodeRef(n), " uses other params than ", NodeRef(f)));
        } else if (auto [tw, inserted] = twin_of_forward.emplace(f.id, n.id);
                   !inserted) {
          bad_twins.Add(absl::StrCat(NodeRef(f), " is mirrored twice (n",
                                     tw->second, " and n", n.id, ")"));
        }
        break;
      }
      case Phase::kOptimizer:
        seen_optimizer = true;
        if (!n.param_ids.empty()) bad_optimizer.Add(NodeRef(n));
        break;
    }
  }
  RETURN_IF_ERROR(unknown_params.ToStatus(
      "Declare every param with a `param` line before nodes use it."));
  RETURN_IF_ERROR(
      bad_numbers.ToStatus("flops, time, act and ws must be finite and >= 0."));
  RETURN_IF_ERROR(bad_micro_batches.ToStatus(
      "Set mb in [0, micro_batches) or raise micro_batches."));
  RETURN_IF_ERROR(
      bad_forward.ToStatus("Only backward nodes take `of=` and `recompute`."));
  RETURN_IF_ERROR(bad_twins.ToStatus(
      "A backward node names (of=) an earlier forward node of the same "
      "micro-batch, mirrors no other backward's twin, and uses the same "
      "params."));
  RETURN_IF_ERROR(bad_optimizer.ToStatus(
      "Optimizer nodes step the shards and use no gathered params: drop "
      "their params= list."));
  RETURN_IF_ERROR(bad_order.ToStatus(
      "Put the optimizer nodes after every forward and backward node."));
  return absl::OkStatus();
}

absl::Status ValidateSchedule(const Schedule& schedule, const Graph& graph) {
  const std::string hash = graph.StructuralHash();
  if (schedule.graph_hash != hash) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule is for graph ",
        schedule.graph_hash.empty() ? std::string("<none>")
                                    : schedule.graph_hash,
        " but the graph's hash is ", hash,
        ". Plan a schedule for this graph (or load the graph it was made "
        "for)."));
  }
  if (schedule.version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule version must be >= 0, got ", schedule.version));
  }
  if (schedule.budget_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule budget must be >= 0 bytes, got ", schedule.budget_bytes));
  }
  const GraphIndex index(graph);
  auto known_param = [&](int32_t id) { return index.ParamPos(id) >= 0; };

  Problems bad_groups("invalid gather groups");
  absl::flat_hash_set<int32_t> group_ids;
  absl::flat_hash_map<int32_t, int32_t> group_of_param;
  for (const GatherGroup& g : schedule.groups) {
    if (!group_ids.insert(g.id).second) {
      bad_groups.Add(absl::StrCat("g", g.id, " is defined twice"));
    }
    if (g.param_ids.empty())
      bad_groups.Add(absl::StrCat("g", g.id, " is empty"));
    for (int32_t pid : g.param_ids) {
      if (!known_param(pid)) {
        bad_groups.Add(absl::StrCat("g", g.id, " names unknown param p", pid));
      } else if (auto [it, inserted] = group_of_param.emplace(pid, g.id);
                 !inserted) {
        bad_groups.Add(
            absl::StrCat("p", pid, " is in g", it->second, " and g", g.id));
      }
    }
  }
  RETURN_IF_ERROR(bad_groups.ToStatus(
      "Each group needs a unique id and a non-empty list of known params, "
      "and a param belongs to at most one group."));

  Problems bad_persistent("invalid persistent params");
  absl::flat_hash_set<int32_t> persistent;
  for (int32_t pid : schedule.persistent_param_ids) {
    if (!known_param(pid)) {
      bad_persistent.Add(absl::StrCat("p", pid, " is unknown"));
    } else if (!persistent.insert(pid).second) {
      bad_persistent.Add(absl::StrCat("p", pid, " is listed twice"));
    }
  }
  RETURN_IF_ERROR(
      bad_persistent.ToStatus("List each known param at most once."));

  Problems bad_offloads("invalid offload entries");
  absl::flat_hash_set<int32_t> offload_ids;
  for (const OffloadEntry& o : schedule.offloads) {
    if (!offload_ids.insert(o.id).second) {
      bad_offloads.Add(absl::StrCat("o", o.id, " is defined twice"));
    }
    if (o.param_ids.empty()) {
      bad_offloads.Add(absl::StrCat("o", o.id, " names no params"));
    }
    if (o.bytes < 0) {
      bad_offloads.Add(absl::StrCat("o", o.id, " has bytes=", o.bytes));
    }
    for (int32_t pid : o.param_ids) {
      if (!known_param(pid)) {
        bad_offloads.Add(
            absl::StrCat("o", o.id, " names unknown param p", pid));
      } else if (!graph.params[index.ParamPos(pid)].trainable) {
        bad_offloads.Add(absl::StrCat("o", o.id, " names frozen param p", pid,
                                      " (it has no optimizer state)"));
      }
    }
  }
  RETURN_IF_ERROR(bad_offloads.ToStatus(
      "Each offload entry needs a unique id, bytes >= 0 and known params that "
      "are trained (frozen params have no optimizer state to offload)."));

  Problems bad_actions("invalid actions");
  for (size_t i = 0; i < schedule.actions.size(); ++i) {
    const Action& a = schedule.actions[i];
    const std::string where =
        absl::StrCat("action ", i, " (", AnchorPositionName(a.position), " n",
                     a.node_id, " ", ActionKindName(a.kind), ")");
    if (index.NodePos(a.node_id) < 0) {
      bad_actions.Add(absl::StrCat(where, " names unknown node n", a.node_id));
    }
    switch (a.kind) {
      case ActionKind::kAllGather:
      case ActionKind::kWait:
      case ActionKind::kRelease:
        if (!group_ids.contains(a.group_id)) {
          bad_actions.Add(
              absl::StrCat(where, " names unknown group g", a.group_id));
        }
        break;
      case ActionKind::kReduceScatter:
        if (a.param_ids.empty()) {
          bad_actions.Add(absl::StrCat(where, " names no params"));
        }
        for (int32_t pid : a.param_ids) {
          if (!known_param(pid)) {
            bad_actions.Add(absl::StrCat(where, " names unknown param p", pid));
          }
        }
        break;
      case ActionKind::kOffload:
      case ActionKind::kReload:
        if (!offload_ids.contains(a.offload_id)) {
          bad_actions.Add(absl::StrCat(where, " names unknown offload entry o",
                                       a.offload_id));
        }
        break;
    }
  }
  RETURN_IF_ERROR(bad_actions.ToStatus(
      "Actions must name nodes of the graph and groups, params or offload "
      "entries the schedule defines."));

  const Prediction& p = schedule.prediction;
  if (!FiniteNonNegative(p.iteration_s) || !FiniteNonNegative(p.compute_s) ||
      !FiniteNonNegative(p.comm_s) || !FiniteNonNegative(p.exposed_comm_s) ||
      !FiniteNonNegative(p.copy_s) || p.peak_bytes < 0 ||
      !FiniteNonNegative(p.work)) {
    return absl::InvalidArgumentError(
        "schedule prediction has a negative or non-finite value; predictions "
        "are times in seconds, bytes and work (batch elements), all >= 0.");
  }
  if (!FiniteNonNegative(schedule.provenance.plan_wall_s) ||
      schedule.provenance.window_first_iteration >
          schedule.provenance.window_last_iteration) {
    return absl::InvalidArgumentError(
        "schedule provenance is malformed: the window must be first <= last "
        "and the wall time finite and >= 0.");
  }
  return absl::OkStatus();
}

absl::Status ValidateProfile(const Profile& profile, const Graph& graph) {
  const std::string hash = graph.StructuralHash();
  if (profile.graph_hash != hash) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile was measured on graph ",
        profile.graph_hash.empty() ? std::string("<none>") : profile.graph_hash,
        " but the graph's hash is ", hash,
        ". Send profiles of the job's own graph."));
  }
  if (profile.rank < Profile::kAggregateRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile rank must be >= 0 (or -1 for an aggregate), got ",
                     profile.rank));
  }
  if (profile.first_iteration < 0 ||
      profile.first_iteration > profile.last_iteration) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile window ", profile.first_iteration, "..",
        profile.last_iteration, " is malformed: need 0 <= first <= last."));
  }
  // -1: the least-memory fallback (common/lowering/least_memory.h).
  if (profile.schedule_version < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile schedule version must be >= -1, got ",
                     profile.schedule_version));
  }
  if (const ProfileField<Profile>* f =
          FirstOutOfBounds(profile, ProfileHeaderFields())) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile ", f->key, " is ", FieldText(profile, *f), ": ",
                     f->what, " must be ", f->bounds.text));
  }
  if (profile.peak_min_bytes > profile.peak_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile peak_min is ", profile.peak_min_bytes,
                     " B: the smallest peak must be at most the largest (peak=",
                     profile.peak_bytes, ")"));
  }
  for (const CollectiveScratch* rule :
       {&profile.allgather_scratch, &profile.reduce_scatter_scratch}) {
    if (rule->copies < 0 || rule->copies > kMaxScratchCopies ||
        rule->cap_bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "profile collective scratch (ag_scratch, rs_scratch) must be 0 to ",
          kMaxScratchCopies, " copies with a cap >= 0 bytes, got ",
          rule->copies, " copies capped at ", rule->cap_bytes, " B"));
    }
  }
  const GraphIndex index(graph);
  Problems bad("invalid profile entries");
  for (const NodeTiming& t : profile.nodes) {
    if (index.NodePos(t.node_id) < 0) {
      bad.Add(absl::StrCat("time of unknown node n", t.node_id));
    }
    if (const ProfileField<NodeTiming>* f =
            FirstOutOfBounds(t, NodeTimingFields())) {
      bad.Add(absl::StrCat(
          "time of n", t.node_id, " is ", t.time_s, " over ", t.samples,
          " samples, with ", t.allgather_overlap_bytes, ", ",
          t.reduce_scatter_overlap_bytes, " and ", t.copy_overlap_bytes,
          " bytes moved alongside (need all >= 0; ", f->key, " is ",
          FieldText(t, *f), ")"));
    }
  }
  for (const CollectiveTiming& c : profile.collectives) {
    const std::string what =
        absl::StrCat(CollectiveKindName(c.kind), " at n", c.node_id);
    if (index.NodePos(c.node_id) < 0) {
      bad.Add(absl::StrCat(what, " names an unknown node"));
    }
    for (int32_t pid : c.param_ids) {
      if (index.ParamPos(pid) < 0) {
        bad.Add(absl::StrCat(what, " names unknown param p", pid));
      }
    }
    if (const ProfileField<CollectiveTiming>* f =
            FirstOutOfBounds(c, CollectiveTimingFields())) {
      bad.Add(absl::StrCat(what, " has a negative or non-finite value (",
                           f->key, " is ", FieldText(c, *f), ": ", f->what,
                           " must be ", f->bounds.text, ")"));
    } else if (c.computing_s >
               std::max(c.run_s, c.issue_to_done_s) * (1 + 1e-9) + 1e-12) {
      bad.Add(absl::StrCat(what, " was computing ", c.computing_s, "s of its ",
                           c.run_s, "s run"));
    } else if (c.exposed_s > c.issue_to_done_s * (1 + 1e-9) + 1e-12) {
      bad.Add(absl::StrCat(what, " has exposed ", c.exposed_s,
                           "s > issue_to_done ", c.issue_to_done_s, "s"));
    }
  }
  for (const MemorySample& m : profile.memory) {
    if (index.NodePos(m.node_id) < 0) {
      bad.Add(absl::StrCat("memory of unknown node n", m.node_id));
    }
    if (const ProfileField<MemorySample>* f =
            FirstOutOfBounds(m, MemorySampleFields())) {
      bad.Add(absl::StrCat("memory of n", m.node_id,
                           " is negative or out of bounds (", f->key, " is ",
                           FieldText(m, *f), ": ", f->what, " must be ",
                           f->bounds.text, ")"));
    }
  }
  return bad.ToStatus(
      "Profiles name nodes and params of the job's graph; times and bytes are "
      ">= 0 and a collective's exposed time is part of its issue-to-done "
      "time.");
}

}  // namespace tandem
