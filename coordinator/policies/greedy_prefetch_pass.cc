#include "coordinator/policies/greedy_prefetch_pass.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "coordinator/policies/program_memory.h"

namespace tandem {
namespace {

// Gathers hoisted together; members in reverse use order, as met.
struct Bucket {
  std::vector<Action> gathers;
  int64_t bytes = 0;
};

// Appends the buckets' gathers to `to` in use order; `buckets` are in reverse
// use order (the first was met last in program order).
void EmitInUseOrder(const std::vector<Bucket>& buckets,
                    std::vector<Action>& to) {
  for (auto b = buckets.rbegin(); b != buckets.rend(); ++b) {
    to.insert(to.end(), b->gathers.rbegin(), b->gathers.rend());
  }
}

}  // namespace

absl::StatusOr<bool> GreedyPrefetchPass::RunImpl(PlanningContext& context) {
  const Graph& graph = context.graph();
  const HardwareModel& hw = context.hw();
  Schedule& schedule = context.schedule();
  if (schedule.mode != ShardingMode::kZero3 || schedule.groups.empty()) {
    return false;
  }
  absl::flat_hash_map<int32_t, int64_t> group_bytes;
  for (const GatherGroup& g : schedule.groups) {
    group_bytes[g.id] = GroupBytes(graph, context.index(), g);
  }
  const std::vector<int64_t> memory =
      EstimateProgramMemory(graph, schedule).during;
  const double max_memory =
      static_cast<double>(context.budget()) * (1 - kMemoryMargin);

  const Schedule before = schedule;
  AnchoredSchedule plan(graph, context.index(), schedule);
  for (const PhaseSegment& segment : PhaseSegments(graph)) {
    if (segment.phase == Phase::kOptimizer) continue;
    std::deque<Bucket> closed;  // front: the oldest (used latest)
    Bucket current;
    int64_t pending = 0;
    for (int pos = segment.last; pos >= segment.first; --pos) {
      // May the pending gathers be live while this node runs?
      std::vector<Bucket> issued_after;
      while (static_cast<double>(memory[pos] + pending) > max_memory ||
             static_cast<double>(pending) > kMaxBufferedBytes) {
        if (!closed.empty()) {
          pending -= closed.front().bytes;
          issued_after.push_back(std::move(closed.front()));
          closed.pop_front();
        } else if (!current.gathers.empty()) {
          closed.push_back(std::move(current));
          current = Bucket();
        } else {
          break;
        }
      }
      EmitInUseOrder(issued_after, plan.slot(AnchoredSchedule::AfterSlot(pos)));

      // This node's on-demand gathers start their hoist here.
      std::vector<Action>& at = plan.slot(AnchoredSchedule::BeforeSlot(pos));
      std::vector<Action> gathers;
      std::vector<Action> rest;
      for (Action& a : at) {
        (a.kind == ActionKind::kAllGather ? gathers : rest).push_back(a);
      }
      at = std::move(rest);
      for (auto a = gathers.rbegin(); a != gathers.rend(); ++a) {
        const int64_t bytes = group_bytes[a->group_id];
        const double fused = hw.AllGatherSeconds(current.bytes + bytes);
        const double apart = std::max(hw.AllGatherSeconds(current.bytes),
                                      hw.AllGatherSeconds(bytes));
        const bool fuse =
            apart * kFuseFactor > fused &&
            static_cast<double>(current.bytes + bytes) < kMaxFuseBytes;
        if (!current.gathers.empty() && !fuse) {
          closed.push_back(std::move(current));
          current = Bucket();
        }
        current.gathers.push_back(*a);
        current.bytes += bytes;
        pending += bytes;
      }
    }
    // The graph's first node: issue whatever is still pending before it.
    std::vector<Bucket> rest(closed.begin(), closed.end());
    if (!current.gathers.empty()) rest.push_back(std::move(current));
    std::vector<Action> head;
    EmitInUseOrder(rest, head);
    std::vector<Action>& first =
        plan.slot(AnchoredSchedule::BeforeSlot(segment.first));
    first.insert(first.begin(), head.begin(), head.end());
  }
  plan.WriteTo(schedule);
  return !(schedule == before);
}

}  // namespace tandem
