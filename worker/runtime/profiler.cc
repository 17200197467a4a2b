#include "worker/runtime/profiler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace tandem {
namespace {

// The middle value; the mean of the middle two of an even count. `v` is
// not empty.
double Median(std::vector<double> v) {
  const size_t n = v.size();
  std::nth_element(v.begin(), v.begin() + n / 2, v.end());
  const double hi = v[n / 2];
  if (n % 2 == 1) return hi;
  return (*std::max_element(v.begin(), v.begin() + n / 2) + hi) / 2;
}

}  // namespace

Profiler::Profiler(bool enabled, int num_nodes)
    : enabled_(enabled),
      nodes_(num_nodes),
      memory_(num_nodes),
      has_memory_(num_nodes, false) {}

void Profiler::BeginIteration(int64_t iteration, int64_t schedule_version) {
  if (!enabled_) return;
  if (schedule_version != version_) {
    Reset();
    version_ = schedule_version;
  }
  if (iterations_.empty()) first_iteration_ = iteration;
  last_iteration_ = iteration;
  pending_runs_.clear();
  node_spans_.clear();
  timeline_.Begin(iteration, schedule_version, TimelineClock::now());
}

void Profiler::RecordNode(int32_t node_id, double seconds) {
  if (!enabled_) return;
  nodes_[node_id].times.push_back(seconds);
  const TimelineClock::time_point now = TimelineClock::now();
  node_spans_.emplace_back(
      now - std::chrono::duration_cast<TimelineClock::duration>(
                std::chrono::duration<double>(seconds)),
      now);
  timeline_.AddNode(node_id, now, seconds);
}

void Profiler::RecordMemory(int32_t node_id, int64_t before_bytes,
                            int64_t after_bytes, const OwnMemory& own) {
  if (!enabled_) return;
  MemorySample& m = memory_[node_id];
  if (own.measured) {
    m.rise_bytes = std::max(m.rise_bytes, own.rise_bytes);
    m.net_bytes = has_memory_[node_id] ? std::max(m.net_bytes, own.net_bytes)
                                       : own.net_bytes;
  }
  m.node_id = node_id;
  m.before_bytes = std::max(m.before_bytes, before_bytes);
  m.after_bytes = std::max(m.after_bytes, after_bytes);
  has_memory_[node_id] = true;
  timeline_.AddMemory(TimelineClock::now(), after_bytes);
}

void Profiler::RecordCollective(const CollectiveTiming& t,
                                const CollectiveSpans& spans) {
  if (!enabled_) return;
  timeline_.AddCollective(t, spans);
  CollectiveAccumulator& a = collectives_[CollectiveKey{
      static_cast<int>(t.kind), t.node_id, t.group_id, t.param_ids}];
  a.last = t;
  a.issue_to_done.push_back(t.issue_to_done_s);
  a.run.push_back(t.run_s);
  a.exposed.push_back(t.exposed_s);
  if (spans.started != TimelineClock::time_point{} &&
      spans.finished > spans.started) {
    pending_runs_.push_back({&a, spans.started, spans.finished});
  } else {
    a.computing.push_back(0);
  }
}

void Profiler::RecordExchange(absl::string_view label,
                              TimelineClock::time_point start,
                              TimelineClock::time_point end) {
  if (!enabled_) return;
  timeline_.AddExchange(label, start, end);
}

void Profiler::RecordCopy(absl::string_view label, int64_t bytes,
                          TimelineClock::time_point start,
                          TimelineClock::time_point end) {
  if (!enabled_) return;
  timeline_.AddCopy(label, bytes, start, end);
  host_copy_bytes_ += bytes;
  host_copy_s_ += std::chrono::duration<double>(end - start).count();
}

