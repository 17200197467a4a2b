#include "common/ir/schedule.h"

namespace tandem {
namespace {

template <typename Enum, size_t N>
std::optional<Enum> ParseByName(absl::string_view name, const Enum (&all)[N],
                                absl::string_view (*name_of)(Enum)) {
  for (Enum e : all) {
    if (name_of(e) == name) return e;
  }
  return std::nullopt;
}

}  // namespace

absl::string_view ActionKindName(ActionKind kind) {
  switch (kind) {
    case ActionKind::kAllGather:
      return "allgather";
    case ActionKind::kWait:
      return "wait";
    case ActionKind::kRelease:
      return "release";
    case ActionKind::kReduceScatter:
      return "reduce_scatter";
    case ActionKind::kOffload:
      return "offload";
    case ActionKind::kReload:
      return "reload";
  }
  return "?";
}

std::optional<ActionKind> ParseActionKind(absl::string_view name) {
  static constexpr ActionKind kAll[] = {
      ActionKind::kAllGather,     ActionKind::kWait,    ActionKind::kRelease,
      ActionKind::kReduceScatter, ActionKind::kOffload, ActionKind::kReload};
  return ParseByName(name, kAll, &ActionKindName);
}

absl::string_view AnchorPositionName(AnchorPosition position) {
  return position == AnchorPosition::kBefore ? "before" : "after";
}

std::optional<AnchorPosition> ParseAnchorPosition(absl::string_view name) {
  static constexpr AnchorPosition kAll[] = {AnchorPosition::kBefore,
                                            AnchorPosition::kAfter};
  return ParseByName(name, kAll, &AnchorPositionName);
}

absl::string_view ShardingModeName(ShardingMode mode) {
  return mode == ShardingMode::kZero3 ? "zero3" : "zero1";
}

std::optional<ShardingMode> ParseShardingMode(absl::string_view name) {
  static constexpr ShardingMode kAll[] = {ShardingMode::kZero3,
                                          ShardingMode::kZero1};
  return ParseByName(name, kAll, &ShardingModeName);
}

bool Action::operator==(const Action& other) const {
  return kind == other.kind && node_id == other.node_id &&
         position == other.position && group_id == other.group_id &&
         param_ids == other.param_ids && offload_id == other.offload_id;
}

bool Prediction::operator==(const Prediction& other) const {
  return iteration_s == other.iteration_s && compute_s == other.compute_s &&
         comm_s == other.comm_s && exposed_comm_s == other.exposed_comm_s &&
         copy_s == other.copy_s && peak_bytes == other.peak_bytes &&
         work == other.work;
}

bool Provenance::operator==(const Provenance& other) const {
  return passes == other.passes &&
         window_first_iteration == other.window_first_iteration &&
         window_last_iteration == other.window_last_iteration &&
         plan_wall_s == other.plan_wall_s && reason == other.reason;
}

const GatherGroup* Schedule::FindGroup(int32_t id) const {
  for (const GatherGroup& g : groups) {
    if (g.id == id) return &g;
  }
  return nullptr;
}

const OffloadEntry* Schedule::FindOffload(int32_t id) const {
  for (const OffloadEntry& o : offloads) {
    if (o.id == id) return &o;
  }
  return nullptr;
}

bool Schedule::operator==(const Schedule& other) const {
  return graph_hash == other.graph_hash && version == other.version &&
         mode == other.mode && groups == other.groups &&
         persistent_param_ids == other.persistent_param_ids &&
         offloads == other.offloads && actions == other.actions &&
         prediction == other.prediction && provenance == other.provenance &&
         budget_bytes == other.budget_bytes && explanation == other.explanation;
}

bool SamePlan(const Schedule& a, const Schedule& b) {
  return a.mode == b.mode && a.groups == b.groups &&
         a.persistent_param_ids == b.persistent_param_ids &&
         a.offloads == b.offloads && a.actions == b.actions;
}

}  // namespace tandem
