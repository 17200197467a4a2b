#include "worker/runtime/profiler.h"

#include <chrono>

#include "common/ir/text_format.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ProfilerTest, Snapshot_TwoIterations_MiddleOfBoth) {
  Profiler p(true, 3);
  p.SetCollectiveScratch({1, 4096}, {2, 8192});
  for (int it = 0; it < 2; ++it) {
    p.BeginIteration(10 + it, 1);
    p.RecordNode(0, it == 0 ? 1.0 : 3.0);
    // The node's own memory: the window keeps the most of each figure.
    p.RecordMemory(1, 100 * (it + 1), 200,
                   {it == 0 ? 50 : 70, it == 0 ? -30 : -10, true});
    p.RecordCollective({CollectiveKind::kAllGather, 4, {}, 64, 0.5, 0.1, 0});
    p.EndIteration(2.0 + it, 1000 * (it + 1), it == 0 ? 96 : 160);
  }
  const Profile s = p.Snapshot("abc", 1);
  EXPECT_DOUBLE_EQ(s.work, 128);
  EXPECT_EQ(s.first_iteration, 10);
  EXPECT_EQ(s.last_iteration, 11);
  EXPECT_EQ(s.schedule_version, 1);
  EXPECT_DOUBLE_EQ(s.iteration_s, 2.5);
  EXPECT_EQ(s.peak_bytes, 2000);
  ASSERT_EQ(s.nodes.size(), 1u);
  EXPECT_DOUBLE_EQ(s.nodes[0].time_s, 2.0);
  EXPECT_EQ(s.nodes[0].samples, 2);
  ASSERT_EQ(s.collectives.size(), 1u);
  EXPECT_DOUBLE_EQ(s.collectives[0].issue_to_done_s, 0.5);
  ASSERT_EQ(s.memory.size(), 1u);
  EXPECT_EQ(s.memory[0].before_bytes, 200);
  EXPECT_EQ(s.memory[0].rise_bytes, 70);
  EXPECT_EQ(s.memory[0].net_bytes, -10);
  EXPECT_EQ(s.allgather_scratch, (CollectiveScratch{1, 4096}));
  EXPECT_EQ(s.reduce_scatter_scratch, (CollectiveScratch{2, 8192}));
  // The text form round-trips.
  auto parsed = ParseProfile(PrintProfile(s));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, s);
}

// A step slowed by something else on the machine does not move the
// window's figures: they are medians, with the median iteration's work.
TEST(ProfilerTest, Snapshot_OneDisturbedStep_MediansIgnoreIt) {
  Profiler p(true, 2);
  const double node[] = {1.0, 1.1, 5.0, 0.9};
  const double wait[] = {0.2, 0.3, 2.0, 0.25};
  const double iteration[] = {2.0, 2.2, 9.0, 2.1};
  const int64_t work[] = {100, 120, 500, 110};
  for (int it = 0; it < 4; ++it) {
    p.BeginIteration(it, 0);
    p.RecordNode(0, node[it]);
    p.RecordCollective(
        {CollectiveKind::kAllGather, 4, {}, 64, wait[it], wait[it] / 2, 0});
    p.EndIteration(iteration[it], 1000, work[it]);
  }
  const Profile s = p.Snapshot("abc", 0);
  EXPECT_DOUBLE_EQ(s.iteration_s, (2.1 + 2.2) / 2);
  EXPECT_DOUBLE_EQ(s.work, (110 + 120) / 2.0);
  ASSERT_EQ(s.nodes.size(), 1u);
  EXPECT_DOUBLE_EQ(s.nodes[0].time_s, (1.0 + 1.1) / 2);
  EXPECT_EQ(s.nodes[0].samples, 4);
  ASSERT_EQ(s.collectives.size(), 1u);
  EXPECT_DOUBLE_EQ(s.collectives[0].issue_to_done_s, (0.25 + 0.3) / 2);
  EXPECT_DOUBLE_EQ(s.collectives[0].exposed_s, (0.125 + 0.15) / 2);
  // An odd count: the middle one.
  p.BeginIteration(4, 0);
  p.RecordNode(0, 1.05);
  p.EndIteration(2.15, 1000, 115);
  const Profile odd = p.Snapshot("abc", 0);
  EXPECT_DOUBLE_EQ(odd.iteration_s, 2.15);
  EXPECT_DOUBLE_EQ(odd.work, 115);
  EXPECT_DOUBLE_EQ(odd.nodes[0].time_s, 1.05);
}