void Profiler::EndIteration(double iteration_s, int64_t peak_bytes,
                            int64_t work) {
  if (!enabled_) return;
  timeline_.End(iteration_s, peak_bytes);
  AccumulateOverlaps(timeline_.last());
  // Node spans are disjoint and in order (one compute thread).
  for (const PendingRun& run : pending_runs_) {
    double computing = 0;
    for (const auto& [start, end] : node_spans_) {
      const auto both =
          std::min(end, run.finished) - std::max(start, run.started);
      if (both > TimelineClock::duration::zero()) {
        computing += std::chrono::duration<double>(both).count();
      }
    }
    run.accumulator->computing.push_back(computing);
  }
  pending_runs_.clear();
  node_spans_.clear();
  iterations_.emplace_back(iteration_s, work);
  peak_bytes_ = std::max(peak_bytes_, peak_bytes);
  peak_min_bytes_ =
      peak_min_bytes_ > 0 ? std::min(peak_min_bytes_, peak_bytes) : peak_bytes;
}

void Profiler::SetInterference(double per_allgather_byte,
                               double per_reduce_scatter_byte,
                               double per_copy_byte) {
  per_allgather_byte_ = per_allgather_byte;
  per_reduce_scatter_byte_ = per_reduce_scatter_byte;
  per_copy_byte_ = per_copy_byte;
}

void Profiler::SetStretch(double allgather, double reduce_scatter,
                          double copy) {
  allgather_stretch_ = allgather;
  reduce_scatter_stretch_ = reduce_scatter;
  copy_stretch_ = copy;
}

std::vector<NodeOverlap> NodeOverlaps(const IterationTimeline::Iteration& it) {
  using Kind = IterationTimeline::SpanKind;
  // Transfers of one stream run one at a time, so sorted by start their
  // ends increase too, and one cursor per stream skips those already over.
  std::vector<const IterationTimeline::Span*> comm;
  std::vector<const IterationTimeline::Span*> copies;
  std::vector<const IterationTimeline::Span*> nodes;
  for (const IterationTimeline::Span& s : it.spans) {
    if (s.kind == Kind::kNode) {
      nodes.push_back(&s);
    } else if (s.duration_s > 0 && s.bytes > 0) {
      if (s.kind == Kind::kCollective) comm.push_back(&s);
      if (s.kind == Kind::kCopy) copies.push_back(&s);
    }
  }
  auto by_start = [](const IterationTimeline::Span* a,
                     const IterationTimeline::Span* b) {
    return a->start_s < b->start_s;
  };
  std::sort(comm.begin(), comm.end(), by_start);
  std::sort(copies.begin(), copies.end(), by_start);
  std::sort(nodes.begin(), nodes.end(), by_start);
  // Bytes of the transfers in `stream` that moved during [start, end):
  // calls `add(span, bytes)` for each.
  auto overlap = [](const std::vector<const IterationTimeline::Span*>& stream,
                    size_t* cursor, double start, double end, auto add) {
    while (*cursor < stream.size() &&
           stream[*cursor]->start_s + stream[*cursor]->duration_s <= start) {
      ++*cursor;
    }
    for (size_t i = *cursor; i < stream.size() && stream[i]->start_s < end;
         ++i) {
      const IterationTimeline::Span& t = *stream[i];
      const double both =
          std::min(end, t.start_s + t.duration_s) - std::max(start, t.start_s);
      if (both > 0) {
        add(t, static_cast<double>(t.bytes) * both / t.duration_s);
      }
    }
  };
  std::vector<NodeOverlap> out;
  out.reserve(nodes.size());
  size_t comm_cursor = 0;
  size_t copy_cursor = 0;
  for (const IterationTimeline::Span* n : nodes) {
    NodeOverlap& a = out.emplace_back();
    a.node_id = n->node_id;
    const double end = n->start_s + n->duration_s;
    overlap(comm, &comm_cursor, n->start_s, end,
            [&a](const IterationTimeline::Span& t, double bytes) {
              (t.collective == CollectiveKind::kAllGather
                   ? a.allgather_bytes
                   : a.reduce_scatter_bytes) += bytes;
            });
    overlap(copies, &copy_cursor, n->start_s, end,
            [&a](const IterationTimeline::Span&, double bytes) {
              a.copy_bytes += bytes;
            });
  }
  return out;
}

void Profiler::AccumulateOverlaps(const IterationTimeline::Iteration& it) {
  for (const NodeOverlap& o : NodeOverlaps(it)) {
    if (o.node_id < 0 || static_cast<size_t>(o.node_id) >= nodes_.size()) {
      continue;
    }
    Accumulator& a = nodes_[o.node_id];
    a.allgather_overlap += o.allgather_bytes;
    a.reduce_scatter_overlap += o.reduce_scatter_bytes;
    a.copy_overlap += o.copy_bytes;
  }
}

