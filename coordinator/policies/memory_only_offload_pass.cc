#include "coordinator/policies/memory_only_offload_pass.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "coordinator/policies/program_memory.h"

namespace tandem {

absl::StatusOr<bool> MemoryOnlyOffloadPass::RunImpl(PlanningContext& context) {
  const Graph& graph = context.graph();
  Schedule& schedule = context.schedule();
  if (!schedule.offloads.empty()) return false;
  const std::vector<PhaseSegment> segments = PhaseSegments(graph);
  const PhaseSegment* first_forward = nullptr;
  const PhaseSegment* last_backward = nullptr;
  for (const PhaseSegment& segment : segments) {
    if (segment.phase == Phase::kForward && first_forward == nullptr) {
      first_forward = &segment;
    }
    if (segment.phase == Phase::kBackward) last_backward = &segment;
  }
  if (first_forward == nullptr || last_backward == nullptr) return false;

  // The profile with every state on the host.
  const ProgramMemory memory = EstimateProgramMemory(graph, schedule);
  std::vector<int64_t> without_states(memory.during.size());
  for (size_t i = 0; i < without_states.size(); ++i) {
    without_states[i] = memory.during[i] - memory.states[i];
  }
  const double usable =
      static_cast<double>(context.budget()) * (1 - kMemoryMargin);

  struct Task {
    int32_t param_id;
    int64_t bytes;
  };
  std::vector<Task> tasks;
  int64_t on_device = 0;
  for (const Param& param : graph.params) {
    const int64_t bytes = ParamStateBytes(param, graph.world_size);
    if (bytes <= 0) continue;
    tasks.push_back({param.id, bytes});
    on_device += bytes;
  }

  // Offload, in optimizer order, until the running peak fits.
  size_t offloaded = 0;
  int64_t running_peak = 0;
  for (int pos = first_forward->first; pos <= last_backward->last; ++pos) {
    running_peak = std::max(running_peak, without_states[pos]);
    while (offloaded < tasks.size() &&
           static_cast<double>(running_peak + on_device) > usable) {
      on_device -= tasks[offloaded++].bytes;
    }
  }
  if (offloaded == 0) return false;

  AnchoredSchedule plan(graph, context.index(), schedule);
  std::vector<Action>& start =
      plan.slot(AnchoredSchedule::BeforeSlot(first_forward->first));
  std::vector<Action> offloads;
  for (size_t t = 0; t < offloaded; ++t) {
    const int32_t id = static_cast<int32_t>(t);
    schedule.offloads.push_back({id, {tasks[t].param_id}, tasks[t].bytes});
    Action offload;
    offload.kind = ActionKind::kOffload;
    offload.offload_id = id;
    offloads.push_back(offload);
  }
  start.insert(start.begin(), offloads.begin(), offloads.end());

  // Reload as soon as the rest of the backward leaves room.
  std::vector<int64_t> rest_peak(without_states.size(), 0);
  for (int pos = last_backward->last; pos >= last_backward->first; --pos) {
    rest_peak[pos] =
        std::max(without_states[pos],
                 pos < last_backward->last ? rest_peak[pos + 1] : int64_t{0});
  }
  size_t reloaded = 0;
  int64_t back = 0;
  auto reload = [&](int pos) {
    Action action;
    action.kind = ActionKind::kReload;
    action.offload_id = static_cast<int32_t>(reloaded);
    plan.slot(AnchoredSchedule::AfterSlot(pos)).push_back(action);
    back += tasks[reloaded++].bytes;
  };
  for (int pos = last_backward->first; pos <= last_backward->last; ++pos) {
    while (reloaded < offloaded &&
           static_cast<double>(rest_peak[pos] + on_device + back +
                               tasks[reloaded].bytes) < usable) {
      reload(pos);
    }
  }
  while (reloaded < offloaded) reload(last_backward->last);
  plan.WriteTo(schedule);
  return true;
}

}  // namespace tandem
