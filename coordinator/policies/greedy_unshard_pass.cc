#include "coordinator/policies/greedy_unshard_pass.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/status_macros.h"
#include "coordinator/policies/program_memory.h"

namespace tandem {

absl::StatusOr<bool> GreedyUnshardPass::RunImpl(PlanningContext& context) {
  const Graph& graph = context.graph();
  Schedule& schedule = context.schedule();
  if (schedule.mode != ShardingMode::kZero3 || schedule.groups.empty()) {
    return false;
  }
  if (!context.has_sim()) RETURN_IF_ERROR(context.Resimulate());
  const double headroom =
      static_cast<double>(context.budget()) * (1 - kMemoryMargin) -
      static_cast<double>(context.sim().peak_bytes);
  if (headroom <= 0) return false;

  struct Candidate {
    size_t group = 0;
    int64_t bytes = 0;
    double seconds_per_byte = 0;
  };
  absl::flat_hash_map<int32_t, int> gathers;  // group id -> ALLGATHERs
  for (const Action& a : schedule.actions) {
    if (a.kind == ActionKind::kAllGather) ++gathers[a.group_id];
  }
  std::vector<Candidate> candidates;
  for (size_t g = 0; g < schedule.groups.size(); ++g) {
    const int64_t bytes =
        GroupBytes(graph, context.index(), schedule.groups[g]);
    if (bytes <= 0) continue;
    const double seconds =
        gathers[schedule.groups[g].id] * context.hw().AllGatherSeconds(bytes);
    candidates.push_back({g, bytes, seconds / static_cast<double>(bytes)});
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) {
                     return a.seconds_per_byte > b.seconds_per_byte;
                   });

  std::vector<int32_t> chosen;
  int64_t used = 0;
  for (const Candidate& c : candidates) {
    if (static_cast<double>(used + c.bytes) > headroom) break;
    used += c.bytes;
    const GatherGroup& group = schedule.groups[c.group];
    chosen.insert(chosen.end(), group.param_ids.begin(), group.param_ids.end());
  }
  if (chosen.empty()) return false;
  return MakePersistent(chosen, schedule);
}

}  // namespace tandem
