#include "worker/runtime/profiler.h"

#include <algorithm>
#include <string>

namespace tandem {

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
  if (iterations_ == 0) first_iteration_ = iteration;
  last_iteration_ = iteration;
  timeline_.Begin(iteration, schedule_version, TimelineClock::now());
}

void Profiler::RecordNode(int32_t node_id, double seconds) {
  if (!enabled_) return;
  Accumulator& a = nodes_[node_id];
  a.sum += seconds;
  ++a.samples;
  timeline_.AddNode(node_id, TimelineClock::now(), seconds);
}

void Profiler::RecordMemory(int32_t node_id, int64_t before_bytes,
                            int64_t after_bytes) {
  if (!enabled_) return;
  MemorySample& m = memory_[node_id];
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
  a.issue_to_done_sum += t.issue_to_done_s;
  a.run_sum += t.run_s;
  a.exposed_sum += t.exposed_s;
  ++a.samples;
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

void Profiler::EndIteration(double iteration_s, int64_t peak_bytes) {
  if (!enabled_) return;
  timeline_.End(iteration_s, peak_bytes);
  ++iterations_;
  iteration_sum_s_ += iteration_s;
  peak_bytes_ = std::max(peak_bytes_, peak_bytes);
}

Profile Profiler::Snapshot(const std::string& graph_hash, int32_t rank) const {
  Profile p;
  p.graph_hash = graph_hash;
  p.rank = rank;
  p.schedule_version = std::max<int64_t>(version_, 0);
  p.first_iteration = first_iteration_;
  p.last_iteration = last_iteration_;
  p.iteration_s = iterations_ > 0 ? iteration_sum_s_ / iterations_ : 0;
  p.peak_bytes = peak_bytes_;
  p.host_copy_bytes = host_copy_bytes_;
  p.host_copy_s = host_copy_s_;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Accumulator& a = nodes_[i];
    if (a.samples == 0) continue;
    p.nodes.push_back({static_cast<int32_t>(i), a.sum / a.samples, a.samples});
  }
  for (const auto& [key, a] : collectives_) {
    CollectiveTiming t = a.last;
    t.issue_to_done_s = a.issue_to_done_sum / a.samples;
    t.run_s = a.run_sum / a.samples;
    t.exposed_s = a.exposed_sum / a.samples;
    p.collectives.push_back(std::move(t));
  }
  for (size_t i = 0; i < memory_.size(); ++i) {
    if (has_memory_[i]) p.memory.push_back(memory_[i]);
  }
  return p;
}

void Profiler::Reset() {
  iterations_ = 0;
  iteration_sum_s_ = 0;
  peak_bytes_ = 0;
  host_copy_bytes_ = 0;
  host_copy_s_ = 0;
  std::fill(nodes_.begin(), nodes_.end(), Accumulator{});
  std::fill(memory_.begin(), memory_.end(), MemorySample{});
  std::fill(has_memory_.begin(), has_memory_.end(), false);
  collectives_.clear();
}

}  // namespace tandem
