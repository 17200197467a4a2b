#include "worker/runtime/profiler.h"

#include "common/ir/text_format.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ProfilerTest, Snapshot_AveragesOverWindow) {
  Profiler p(true, 3);
  for (int it = 0; it < 2; ++it) {
    p.BeginIteration(10 + it, 1);
    p.RecordNode(0, it == 0 ? 1.0 : 3.0);
    p.RecordMemory(1, 100 * (it + 1), 200);
    p.RecordCollective({CollectiveKind::kAllGather, 4, {}, 64, 0.5, 0.1, 0});
    p.EndIteration(2.0 + it, 1000 * (it + 1));
  }
  const Profile s = p.Snapshot("abc", 1);
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
  // The text form round-trips.
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
