// The worker's profiler (worker/README.md, "Profiling"): per node forward and
// backward time, per collective issue→done time and the part compute waited
// for, memory at node boundaries; the medians over a window of iterations
// under one schedule version, emitted as the Profile IR (text or tandem.v1
// proto). Recording is a few clock reads and adds per node, so it stays on in
// production (the bench measures its cost). Compute thread only; no libtorch.
#ifndef TANDEM_WORKER_RUNTIME_PROFILER_H_
#define TANDEM_WORKER_RUNTIME_PROFILER_H_

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/ir/profile.h"
#include "worker/runtime/iteration_timeline.h"
#include "worker/runtime/own_memory.h"

namespace tandem {

// Steps at the start of a process that no profile window holds: they pay
// one-time costs no later step pays (the model's first calls, the
// allocator's first blocks, the collectives' connections) and, for an
// exported model, run before TorchScript's profiling executor has
// optimized its graphs: an exported GPT's steps read 0.60, 0.54, 0.58, then
// 0.50 s at 2000 Mbit/s (2026-11-29), and a window of steps 1-3 priced its
// first plan 9-12% slow (worker/README.md, "Profiling"). The first step
// under each later schedule is left out too, for its own new buffers.
inline constexpr int kUnprofiledProcessSteps = 2;

// Bytes all-gathers, reduce-scatters and host copies moved while one node
// of an iteration computed: each transfer's bytes times the share of its
// span inside the node's span (NodeTiming's overlap bytes).
struct NodeOverlap {
  int32_t node_id = 0;
  double allgather_bytes = 0;
  double reduce_scatter_bytes = 0;
  double copy_bytes = 0;
};
// One entry per node span of `it`, in start order.
std::vector<NodeOverlap> NodeOverlaps(const IterationTimeline::Iteration& it);

class Profiler {
 public:
  // `num_nodes`: the graph's node count (node ids are 0..num_nodes-1).
  Profiler(bool enabled, int num_nodes);

  bool enabled() const { return enabled_; }
  // Turns recording on or off between iterations (the bench measures the
  // profiler's cost this way).
  void set_enabled(bool enabled) { enabled_ = enabled; }

  // Starts an iteration; a new schedule version starts a new window.
  void BeginIteration(int64_t iteration, int64_t schedule_version);
  void RecordNode(int32_t node_id, double seconds);
  // `own`: the node's own memory (MemoryMeter::NodeWindow()); the window
  // keeps the largest of each figure.
  void RecordMemory(int32_t node_id, int64_t before_bytes, int64_t after_bytes,
                    const OwnMemory& own = {});
  // `spans`, when known, also place the collective (and compute's wait for
  // it) on the iteration timeline.
  void RecordCollective(const CollectiveTiming& timing,
                        const CollectiveSpans& spans = {});
  // Communication compute blocked on outside any collective (the end-of-step
  // exchange); timeline only.
  void RecordExchange(absl::string_view label, TimelineClock::time_point start,
                      TimelineClock::time_point end);
  // A host-tier copy (OFFLOAD/RELOAD) on the copy stream: on the timeline,
  // and summed into the window's host-copy bytes and seconds.
  void RecordCopy(absl::string_view label, int64_t bytes,
                  TimelineClock::time_point start,
                  TimelineClock::time_point end);
  // `work`: the elements of the iteration's batch inputs (StepStats::work),
  // averaged into the window's Profile::work.
  void EndIteration(double iteration_s, int64_t peak_bytes, int64_t work = 0);
  // The interference probe's compute seconds per byte moved and its
  // stretches (interference_probe.h), reported in every snapshot.
  void SetInterference(double per_allgather_byte,
                       double per_reduce_scatter_byte, double per_copy_byte);
  void SetStretch(double allgather, double reduce_scatter, double copy);
  // The probe's host-tier copy: a window in which no copy ran reports it as
  // its host copies, so the planner knows the host link before offloading.
  void SetProbedHostCopy(int64_t bytes, double seconds);
  // The communicator's scratch rule (Communicator::AllGatherScratch), in
  // every snapshot.
  void SetCollectiveScratch(const CollectiveScratch& allgather,
                            const CollectiveScratch& reduce_scatter) {
    allgather_scratch_ = allgather;
    reduce_scatter_scratch_ = reduce_scatter;
  }

  // The window's medians: each node's and collective's times and the
  // iteration time, so one disturbed step does not move the plan made from
  // it (memory: the largest seen at each boundary; work: the median
  // iteration's; overlap bytes: means).
  Profile Snapshot(const std::string& graph_hash, int32_t rank) const;
  // Starts a new window at the next iteration.
  void Reset();
  int iterations() const { return static_cast<int>(iterations_.size()); }
  // The last complete iteration's timeline (kept across Reset()).
  const IterationTimeline& timeline() const { return timeline_; }
  IterationTimeline& timeline() { return timeline_; }

 private:
  struct Accumulator {
    std::vector<double> times;
    // Bytes moved alongside the node's compute, by all-gathers,
    // reduce-scatters and copies (summed over samples).
    double allgather_overlap = 0;
    double reduce_scatter_overlap = 0;
    double copy_overlap = 0;
  };
  // Adds each node's overlap bytes in the iteration just ended.
  void AccumulateOverlaps(const IterationTimeline::Iteration& it);
  struct CollectiveAccumulator {
    CollectiveTiming last;
    std::vector<double> issue_to_done;
    std::vector<double> run;
    std::vector<double> exposed;
    // Part of each run the compute thread was computing.
    std::vector<double> computing;
  };
  // This iteration's collectives with known spans, placed against its node
  // spans when it ends (a node still running at RecordCollective counts).
  struct PendingRun {
    CollectiveAccumulator* accumulator;
    TimelineClock::time_point started;
    TimelineClock::time_point finished;
  };
  std::vector<PendingRun> pending_runs_;
  std::vector<std::pair<TimelineClock::time_point, TimelineClock::time_point>>
      node_spans_;
  using CollectiveKey = std::tuple<int, int32_t, int32_t, std::vector<int32_t>>;

  bool enabled_;
  // kNoVersion before the first iteration (-1 is the least-memory
  // fallback's version, common/lowering/least_memory.h).
  static constexpr int64_t kNoVersion = std::numeric_limits<int64_t>::min();
  int64_t version_ = kNoVersion;
  int64_t first_iteration_ = 0;
  int64_t last_iteration_ = 0;
  // The window's iterations: time and work.
  std::vector<std::pair<double, int64_t>> iterations_;
  int64_t peak_bytes_ = 0;
  // The smallest iteration peak in the window (0: no iteration yet).
  int64_t peak_min_bytes_ = 0;
  int64_t host_copy_bytes_ = 0;
  double host_copy_s_ = 0;
  double per_allgather_byte_ = 0;
  double per_reduce_scatter_byte_ = 0;
  double per_copy_byte_ = 0;
  double allgather_stretch_ = 0;
  double reduce_scatter_stretch_ = 0;
  double copy_stretch_ = 0;
  int64_t probed_copy_bytes_ = 0;
  CollectiveScratch allgather_scratch_;
  CollectiveScratch reduce_scatter_scratch_;
  double probed_copy_s_ = 0;
  std::vector<Accumulator> nodes_;
  std::vector<MemorySample> memory_;
  std::vector<bool> has_memory_;
  std::map<CollectiveKey, CollectiveAccumulator> collectives_;
  IterationTimeline timeline_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_PROFILER_H_