void Profiler::SetProbedHostCopy(int64_t bytes, double seconds) {
  probed_copy_bytes_ = bytes;
  probed_copy_s_ = seconds;
}

Profile Profiler::Snapshot(const std::string& graph_hash, int32_t rank) const {
  Profile p;
  p.graph_hash = graph_hash;
  p.rank = rank;
  p.schedule_version = version_ == kNoVersion ? 0 : version_;
  p.first_iteration = first_iteration_;
  p.last_iteration = last_iteration_;
  if (!iterations_.empty()) {
    // The median iteration (the mean of the middle two of an even count),
    // and its work.
    std::vector<std::pair<double, int64_t>> sorted = iterations_;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const auto& hi = sorted[n / 2];
    const auto& lo = sorted[(n - 1) / 2];
    p.iteration_s = (lo.first + hi.first) / 2;
    p.work = (static_cast<double>(lo.second) + hi.second) / 2;
  }
  p.peak_bytes = peak_bytes_;
  p.peak_min_bytes = peak_min_bytes_;
  p.host_copy_bytes = host_copy_bytes_;
  p.host_copy_s = host_copy_s_;
  if (host_copy_bytes_ == 0 && probed_copy_bytes_ > 0 && probed_copy_s_ > 0) {
    p.host_copy_bytes = probed_copy_bytes_;
    p.host_copy_s = probed_copy_s_;
  }
  p.compute_s_per_allgather_byte = per_allgather_byte_;
  p.compute_s_per_reduce_scatter_byte = per_reduce_scatter_byte_;
  p.compute_s_per_copy_byte = per_copy_byte_;
  p.allgather_stretch = allgather_stretch_;
  p.reduce_scatter_stretch = reduce_scatter_stretch_;
  p.copy_stretch = copy_stretch_;
  p.allgather_scratch = allgather_scratch_;
  p.reduce_scatter_scratch = reduce_scatter_scratch_;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Accumulator& a = nodes_[i];
    if (a.times.empty()) continue;
    const int32_t samples = static_cast<int32_t>(a.times.size());
    auto mean = [samples](double sum) {
      return static_cast<int64_t>(std::llround(sum / samples));
    };
    p.nodes.push_back({static_cast<int32_t>(i), Median(a.times), samples,
                       mean(a.allgather_overlap),
                       mean(a.reduce_scatter_overlap), mean(a.copy_overlap)});
  }
  for (const auto& [key, a] : collectives_) {
    CollectiveTiming t = a.last;
    t.issue_to_done_s = Median(a.issue_to_done);
    t.run_s = Median(a.run);
    t.exposed_s = Median(a.exposed);
    // The run's median sample when each has its computing part; a window
    // cut mid-iteration has fewer, and then the median of those.
    if (a.computing.size() == a.run.size()) {
      std::vector<size_t> order(a.run.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::sort(order.begin(), order.end(),
                [&a](size_t x, size_t y) { return a.run[x] < a.run[y]; });
      t.computing_s = std::min(a.computing[order[order.size() / 2]], t.run_s);
    } else if (!a.computing.empty()) {
      t.computing_s = std::min(Median(a.computing), t.run_s);
    }
    p.collectives.push_back(std::move(t));
  }
  for (size_t i = 0; i < memory_.size(); ++i) {
    if (has_memory_[i]) p.memory.push_back(memory_[i]);
  }
  return p;
}

void Profiler::Reset() {
  iterations_.clear();
  peak_bytes_ = 0;
  peak_min_bytes_ = 0;
  host_copy_bytes_ = 0;
  host_copy_s_ = 0;
  std::fill(nodes_.begin(), nodes_.end(), Accumulator{});
  std::fill(memory_.begin(), memory_.end(), MemorySample{});
  std::fill(has_memory_.begin(), has_memory_.end(), false);
  collectives_.clear();
  pending_runs_.clear();  // they point into collectives_
}

}  // namespace tandem
