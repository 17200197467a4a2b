#include "worker/runtime/iteration_timeline.h"

#include <chrono>
#include <string>

#include "gtest/gtest.h"
#include "worker/runtime/iteration_report.h"
#include "worker/runtime/profiler.h"

namespace tandem {
namespace {

using std::chrono::milliseconds;

// An iteration at a fixed origin: node 0 runs 0-10 ms, waits 10-12 ms for an
// all-gather that ran 4-12 ms; node 1 runs 12-20 ms; the optimizer 20-30 ms
// with a 2 ms exchange inside it.
IterationTimeline::Iteration Recorded() {
  const TimelineClock::time_point t0{milliseconds(1000)};
  IterationTimeline t;
  t.Begin(7, 2, t0);
  t.AddNode(0, t0 + milliseconds(10), 0.010);
  CollectiveTiming g;
  g.kind = CollectiveKind::kAllGather;
  g.group_id = 3;
  g.bytes = 4096;
  g.node_id = 0;
  g.issue_to_done_s = 0.009;
  g.exposed_s = 0.002;
  t.AddCollective(
      g, {t0 + milliseconds(4), t0 + milliseconds(12), t0 + milliseconds(10)});
  t.AddNode(1, t0 + milliseconds(20), 0.008);
  CollectiveTiming rs;
  rs.kind = CollectiveKind::kReduceScatter;
  rs.param_ids = {0, 1};
  rs.bytes = 1000;
  rs.node_id = 1;
  t.AddCollective(rs, {t0 + milliseconds(14), t0 + milliseconds(18),
                       t0 + milliseconds(20)});
  t.AddExchange("exchange", t0 + milliseconds(24), t0 + milliseconds(26));
  t.AddNode(2, t0 + milliseconds(30), 0.010);
  t.AddMemory(t0 + milliseconds(30), 12345);
  t.End(0.030, 99999);
  return t.last();
}

TEST(IterationTimelineTest, Summarize_SplitsComputeAndCommunication) {
  const IterationTimeline::Summary s = Summarize(Recorded());
  // 28 ms of nodes less the exchange nested in the optimizer.
  EXPECT_NEAR(s.compute_s, 0.026, 1e-9);
  // 8 + 4 ms of collectives plus the 2 ms exchange.
  EXPECT_NEAR(s.communication_s, 0.014, 1e-9);
  EXPECT_NEAR(s.exposed_communication_s, 0.004, 1e-9);
  EXPECT_EQ(s.collective_bytes[static_cast<int>(CollectiveKind::kAllGather)],
            4096);
  EXPECT_EQ(
      s.collective_bytes[static_cast<int>(CollectiveKind::kReduceScatter)],
      1000);
}

TEST(IterationTimelineTest, ChromeTrace_HasStreamsEventsAndProfileKeys) {
  Graph graph;
  for (const char* name : {"embed.fwd", "head.fwd", "optimizer"}) {
    Node n;
    n.id = static_cast<int32_t>(graph.nodes.size());
    n.name = name;
    graph.nodes.push_back(n);
  }
  const std::string json = ChromeTraceJson(Recorded(), 1, &graph);
  EXPECT_EQ(json.rfind("{\"traceEvents\":[", 0), 0u);
  for (
      const char* part : {
          R"("name":"thread_name","pid":1,"tid":1,"args":{"name":"compute"})",
          R"("args":{"name":"communication"})",
          R"("args":{"name":"copy"})",
          R"({"ph":"X","name":"embed.fwd","cat":"node","pid":1,"tid":1,"ts":0.000,"dur":10000.000,"args":{"node_id":0)",
          R"({"ph":"X","name":"wait allgather g3","cat":"wait","pid":1,"tid":1,"ts":10000.000,"dur":2000.000)",
          R"({"ph":"X","name":"allgather g3","cat":"collective","pid":1,"tid":2,"ts":4000.000,"dur":8000.000,"args":{"collective":"allgather","group_id":3,"bytes":4096,"issued_at_node":0)",
          R"("name":"reduce_scatter","cat":"collective")",
          R"({"ph":"C","name":"memory","pid":1,"tid":0,"ts":30000.000,"args":{"allocated_bytes":12345}})",
          R"("otherData":{"rank":1,"iteration":7,"schedule_version":2)",
      }) {
    EXPECT_NE(json.find(part), std::string::npos) << part << "\n" << json;
  }
}

TEST(IterationTimelineTest, EarlyCollective_ShiftsOriginToEarliestEvent) {
  const TimelineClock::time_point t0{milliseconds(1000)};
  IterationTimeline t;
  t.Begin(0, 0, t0);
  CollectiveTiming g;
  g.group_id = -1;
  t.AddCollective(g, {t0 - milliseconds(5), t0 + milliseconds(1), t0});
  t.AddNode(0, t0 + milliseconds(2), 0.002);
  t.End(0.002, 0);
  const std::string json = ChromeTraceJson(t.last(), 0, nullptr);
  EXPECT_NE(
      json.find(
          R"("name":"allgather persistent","cat":"collective","pid":0,"tid":2,"ts":0.000,"dur":6000.000)"),
      std::string::npos)
      << json;
  EXPECT_NE(
      json.find(
          R"("name":"node 0","cat":"node","pid":0,"tid":1,"ts":5000.000)"),
      std::string::npos)
      << json;
}

TEST(IterationTimelineTest, Profiler_KeepsLastIterationAcrossReset) {
  Profiler p(true, 2);
  p.BeginIteration(3, 1);
  p.RecordNode(0, 0.001);
  p.RecordExchange("exchange", TimelineClock::now(), TimelineClock::now());
  p.EndIteration(0.002, 10);
  p.Reset();
  const IterationTimeline::Iteration& last = p.timeline().last();
  EXPECT_EQ(last.iteration, 3);
  EXPECT_EQ(last.schedule_version, 1);
  ASSERT_EQ(last.spans.size(), 2u);
  EXPECT_EQ(last.spans[0].node_id, 0);
  EXPECT_DOUBLE_EQ(last.spans[0].duration_s, 0.001);
}

TEST(IterationTimelineTest, Profiler_Disabled_RecordsNoTimeline) {
  Profiler p(false, 2);
  p.BeginIteration(0, 1);
  p.RecordNode(0, 1.0);
  p.EndIteration(1, 1);
  EXPECT_EQ(p.timeline().last().iteration, -1);
}

TEST(IterationReportTest, OverlapRatio_IsHiddenShareOfCommunication) {
  IterationReport r;
  EXPECT_DOUBLE_EQ(r.overlap_ratio(), 1);
  r.communication_s = 0.4;
  r.exposed_communication_s = 0.1;
  EXPECT_DOUBLE_EQ(r.overlap_ratio(), 0.75);
  r.exposed_communication_s = 0.9;  // skew at the exchange: clamped
  EXPECT_DOUBLE_EQ(r.overlap_ratio(), 0);
}

TEST(ScheduleFootprintTest, GatheredPeak_CountsGroupsInFlightAndPersistent) {
  Graph graph;
  for (int i = 0; i < 3; ++i) {
    Param p;
    p.id = i;
    p.name = "p" + std::to_string(i);
    p.shape = {100 * (i + 1)};  // 400, 800, 1200 bytes
    graph.params.push_back(p);
  }
  Schedule s;
  s.persistent_param_ids = {2};
  s.groups = {{0, {0}}, {1, {1}}};
  auto action = [](ActionKind kind, int32_t node, AnchorPosition pos,
                   int32_t group) {
    Action a;
    a.kind = kind;
    a.node_id = node;
    a.position = pos;
    a.group_id = group;
    return a;
  };
  // Listed out of order: the footprint orders by node, before first.
  s.actions = {action(ActionKind::kRelease, 1, AnchorPosition::kAfter, 0),
               action(ActionKind::kAllGather, 0, AnchorPosition::kBefore, 0),
               action(ActionKind::kAllGather, 1, AnchorPosition::kBefore, 1),
               action(ActionKind::kRelease, 2, AnchorPosition::kAfter, 1)};
  const ScheduleFootprint f = ComputeScheduleFootprint(graph, s);
  EXPECT_EQ(f.persistent_bytes, 1200);
  EXPECT_EQ(f.peak_gathered_bytes, 400 + 800 + 1200);
  EXPECT_EQ(f.peak_offloaded_bytes, 0);
}

}  // namespace
}  // namespace tandem
