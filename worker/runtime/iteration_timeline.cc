#include "worker/runtime/iteration_timeline.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json_string.h"

namespace tandem {
namespace {

// Microseconds with nanosecond resolution.
std::string Micros(double seconds) {
  return absl::StrFormat("%.3f", seconds * 1e6);
}

absl::string_view StreamName(IterationTimeline::Stream stream) {
  switch (stream) {
    case IterationTimeline::Stream::kCompute:
      return "compute";
    case IterationTimeline::Stream::kCommunication:
      return "communication";
    case IterationTimeline::Stream::kCopy:
      return "copy";
  }
  return "compute";
}

absl::string_view KindCategory(IterationTimeline::SpanKind kind) {
  switch (kind) {
    case IterationTimeline::SpanKind::kNode:
      return "node";
    case IterationTimeline::SpanKind::kWait:
      return "wait";
    case IterationTimeline::SpanKind::kExchange:
      return "exchange";
    case IterationTimeline::SpanKind::kCollective:
      return "collective";
    case IterationTimeline::SpanKind::kCopy:
      return "copy";
  }
  return "node";
}

std::string CollectiveLabel(const IterationTimeline::Span& s) {
  std::string name(CollectiveKindName(s.collective));
  if (s.collective == CollectiveKind::kAllGather) {
    absl::StrAppend(
        &name, s.group_id < 0 ? " persistent" : absl::StrCat(" g", s.group_id));
  }
  return name;
}

}  // namespace

void IterationTimeline::Begin(int64_t iteration, int64_t schedule_version,
                              TimelineClock::time_point now) {
  open_ = true;
  begin_ = now;
  current_ = Iteration();
  current_.iteration = iteration;
  current_.schedule_version = schedule_version;
}

double IterationTimeline::Offset(TimelineClock::time_point t) const {
  return std::chrono::duration<double>(t - begin_).count();
}

void IterationTimeline::Push(Span span) {
  if (current_.spans.size() >= kMaxSpans) {
    ++dropped_;
    return;
  }
  current_.spans.push_back(std::move(span));
}

void IterationTimeline::AddNode(int32_t node_id, TimelineClock::time_point end,
                                double seconds) {
  if (!open_) return;
  Span s;
  s.kind = SpanKind::kNode;
  s.stream = Stream::kCompute;
  s.node_id = node_id;
  s.duration_s = seconds;
  s.start_s = Offset(end) - seconds;
  Push(std::move(s));
}

void IterationTimeline::AddMemory(TimelineClock::time_point at, int64_t bytes) {
  if (!open_ || current_.memory.size() >= kMaxSpans) return;
  current_.memory.push_back({Offset(at), bytes});
}

void IterationTimeline::AddCollective(const CollectiveTiming& timing,
                                      const CollectiveSpans& spans) {
  if (!open_ || spans.started == TimelineClock::time_point()) return;
  Span c;
  c.stream = Stream::kCommunication;
  c.kind = SpanKind::kCollective;
  c.node_id = timing.node_id;
  c.collective = timing.kind;
  c.group_id = timing.group_id;
  c.bytes = timing.bytes;
  c.issue_to_done_s = timing.issue_to_done_s;
  c.exposed_s = timing.exposed_s;
  c.start_s = Offset(spans.started);
  c.duration_s =
      std::chrono::duration<double>(spans.finished - spans.started).count();
  if (timing.exposed_s > 0) {
    Span w = c;
    w.stream = Stream::kCompute;
    w.kind = SpanKind::kWait;
    w.start_s = Offset(spans.wait_start);
    w.duration_s = timing.exposed_s;
    Push(std::move(w));
  }
  Push(std::move(c));
}

void IterationTimeline::AddExchange(absl::string_view label,
                                    TimelineClock::time_point start,
                                    TimelineClock::time_point end) {
  if (!open_) return;
  Span s;
  s.stream = Stream::kCompute;
  s.kind = SpanKind::kExchange;
  s.label = std::string(label);
  s.start_s = Offset(start);
  s.duration_s = std::chrono::duration<double>(end - start).count();
  Push(std::move(s));
}

void IterationTimeline::AddCopy(absl::string_view label, int64_t bytes,
                                TimelineClock::time_point start,
                                TimelineClock::time_point end) {
  if (!open_) return;
  Span s;
  s.stream = Stream::kCopy;
  s.kind = SpanKind::kCopy;
  s.label = std::string(label);
  s.bytes = bytes;
  s.start_s = Offset(start);
  s.duration_s = std::chrono::duration<double>(end - start).count();
  Push(std::move(s));
}

void IterationTimeline::End(double iteration_s, int64_t peak_bytes) {
  if (!open_) return;
  open_ = false;
  current_.iteration_s = iteration_s;
  current_.peak_bytes = peak_bytes;
  last_ = std::move(current_);
  current_ = Iteration();
}

IterationTimeline::Summary Summarize(const IterationTimeline::Iteration& it) {
  using Kind = IterationTimeline::SpanKind;
  IterationTimeline::Summary sum;
  std::vector<std::pair<double, double>> nodes;  // [start, end)
  for (const IterationTimeline::Span& s : it.spans) {
    switch (s.kind) {
      case Kind::kNode:
        sum.compute_s += s.duration_s;
        nodes.emplace_back(s.start_s, s.start_s + s.duration_s);
        break;
      case Kind::kWait:
        sum.exposed_communication_s += s.duration_s;
        break;
      case Kind::kExchange:
        sum.exposed_communication_s += s.duration_s;
        sum.communication_s += s.duration_s;
        break;
      case Kind::kCollective:
        sum.communication_s += s.duration_s;
        sum.collective_bytes[static_cast<int>(s.collective)] += s.bytes;
        break;
      case Kind::kCopy:
        sum.copy_s += s.duration_s;
        break;
    }
  }
  // Waits inside a node's span (the exchange runs inside the optimizer
  // node) are not compute.
  std::sort(nodes.begin(), nodes.end());
  for (const IterationTimeline::Span& s : it.spans) {
    if (s.kind != Kind::kWait && s.kind != Kind::kExchange) continue;
    auto after = std::upper_bound(
        nodes.begin(), nodes.end(),
        std::make_pair(s.start_s, std::numeric_limits<double>::infinity()));
    if (after == nodes.begin()) continue;
    const auto& node = *std::prev(after);
    if (s.start_s + s.duration_s <= node.second + 1e-9) {
      sum.compute_s -= s.duration_s;
    }
  }
  sum.compute_s = std::max(0.0, sum.compute_s);
  return sum;
}

std::string ChromeTraceJson(const IterationTimeline::Iteration& it, int rank,
                            const Graph* graph) {
  using Kind = IterationTimeline::SpanKind;
  double origin = 0;
  for (const IterationTimeline::Span& s : it.spans) {
    origin = std::min(origin, s.start_s);
  }
  std::string out = "{\"traceEvents\":[\n";
  absl::StrAppend(
      &out, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":", rank,
      ",\"tid\":0,\"args\":{\"name\":", JsonString(absl::StrCat("rank ", rank)),
      "}}");
  absl::StrAppend(&out,
                  ",\n{\"ph\":\"M\",\"name\":\"process_sort_index\","
                  "\"pid\":",
                  rank, ",\"tid\":0,\"args\":{\"sort_index\":", rank, "}}");
  for (auto stream : {IterationTimeline::Stream::kCompute,
                      IterationTimeline::Stream::kCommunication,
                      IterationTimeline::Stream::kCopy}) {
    absl::StrAppend(
        &out, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":", rank,
        ",\"tid\":", static_cast<int>(stream),
        ",\"args\":{\"name\":", JsonString(StreamName(stream)), "}}");
  }
  for (const IterationTimeline::Span& s : it.spans) {
    std::string name;
    std::string args;
    switch (s.kind) {
      case Kind::kNode: {
        const bool named = graph != nullptr && s.node_id >= 0 &&
                           s.node_id < static_cast<int>(graph->nodes.size());
        name = named ? graph->nodes[s.node_id].name
                     : absl::StrCat("node ", s.node_id);
        absl::StrAppend(&args, "\"node_id\":", s.node_id);
        if (named) {
          absl::StrAppend(&args, ",\"phase\":",
                          JsonString(PhaseName(graph->nodes[s.node_id].phase)));
        }
        break;
      }
      case Kind::kWait:
      case Kind::kCollective:
        name = s.kind == Kind::kWait ? absl::StrCat("wait ", CollectiveLabel(s))
                                     : CollectiveLabel(s);
        absl::StrAppend(&args, "\"collective\":",
                        JsonString(CollectiveKindName(s.collective)),
                        ",\"group_id\":", s.group_id, ",\"bytes\":", s.bytes,
                        ",\"issued_at_node\":", s.node_id);
        if (s.kind == Kind::kCollective) {
          absl::StrAppend(
              &args, ",\"issue_to_done_s\":",
              absl::StrFormat("%.9g", s.issue_to_done_s),
              ",\"exposed_s\":", absl::StrFormat("%.9g", s.exposed_s));
        }
        break;
      case Kind::kExchange:
        name = s.label;
        break;
      case Kind::kCopy:
        name = s.label;
        absl::StrAppend(&args, "\"bytes\":", s.bytes);
        break;
    }
    absl::StrAppend(&out, ",\n{\"ph\":\"X\",\"name\":", JsonString(name),
                    ",\"cat\":", JsonString(KindCategory(s.kind)),
                    ",\"pid\":", rank, ",\"tid\":", static_cast<int>(s.stream),
                    ",\"ts\":", Micros(s.start_s - origin),
                    ",\"dur\":", Micros(s.duration_s), ",\"args\":{", args,
                    "}}");
  }
  for (const IterationTimeline::MemoryPoint& m : it.memory) {
    absl::StrAppend(&out, ",\n{\"ph\":\"C\",\"name\":\"memory\",\"pid\":", rank,
                    ",\"tid\":0,\"ts\":", Micros(m.time_s - origin),
                    ",\"args\":{\"allocated_bytes\":", m.bytes, "}}");
  }
  absl::StrAppend(
      &out, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"rank\":", rank,
      ",\"iteration\":", it.iteration,
      ",\"schedule_version\":", it.schedule_version,
      ",\"iteration_s\":", absl::StrFormat("%.9g", it.iteration_s),
      ",\"peak_bytes\":", it.peak_bytes, ",\"origin_us\":", Micros(origin),
      "}}\n");
  return out;
}

}  // namespace tandem