TEST(ProfilerTest, NodeOverlaps_ProrateTransfersOverNodeSpans) {
  using Span = IterationTimeline::Span;
  using Kind = IterationTimeline::SpanKind;
  auto node = [](int32_t id, double start, double duration) {
    Span s;
    s.kind = Kind::kNode;
    s.node_id = id;
    s.start_s = start;
    s.duration_s = duration;
    return s;
  };
  auto transfer = [](Kind kind, CollectiveKind collective, double start,
                     double duration, int64_t bytes) {
    Span s;
    s.kind = kind;
    s.stream = kind == Kind::kCopy ? IterationTimeline::Stream::kCopy
                                   : IterationTimeline::Stream::kCommunication;
    s.collective = collective;
    s.start_s = start;
    s.duration_s = duration;
    s.bytes = bytes;
    return s;
  };
  IterationTimeline::Iteration it;
  // n0 [0,2), n1 [2,6); an all-gather of 1000 B over [1,3) (half in each),
  // a reduce-scatter of 400 B over [3,5) (inside n1), a copy of 900 B over
  // [1.5,4.5) (1/6 in n0, 5/6 in n1), a collective after both (nothing).
  it.spans = {
      node(1, 2, 4),
      transfer(Kind::kCollective, CollectiveKind::kAllGather, 1, 2, 1000),
      node(0, 0, 2),
      transfer(Kind::kCollective, CollectiveKind::kReduceScatter, 3, 2, 400),
      transfer(Kind::kCopy, CollectiveKind::kAllGather, 1.5, 3, 900),
      transfer(Kind::kCollective, CollectiveKind::kAllGather, 7, 1, 5000),
  };
  const std::vector<NodeOverlap> o = NodeOverlaps(it);
  ASSERT_EQ(o.size(), 2u);
  EXPECT_EQ(o[0].node_id, 0);
  EXPECT_DOUBLE_EQ(o[0].allgather_bytes, 500);
  EXPECT_DOUBLE_EQ(o[0].reduce_scatter_bytes, 0);
  EXPECT_DOUBLE_EQ(o[0].copy_bytes, 150);
  EXPECT_EQ(o[1].node_id, 1);
  EXPECT_DOUBLE_EQ(o[1].allgather_bytes, 500);
  EXPECT_DOUBLE_EQ(o[1].reduce_scatter_bytes, 400);
  EXPECT_DOUBLE_EQ(o[1].copy_bytes, 750);
}

TEST(ProfilerTest, Interference_ReportedInSnapshotsAcrossWindows) {
  Profiler p(true, 1);
  p.SetInterference(1e-9, 2e-9, 3e-10);
  p.BeginIteration(0, 1);
  p.RecordNode(0, 0.5);
  p.EndIteration(1, 1);
  p.Reset();
  const Profile s = p.Snapshot("h", 0);
  EXPECT_DOUBLE_EQ(s.compute_s_per_allgather_byte, 1e-9);
  EXPECT_DOUBLE_EQ(s.compute_s_per_reduce_scatter_byte, 2e-9);
  EXPECT_DOUBLE_EQ(s.compute_s_per_copy_byte, 3e-10);
  auto parsed = ParseProfile(PrintProfile(s));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, s);
}

