// The timeline of one training iteration on one rank, for people to look at:
// what ran on the compute stream (forward/backward/optimizer nodes, and the
// waits where compute was blocked on communication), on the communication
// stream (each collective from the moment the communication thread started it
// to its completion) and on the copy stream (offload/reload transfers), with
// memory at node boundaries. The profiler (profiler.h) fills it alongside its
// window averages; it keeps the last complete iteration, which the worker
// writes as a Chrome/Perfetto trace (JSON trace events) and sums into the
// per-iteration metrics (compute, communication, bytes per collective).
//
// Compute thread only, like the profiler. No libtorch.
#ifndef TANDEM_WORKER_RUNTIME_ITERATION_TIMELINE_H_
#define TANDEM_WORKER_RUNTIME_ITERATION_TIMELINE_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/ir/graph.h"
#include "common/ir/profile.h"

namespace tandem {

using TimelineClock = std::chrono::steady_clock;

// When a collective ran and when compute waited for it. A default (epoch)
// `started` means "unknown": nothing is added to the timeline.
struct CollectiveSpans {
  TimelineClock::time_point started;
  TimelineClock::time_point finished;
  // Compute blocked from wait_start for exposed_s (CollectiveTiming).
  TimelineClock::time_point wait_start;
};

class IterationTimeline {
 public:
  enum class Stream { kCompute = 1, kCommunication = 2, kCopy = 3 };
  enum class SpanKind {
    kNode,        // a graph node on the compute stream
    kWait,        // compute blocked on a collective (exposed communication)
    kExchange,    // the end-of-step scalar exchange: communication, exposed
    kCollective,  // a collective on the communication stream
    kCopy,        // a host<->device transfer on the copy stream
  };
  struct Span {
    Stream stream = Stream::kCompute;
    SpanKind kind = SpanKind::kNode;
    // Seconds from the start of the iteration (negative for a collective
    // issued at the end of the previous one, e.g. the persistent refresh).
    double start_s = 0;
    double duration_s = 0;
    // kNode: the node; kWait/kCollective: the node the collective was
    // issued at; -1 otherwise.
    int32_t node_id = -1;
    // kWait/kCollective.
    CollectiveKind collective = CollectiveKind::kAllGather;
    int32_t group_id = 0;
    int64_t bytes = 0;
    // kCollective: issue to done, and the part compute waited for.
    double issue_to_done_s = 0;
    double exposed_s = 0;
    // kExchange/kCopy: what it was.
    std::string label;
  };
  struct MemoryPoint {
    double time_s = 0;
    int64_t bytes = 0;
  };
  // One complete iteration.
  struct Iteration {
    int64_t iteration = -1;  // -1: none recorded yet
    int64_t schedule_version = 0;
    double iteration_s = 0;
    int64_t peak_bytes = 0;
    std::vector<Span> spans;
    std::vector<MemoryPoint> memory;
  };
  // What the metrics need from an iteration.
  struct Summary {
    // Node time, less the exposed communication nested in it.
    double compute_s = 0;
    // Collectives' run time plus the end-of-step exchange.
    double communication_s = 0;
    // Compute blocked on communication.
    double exposed_communication_s = 0;
    double copy_s = 0;
    // Full bytes moved, by CollectiveKind (allgather, reduce_scatter,
    // allreduce).
    std::array<int64_t, 3> collective_bytes{};
  };

  // Spans past this many in one iteration are dropped (a huge graph's trace
  // stays a few MiB); dropped() counts them.
  static constexpr size_t kMaxSpans = 50000;

  void Begin(int64_t iteration, int64_t schedule_version,
             TimelineClock::time_point now);
  // A node that ended at `end` after `seconds`.
  void AddNode(int32_t node_id, TimelineClock::time_point end, double seconds);
  void AddMemory(TimelineClock::time_point at, int64_t bytes);
  void AddCollective(const CollectiveTiming& timing,
                     const CollectiveSpans& spans);
  void AddExchange(absl::string_view label, TimelineClock::time_point start,
                   TimelineClock::time_point end);
  void AddCopy(absl::string_view label, int64_t bytes,
               TimelineClock::time_point start, TimelineClock::time_point end);
  void End(double iteration_s, int64_t peak_bytes);

  // The last complete iteration (iteration == -1 before the first).
  const Iteration& last() const { return last_; }
  int64_t dropped() const { return dropped_; }

 private:
  double Offset(TimelineClock::time_point t) const;
  void Push(Span span);

  bool open_ = false;
  TimelineClock::time_point begin_;
  Iteration current_;
  Iteration last_;
  int64_t dropped_ = 0;
};

IterationTimeline::Summary Summarize(const IterationTimeline::Iteration& it);

// The iteration as a Chrome trace (JSON object format: traceEvents with
// complete "X" events, "C" memory counters and thread names; times in
// microseconds from the earliest event), for chrome://tracing or
// ui.perfetto.dev. pid is the rank and tid the stream (1 compute,
// 2 communication, 3 copy). Each event's args carry the node id (and name
// from `graph`, when given), the collective kind, group and bytes, so the
// trace can be checked against the profile.
std::string ChromeTraceJson(const IterationTimeline::Iteration& it, int rank,
                            const Graph* graph);

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_ITERATION_TIMELINE_H_
