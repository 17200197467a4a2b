// The schedule IR: the plan for one graph (common/README.md, "Schedule").
// Actions are anchored before or after a node; at one anchor they run in list
// order.
#ifndef TANDEM_COMMON_IR_SCHEDULE_H_
#define TANDEM_COMMON_IR_SCHEDULE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/ir/explanation.h"

namespace tandem {

enum class ActionKind {
  kAllGather,
  kWait,
  kRelease,
  kReduceScatter,
  kOffload,
  kReload,
};
// "allgather", "wait", "release", "reduce_scatter", "offload", "reload".
absl::string_view ActionKindName(ActionKind kind);
std::optional<ActionKind> ParseActionKind(absl::string_view name);

enum class AnchorPosition { kBefore, kAfter };
absl::string_view AnchorPositionName(AnchorPosition position);
std::optional<AnchorPosition> ParseAnchorPosition(absl::string_view name);

enum class ShardingMode { kZero3, kZero1 };
absl::string_view ShardingModeName(ShardingMode mode);
std::optional<ShardingMode> ParseShardingMode(absl::string_view name);

struct Action {
  ActionKind kind = ActionKind::kAllGather;
  int32_t node_id = 0;
  AnchorPosition position = AnchorPosition::kBefore;
  // kAllGather, kWait, kRelease.
  int32_t group_id = 0;
  // kReduceScatter: reduced into the shard accumulators; once per iteration
  // or once per micro-batch (common/lowering/gradient_reduction.h).
  std::vector<int32_t> param_ids;
  // kOffload, kReload.
  int32_t offload_id = 0;

  bool operator==(const Action& other) const;
  bool operator!=(const Action& other) const { return !(*this == other); }
};

struct GatherGroup {
  int32_t id = 0;
  std::vector<int32_t> param_ids;
  bool operator==(const GatherGroup& other) const {
    return id == other.id && param_ids == other.param_ids;
  }
};

// Optimizer states of some params that leave device memory during forward.
struct OffloadEntry {
  int32_t id = 0;
  std::vector<int32_t> param_ids;
  int64_t bytes = 0;
  bool operator==(const OffloadEntry& other) const {
    return id == other.id && param_ids == other.param_ids &&
           bytes == other.bytes;
  }
};

struct Prediction {
  double iteration_s = 0;
  double compute_s = 0;
  double comm_s = 0;
  double exposed_comm_s = 0;
  double copy_s = 0;
  int64_t peak_bytes = 0;
  // The work per iteration (elements of a rank's batch inputs, the largest
  // rank's) of the profile the prediction was made from, which varies with
  // variable-length batches (Profile::work). 0: not measured.
  double work = 0;
  bool operator==(const Prediction& other) const;
};

struct Provenance {
  std::vector<std::string> passes;
  int64_t window_first_iteration = 0;
  int64_t window_last_iteration = 0;
  double plan_wall_s = 0;
  std::string reason;
  bool operator==(const Provenance& other) const;
};

struct Schedule {
  std::string graph_hash;
  int64_t version = 0;
  ShardingMode mode = ShardingMode::kZero3;
  std::vector<GatherGroup> groups;
  std::vector<int32_t> persistent_param_ids;
  std::vector<OffloadEntry> offloads;
  std::vector<Action> actions;
  Prediction prediction;
  Provenance provenance;
  int64_t budget_bytes = 0;
  // The planner's decisions and their measured gains (explanation.h); empty
  // for a schedule that was not planned (the starting schedule).
  Explanation explanation;

  const GatherGroup* FindGroup(int32_t id) const;
  const OffloadEntry* FindOffload(int32_t id) const;

  bool operator==(const Schedule& other) const;
  bool operator!=(const Schedule& other) const { return !(*this == other); }
};

// The same plan whatever the versions, provenance, predictions and
// explanations: the mode, groups, persistent set, offloads and actions the
// workers would run.
bool SamePlan(const Schedule& a, const Schedule& b);

}  // namespace tandem

#endif  // TANDEM_COMMON_IR_SCHEDULE_H_