// The part of a collective's run the compute thread spent in nodes, and the
// probe's stretches, reach the snapshot (and its text form).
TEST(ProfilerTest, Collectives_ComputingPartOfTheirRunReported) {
  using std::chrono::milliseconds;
  Profiler p(true, 2);
  p.SetStretch(1.8, 1.5, 1.2);
  p.BeginIteration(0, 1);
  const TimelineClock::time_point now = TimelineClock::now();
  p.RecordNode(0, 0.010);  // [now - 10 ms, now] (a little later)
  CollectiveTiming under{CollectiveKind::kAllGather, 1, {}, 64, 0.012, 0, 0};
  under.run_s = 0.010;
  // From 5 ms before the node ended to 5 ms after: half under it.
  p.RecordCollective(under, {now - milliseconds(5), now + milliseconds(5),
                             now + milliseconds(5)});
  // Spans unknown: nothing is said to have computed alongside.
  CollectiveTiming unknown{CollectiveKind::kAllGather, 2, {}, 64, 0.01, 0, 0};
  unknown.run_s = 0.004;
  p.RecordCollective(unknown);
  p.EndIteration(0.02, 100);
  const Profile s = p.Snapshot("h", 0);
  ASSERT_EQ(s.collectives.size(), 2u);
  const CollectiveTiming& a =
      s.collectives[0].group_id == 1 ? s.collectives[0] : s.collectives[1];
  const CollectiveTiming& b =
      s.collectives[0].group_id == 1 ? s.collectives[1] : s.collectives[0];
  EXPECT_NEAR(a.computing_s, 0.005, 0.002);
  EXPECT_DOUBLE_EQ(b.computing_s, 0);
  EXPECT_DOUBLE_EQ(s.allgather_stretch, 1.8);
  EXPECT_DOUBLE_EQ(s.reduce_scatter_stretch, 1.5);
  EXPECT_DOUBLE_EQ(s.copy_stretch, 1.2);
  auto parsed = ParseProfile(PrintProfile(s));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, s);
}

TEST(ProfilerTest, HostCopies_SummedPerWindow) {
  Profiler p(true, 2);
  const TimelineClock::time_point t0 = TimelineClock::now();
  p.BeginIteration(0, 1);
  p.RecordCopy("offload o0", 1000, t0, t0 + std::chrono::milliseconds(2));
  p.RecordCopy("reload o0", 3000, t0 + std::chrono::milliseconds(5),
               t0 + std::chrono::milliseconds(11));
  p.EndIteration(0.1, 10);
  Profile s = p.Snapshot("h", 0);
  EXPECT_EQ(s.host_copy_bytes, 4000);
  EXPECT_NEAR(s.host_copy_s, 0.008, 1e-9);
  p.Reset();
  p.BeginIteration(1, 1);
  p.EndIteration(0.1, 10);
  s = p.Snapshot("h", 0);
  EXPECT_EQ(s.host_copy_bytes, 0);
  EXPECT_EQ(s.host_copy_s, 0);
}

TEST(ProfilerTest, NewScheduleVersion_StartsNewWindow) {
  Profiler p(true, 2);
  p.BeginIteration(0, 1);
  p.RecordNode(0, 1.0);
  p.EndIteration(1, 1);
  p.BeginIteration(1, 2);
  p.RecordNode(1, 1.0);
  p.EndIteration(1, 1);
  const Profile s = p.Snapshot("h", 0);
  EXPECT_EQ(s.schedule_version, 2);
  EXPECT_EQ(s.first_iteration, 1);
  ASSERT_EQ(s.nodes.size(), 1u);
  EXPECT_EQ(s.nodes[0].node_id, 1);
}

TEST(ProfilerTest, Disabled_RecordsNothing) {
  Profiler p(false, 2);
  p.BeginIteration(0, 1);
  p.RecordNode(0, 1.0);
  p.EndIteration(1, 1);
  EXPECT_TRUE(p.Snapshot("h", 0).nodes.empty());
  EXPECT_EQ(p.iterations(), 0);
}

}  // namespace
}  // namespace tandem
