// Simulator tests on hand-timed graphs. The two-layer fixtures
// (tests/testdata/sim_two_layer_*.txt) run on TestHardware(): a gather or
// reduce-scatter of one param takes 1 ms and moving one param's optimizer
// states to or from the host 2 ms, so every expected time and byte below is
// worked out by hand in the comments.
#include "common/sim/simulator.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/ir/graph.h"
#include "common/ir/schedule.h"
#include "common/ir/text_format.h"
#include "common/ir/validate.h"
#include "common/sim/hardware_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// Times are sums of a few milliseconds; 1 ps absorbs rounding only.
constexpr double kTolerance = 1e-12;
constexpr double kMs = 1e-3;

std::string ReadTestdata(const std::string& name) {
  const std::string path = absl::StrCat(TANDEM_TESTDATA_DIR, "/", name);
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file.good()) << "cannot open " << path;
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

Graph LoadGraph(const std::string& name) {
  absl::StatusOr<Graph> graph = ParseGraph(ReadTestdata(name));
  EXPECT_TRUE(graph.ok()) << name << ": " << graph.status();
  if (!graph.ok()) return Graph();
  EXPECT_TRUE(ValidateGraph(*graph).ok()) << name;
  return *graph;
}

Schedule LoadSchedule(const std::string& name, const Graph& graph) {
  absl::StatusOr<Schedule> schedule = ParseSchedule(ReadTestdata(name));
  EXPECT_TRUE(schedule.ok()) << name << ": " << schedule.status();
  if (!schedule.ok()) return Schedule();
  absl::Status valid = ValidateSchedule(*schedule, graph);
  EXPECT_TRUE(valid.ok()) << name << ": " << valid;
  return *schedule;
}

HardwareModel TestHardware(int32_t world_size = 2) {
  HardwareModel hw = HardwareModel::H100(world_size);
  hw.collective_latency_s = 0;
  hw.intra_node_bytes_per_s = 1e6;
  hw.inter_node_bytes_per_s = 1e6;
  hw.host_bytes_per_s = 1e6;
  return hw;
}

SimResult MustSimulate(const Graph& graph, const Schedule& schedule,
                       const HardwareModel& hw) {
  absl::StatusOr<SimResult> result = Simulate(graph, schedule, hw);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : SimResult();
}

class TwoLayerTest : public ::testing::Test {
 protected:
  TwoLayerTest() : graph_(LoadGraph("sim_two_layer_graph.txt")) {}

  Schedule Load(const std::string& name) const {
    return LoadSchedule(name, graph_);
  }

  Graph graph_;
};

// Static bytes of the two-layer graph under ZeRO-3: two 1000-byte param
// shards, two 1000-byte gradient shards, two shards of Adam moments (2000).
constexpr int64_t kTwoLayerStatic = 2000 + 2000 + 4000;

TEST_F(TwoLayerTest, Simulate_OnDemandGathers_ExposesEveryGather) {
  // AG g0 [0,1] n0 [1,3] | AG g1 [3,4] n1 [4,6] | AG g1 [6,7] n2 [7,11]
  // RS p1 [11,12] | AG g0 issued 11, queued behind RS: [12,13] n3 [13,17]
  // RS p0 [17,18] | optimizer waits for it: n4 [18,19].
  SimResult r =
      MustSimulate(graph_, Load("sim_two_layer_on_demand.txt"), TestHardware());
  EXPECT_NEAR(r.iteration_s, 19 * kMs, kTolerance);
  EXPECT_NEAR(r.compute_s, 13 * kMs, kTolerance);
  EXPECT_NEAR(r.comm_s, 6 * kMs, kTolerance);
  EXPECT_NEAR(r.copy_s, 0, kTolerance);
  EXPECT_NEAR(r.exposed_comm_s, 6 * kMs, kTolerance);
  EXPECT_NEAR(r.overlap_ratio, 0, kTolerance);
  EXPECT_NEAR(r.lower_bound_s, 13 * kMs, kTolerance);
  ASSERT_EQ(r.group_exposed_s.size(), 2u);
  EXPECT_NEAR(r.group_exposed_s[0], 3 * kMs, kTolerance);
  EXPECT_NEAR(r.group_exposed_s[1], 2 * kMs, kTolerance);

  ASSERT_EQ(r.nodes.size(), 5u);
  const double starts[] = {1, 4, 7, 13, 18};
  const double stalls[] = {1, 1, 1, 2, 1};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(r.nodes[i].node_id, i);
    EXPECT_NEAR(r.nodes[i].start_s, starts[i] * kMs, kTolerance) << i;
    EXPECT_NEAR(r.nodes[i].stall_s, stalls[i] * kMs, kTolerance) << i;
  }

  ASSERT_EQ(r.collectives.size(), 6u);
  const CollectiveTimelineEntry& late_gather = r.collectives[4];
  EXPECT_EQ(late_gather.action_index, 10);
  EXPECT_EQ(late_gather.kind, ActionKind::kAllGather);
  EXPECT_EQ(late_gather.bytes, 2000);
  EXPECT_NEAR(late_gather.issue_s, 11 * kMs, kTolerance);
  EXPECT_NEAR(late_gather.start_s, 12 * kMs, kTolerance);
  EXPECT_NEAR(late_gather.end_s, 13 * kMs, kTolerance);

  // Peak at n2's start: g1 gathered, both activations, n2's workspace and
  // p1's full gradient. The release of g1 after n2 precedes the gather of g0
  // in program order, so the two are never held together.
  EXPECT_EQ(r.peak_bytes, kTwoLayerStatic + 2000 + 350 + 2000);
  EXPECT_EQ(r.peak_node_id, 2);
  EXPECT_EQ(r.peak_breakdown.sharded_params, 2000);
  EXPECT_EQ(r.peak_breakdown.persistent_params, 0);
  EXPECT_EQ(r.peak_breakdown.gathered_params, 2000);
  EXPECT_EQ(r.peak_breakdown.activations, 100 + 200 + 50);
  EXPECT_EQ(r.peak_breakdown.gradients, 2000 + 2000);
  EXPECT_EQ(r.peak_breakdown.optimizer_states, 4000);
  EXPECT_EQ(r.peak_breakdown.total(), r.peak_bytes);

  // After n2 and its release: p1's gradient is still being reduced.
  EXPECT_EQ(r.nodes[2].memory_after_bytes, kTwoLayerStatic + 100 + 2000);
  // After n3 and its release; p0's gradient is freed when its RS ends at 18.
  EXPECT_EQ(r.nodes[3].memory_after_bytes, kTwoLayerStatic + 2000);
  EXPECT_EQ(r.nodes[4].memory_after_bytes, kTwoLayerStatic);
}

// The worker's flat collective buffers: 2000 padded bytes plus the 1000-byte
// shard while each collective runs; a reduce-scatter's gradient is freed as
// it starts. Peak while g1 is gathered again for backward, [6,7]: static,
// both activations (300), g1 and its buffer; 13300.
TEST_F(TwoLayerTest, Simulate_CollectiveBuffers_CountedWhileRunning) {
  HardwareModel hw = TestHardware();
  hw.collective_buffers = true;
  const Schedule schedule = Load("sim_two_layer_on_demand.txt");
  SimResult r = MustSimulate(graph_, schedule, hw);
  EXPECT_EQ(r.peak_bytes, kTwoLayerStatic + 300 + 2000 + 3000);
  EXPECT_EQ(r.peak_node_id, 1);
  EXPECT_EQ(r.peak_breakdown.collective_buffers, 3000);
  EXPECT_EQ(r.peak_breakdown.total(), r.peak_bytes);
  // Times are unchanged. After n2 and its actions (release g1, RS p1
  // starting at once): RS p1's buffer instead of p1's gradient. After n3: RS p0
  // started as n3 ended, its buffer instead of p0's gradient.
  SimResult plain = MustSimulate(graph_, schedule, TestHardware());
  EXPECT_NEAR(r.iteration_s, plain.iteration_s, kTolerance);
  EXPECT_EQ(r.nodes[2].memory_after_bytes, kTwoLayerStatic + 100 + 3000);
  EXPECT_EQ(r.nodes[3].memory_after_bytes, kTwoLayerStatic + 3000);
  EXPECT_EQ(r.nodes[4].memory_after_bytes, kTwoLayerStatic);
}

// The communicator's scratch (an all-gather's output gathered through one
// more buffer of its size; a reduce-scatter capped at 500 bytes) counts
// with the flat buffer while the collective runs: the peak of the test
// above, while g1 is gathered for backward, gains the gather's 2000 bytes.
TEST_F(TwoLayerTest, Simulate_CollectiveScratch_CountedWithTheBuffer) {
  HardwareModel hw = TestHardware();
  hw.collective_buffers = true;
  hw.allgather_scratch = {1, 0};
  hw.reduce_scatter_scratch = {2, 500};
  const Schedule schedule = Load("sim_two_layer_on_demand.txt");
  SimResult r = MustSimulate(graph_, schedule, hw);
  EXPECT_EQ(r.peak_bytes, kTwoLayerStatic + 300 + 2000 + 3000 + 2000);
  EXPECT_EQ(r.peak_breakdown.collective_buffers, 3000 + 2000);
  // After n2: RS p1 runs with its buffer and the capped scratch.
  EXPECT_EQ(r.nodes[2].memory_after_bytes, kTwoLayerStatic + 100 + 3000 + 500);
  EXPECT_EQ(r.nodes[4].memory_after_bytes, kTwoLayerStatic);
}

// What a profile measured beyond the model (CalibrateMemory's fields): n1
// held 700 bytes more while it ran, and n1 left 400 bytes more than its
// activations, which n2 (its backward) gave back 300 of; the running sum
// (400, then 100) is held from each node's end.
TEST_F(TwoLayerTest, Simulate_MeasuredExtraAndCarry) {
  Graph graph = graph_;
  graph.nodes[1].measured_extra_bytes = 700;
  graph.nodes[1].measured_carry_bytes = 400;
  graph.nodes[2].measured_carry_bytes = -300;
  const Schedule schedule = Load("sim_two_layer_on_demand.txt");
  SimResult plain = MustSimulate(graph_, schedule, TestHardware());
  SimResult r = MustSimulate(graph, schedule, TestHardware());
  EXPECT_EQ(r.nodes[0].memory_after_bytes, plain.nodes[0].memory_after_bytes);
  EXPECT_EQ(r.nodes[1].memory_after_bytes,
            plain.nodes[1].memory_after_bytes + 400);
  EXPECT_EQ(r.nodes[2].memory_after_bytes,
            plain.nodes[2].memory_after_bytes + 100);
  EXPECT_EQ(r.nodes[3].memory_after_bytes,
            plain.nodes[3].memory_after_bytes + 100);
  // The peak (at n2's start in the plain run) carries the 400 bytes; n1's
  // extra does not reach it.
  EXPECT_EQ(r.peak_bytes, plain.peak_bytes + 400);
  // What the model alone put on top of each node, for CalibrateMemory:
  // n1 its 200-byte activation (rise and net); n2 its 50-byte workspace and
  // p1's 2000-byte gradient, and it frees n1's activation.
  EXPECT_EQ(r.nodes[1].modeled_rise_bytes, 200);
  EXPECT_EQ(r.nodes[1].modeled_net_bytes, 200);
  EXPECT_EQ(r.nodes[2].modeled_rise_bytes, 50 + 2000);
  EXPECT_EQ(r.nodes[2].modeled_net_bytes, 2000 - 200);
  // A large extra becomes the peak: n1 holds 5000 more while it runs.
  graph.nodes[1].measured_extra_bytes = 5000;
  SimResult big = MustSimulate(graph, schedule, TestHardware());
  EXPECT_EQ(big.peak_node_id, 1);
  EXPECT_EQ(big.peak_bytes, kTwoLayerStatic + 100 + 2000 + 200 + 5000);
}

TEST_F(TwoLayerTest, Simulate_PrefetchedGathers_OverlapWithCompute) {
  // AG g0 [0,1], AG g1 [1,2] | n0 [1,3] | n1 [3,5] (g1 ready at 2)
  // AG g0 [5,6] during n2 [5,9] | RS p1 [9,10] | n3 [9,13] (g0 ready at 6)
  // RS p0 [13,14] | optimizer n4 [14,15].
  SimResult r =
      MustSimulate(graph_, Load("sim_two_layer_prefetch.txt"), TestHardware());
  EXPECT_NEAR(r.iteration_s, 15 * kMs, kTolerance);
  EXPECT_NEAR(r.comm_s, 5 * kMs, kTolerance);
  EXPECT_NEAR(r.exposed_comm_s, 2 * kMs, kTolerance);
  EXPECT_NEAR(r.overlap_ratio, 0.6, kTolerance);
  ASSERT_EQ(r.group_exposed_s.size(), 2u);
  EXPECT_NEAR(r.group_exposed_s[0], 1 * kMs, kTolerance);
  EXPECT_NEAR(r.group_exposed_s[1], 0, kTolerance);
  EXPECT_NEAR(r.nodes[3].stall_s, 0, kTolerance);

  // The price: at n2's start both groups are gathered.
  EXPECT_EQ(r.peak_bytes, kTwoLayerStatic + 4000 + 350 + 2000);
  EXPECT_EQ(r.peak_node_id, 2);
  EXPECT_EQ(r.peak_breakdown.gathered_params, 4000);
  EXPECT_EQ(r.peak_breakdown.total(), r.peak_bytes);
}

TEST_F(TwoLayerTest,
       Simulate_TransfersTakeComputeShare_StretchOverlappedNodes) {
  // Each 1 ms collective of 2000 padded bytes takes 2.5e-7 s/B · 2000 B /
  // 1 ms = half of compute while it runs:
  // AG g0 [0,1] | AG g1 [1,2] during n0: n0 does 0.5 ms of work by 2, the
  // other 1.5 by 3.5 | n1 [3.5,5.5] | AG g0 [5.5,6.5] during n2: n2 [5.5,10]
  // | RS p1 [10,11] during n3: n3 [10,14.5] | RS p0 [14.5,15.5] | optimizer
  // [15.5,16.5]. Three half-shares of 1 ms: 1.5 ms lost.
  HardwareModel hw = TestHardware();
  hw.compute_s_per_allgather_byte = 2.5e-7;
  hw.compute_s_per_reduce_scatter_byte = 2.5e-7;
  SimResult r = MustSimulate(graph_, Load("sim_two_layer_prefetch.txt"), hw);
  EXPECT_NEAR(r.nodes[0].end_s, 3.5 * kMs, kTolerance);
  EXPECT_NEAR(r.nodes[2].end_s, 10 * kMs, kTolerance);
  EXPECT_NEAR(r.nodes[3].end_s, 14.5 * kMs, kTolerance);
  EXPECT_NEAR(r.iteration_s, 16.5 * kMs, kTolerance);
  EXPECT_NEAR(r.interference_s, 1.5 * kMs, kTolerance);
  // Compute's own time is what the nodes need, not what they took.
  EXPECT_NEAR(r.compute_s, 13 * kMs, kTolerance);

  // On demand nothing overlaps forward compute; only the reduce-scatter of
  // p1 runs during n3, so the schedules' gap narrows by what prefetching
  // loses to interference.
  SimResult on_demand =
      MustSimulate(graph_, Load("sim_two_layer_on_demand.txt"), hw);
  SimResult on_demand_free =
      MustSimulate(graph_, Load("sim_two_layer_on_demand.txt"), TestHardware());
  EXPECT_NEAR(on_demand.iteration_s - on_demand_free.iteration_s,
              on_demand.interference_s, kTolerance);

  // A share is capped at 0.95: a huge per-byte cost stalls compute to 5%
  // speed while the transfer runs, never to a halt.
  hw.compute_s_per_allgather_byte = 1.0;
  hw.compute_s_per_reduce_scatter_byte = 0;
  SimResult capped =
      MustSimulate(graph_, Load("sim_two_layer_prefetch.txt"), hw);
  // n0 starts at 1 under AG g1 [1,2]: 0.05 ms of work by 2, 1.95 after.
  EXPECT_NEAR(capped.nodes[0].end_s, 3.95 * kMs, kTolerance);
}

TEST_F(TwoLayerTest, Simulate_ComputeStretchesTransfers_OnlyWhileItRuns) {
  // Each 1 ms collective moves at a quarter of its rate while a node
  // computes: AG g0 [0,1] alone (compute waits) | AG g1 from 1 under n0
  // [1,3]: a quarter done by 3, n1 waits for the rest, alone: [1,3.5] |
  // n1 [3.5,5.5] | AG g0 [5.5,9.5] under n2 [5.5,9.5] | RS p1 [9.5,13.5]
  // under n3 [9.5,13.5] | RS p0 [13.5,14.5] alone | optimizer [14.5,15.5].
  HardwareModel hw = TestHardware();
  hw.allgather_stretch = 4;
  hw.reduce_scatter_stretch = 4;
  SimResult r = MustSimulate(graph_, Load("sim_two_layer_prefetch.txt"), hw);
  ASSERT_EQ(r.collectives.size(), 5u);
  const double spans[][2] = {
      {0, 1}, {1, 3.5}, {5.5, 9.5}, {9.5, 13.5}, {13.5, 14.5}};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(r.collectives[i].start_s, spans[i][0] * kMs, kTolerance) << i;
    EXPECT_NEAR(r.collectives[i].end_s, spans[i][1] * kMs, kTolerance) << i;
  }
  EXPECT_NEAR(r.nodes[1].start_s, 3.5 * kMs, kTolerance);
  EXPECT_NEAR(r.nodes[1].stall_s, 0.5 * kMs, kTolerance);
  EXPECT_NEAR(r.iteration_s, 15.5 * kMs, kTolerance);
  EXPECT_NEAR(r.exposed_comm_s, 2.5 * kMs, kTolerance);
  // comm_s is the collectives' time alone: what no schedule goes below.
  EXPECT_NEAR(r.comm_s, 5 * kMs, kTolerance);
  EXPECT_NEAR(r.interference_s, 0, kTolerance);

  // Both sides at once: stretched 2x, each collective takes
  // 2.5e-7 s/B · 2000 B = 0.5 ms of compute over its 2 ms under a node (a
  // quarter share), the same 0.5 ms as unstretched over 1 ms at half: AG g1
  // [1,3] under n0, which did 1.5 ms of work by 3 and ends at 3.5 | n1
  // [3.5,5.5] | AG g0 [5.5,7.5], n2 ends 10 | RS p1 [10,12], n3 ends 14.5 |
  // RS p0 [14.5,15.5] | optimizer [15.5,16.5]: the unstretched test's nodes.
  hw.allgather_stretch = 2;
  hw.reduce_scatter_stretch = 2;
  hw.compute_s_per_allgather_byte = 2.5e-7;
  hw.compute_s_per_reduce_scatter_byte = 2.5e-7;
  SimResult both = MustSimulate(graph_, Load("sim_two_layer_prefetch.txt"), hw);
  EXPECT_NEAR(both.collectives[1].end_s, 3 * kMs, kTolerance);
  EXPECT_NEAR(both.collectives[3].start_s, 10 * kMs, kTolerance);
  EXPECT_NEAR(both.collectives[3].end_s, 12 * kMs, kTolerance);
  EXPECT_NEAR(both.nodes[0].end_s, 3.5 * kMs, kTolerance);
  EXPECT_NEAR(both.nodes[2].end_s, 10 * kMs, kTolerance);
  EXPECT_NEAR(both.nodes[3].end_s, 14.5 * kMs, kTolerance);
  EXPECT_NEAR(both.iteration_s, 16.5 * kMs, kTolerance);
  EXPECT_NEAR(both.interference_s, 1.5 * kMs, kTolerance);

  // On demand compute waits for every gather, and nothing of a gather is
  // stretched; only RS p1 runs under a node.
  HardwareModel gathers_only = TestHardware();
  gathers_only.allgather_stretch = 4;
  EXPECT_NEAR(
      MustSimulate(graph_, Load("sim_two_layer_on_demand.txt"), gathers_only)
          .iteration_s,
      MustSimulate(graph_, Load("sim_two_layer_on_demand.txt"), TestHardware())
          .iteration_s,
      kTolerance);
}

TEST_F(TwoLayerTest, Simulate_SlowLinks_IsBoundByCommunication) {
  // 5 ms per collective. AG g0 [0,5], AG g1 [5,10] | n0 [5,7] | n1 [10,12]
  // AG g0 [12,17] | n2 [12,16] | RS p1 issued 16 [17,22] | n3 [17,21]
  // RS p0 issued 21 [22,27] | n4 [27,28].
  HardwareModel hw = TestHardware();
  hw.intra_node_bytes_per_s = 2e5;
  SimResult r = MustSimulate(graph_, Load("sim_two_layer_prefetch.txt"), hw);
  EXPECT_NEAR(r.iteration_s, 28 * kMs, kTolerance);
  EXPECT_NEAR(r.compute_s, 13 * kMs, kTolerance);
  EXPECT_NEAR(r.comm_s, 25 * kMs, kTolerance);
  EXPECT_NEAR(r.lower_bound_s, 25 * kMs, kTolerance);
  EXPECT_NEAR(r.exposed_comm_s, 15 * kMs, kTolerance);
  EXPECT_NEAR(r.overlap_ratio, 0.4, kTolerance);
  EXPECT_NEAR(r.group_exposed_s[0], 6 * kMs, kTolerance);
  EXPECT_NEAR(r.group_exposed_s[1], 3 * kMs, kTolerance);
  const double stalls[] = {5, 3, 0, 1, 6};
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(r.nodes[i].stall_s, stalls[i] * kMs, kTolerance) << i;
  }
  const CollectiveTimelineEntry& rs = r.collectives[3];
  EXPECT_EQ(rs.kind, ActionKind::kReduceScatter);
  EXPECT_NEAR(rs.issue_s, 16 * kMs, kTolerance);
  EXPECT_NEAR(rs.start_s, 17 * kMs, kTolerance);
  EXPECT_NEAR(rs.end_s, 22 * kMs, kTolerance);
}

TEST_F(TwoLayerTest, Simulate_Optimizer_WaitsForLastReduceScatter) {
  SimResult r =
      MustSimulate(graph_, Load("sim_two_layer_on_demand.txt"), TestHardware());
  ASSERT_EQ(r.collectives.back().kind, ActionKind::kReduceScatter);
  EXPECT_NEAR(r.collectives.back().end_s, 18 * kMs, kTolerance);
  EXPECT_NEAR(r.nodes[4].start_s, r.collectives.back().end_s, kTolerance);
  EXPECT_NEAR(r.nodes[4].stall_s, 1 * kMs, kTolerance);
}

TEST_F(TwoLayerTest, Simulate_OffloadedStates_RelieveMemoryAndDelayOptimizer) {
  // As on demand, plus OFFLOAD o0 after n0: copy [3,5], p0's 2000 bytes of
  // states leave at 5; RELOAD o0 before n4: copy [17,19], so the optimizer
  // starts at 19 instead of 18 (RS p0 ends at 18).
  SimResult r =
      MustSimulate(graph_, Load("sim_two_layer_offload.txt"), TestHardware());
  EXPECT_NEAR(r.iteration_s, 20 * kMs, kTolerance);
  EXPECT_NEAR(r.copy_s, 4 * kMs, kTolerance);
  EXPECT_NEAR(r.exposed_comm_s, 6 * kMs, kTolerance);
  EXPECT_NEAR(r.nodes[4].start_s, 19 * kMs, kTolerance);
  EXPECT_NEAR(r.nodes[4].stall_s, 2 * kMs, kTolerance);
  EXPECT_EQ(r.offloaded_bytes, 2000);

  ASSERT_EQ(r.copies.size(), 2u);
  EXPECT_EQ(r.copies[0].kind, ActionKind::kOffload);
  EXPECT_EQ(r.copies[0].action_index, 3);
  EXPECT_EQ(r.copies[0].bytes, 2000);
  EXPECT_NEAR(r.copies[0].start_s, 3 * kMs, kTolerance);
  EXPECT_NEAR(r.copies[0].end_s, 5 * kMs, kTolerance);
  EXPECT_EQ(r.copies[1].kind, ActionKind::kReload);
  EXPECT_NEAR(r.copies[1].issue_s, 17 * kMs, kTolerance);
  EXPECT_NEAR(r.copies[1].end_s, 19 * kMs, kTolerance);

  // The on-demand peak (12350 at n2's start) less p0's states.
  EXPECT_EQ(r.peak_bytes, 12350 - 2000);
  EXPECT_EQ(r.peak_node_id, 2);
  EXPECT_EQ(r.peak_breakdown.optimizer_states, 2000);
  EXPECT_EQ(r.peak_breakdown.total(), r.peak_bytes);
  // The states are back once the RELOAD starts.
  EXPECT_EQ(r.nodes[4].memory_after_bytes, kTwoLayerStatic);
}

TEST_F(TwoLayerTest, Simulate_ZeroOne_ReplicatesParamsAndGathersAfterStep) {
  // No gathers before use. n0 [0,2] n1 [2,4] n2 [4,8] RS p1 [8,9]
  // n3 [8,12] RS p0 [12,13] | n4 [13,14] | AG g0 [14,15], AG g1 [15,16].
  SimResult r =
      MustSimulate(graph_, Load("sim_two_layer_zero1.txt"), TestHardware());
  EXPECT_NEAR(r.iteration_s, 16 * kMs, kTolerance);
  EXPECT_NEAR(r.comm_s, 4 * kMs, kTolerance);
  // 1 ms the optimizer waits for RS p0, 2 ms of gathers after the last node.
  EXPECT_NEAR(r.exposed_comm_s, 3 * kMs, kTolerance);
  EXPECT_NEAR(r.nodes[4].stall_s, 1 * kMs, kTolerance);

  // Full params (4000) instead of shards, nothing persistent or gathered.
  // Peak at n3's start: p0's gradient allocated while p1's is still being
  // reduced (RS p1 ends at 9).
  EXPECT_EQ(r.peak_bytes, 4000 + 100 + (2000 + 4000) + 4000);
  EXPECT_EQ(r.peak_node_id, 3);
  EXPECT_EQ(r.peak_breakdown.sharded_params, 4000);
  EXPECT_EQ(r.peak_breakdown.persistent_params, 0);
  EXPECT_EQ(r.peak_breakdown.gathered_params, 0);
  EXPECT_EQ(r.peak_breakdown.activations, 100);
  EXPECT_EQ(r.peak_breakdown.gradients, 6000);
  EXPECT_EQ(r.peak_breakdown.optimizer_states, 4000);
}

TEST_F(TwoLayerTest, Simulate_WorldOne_CollectivesCostNothing) {
  graph_.world_size = 1;
  SimResult r = MustSimulate(graph_, Load("sim_two_layer_on_demand.txt"),
                             TestHardware(/*world_size=*/1));
  EXPECT_NEAR(r.iteration_s, 13 * kMs, kTolerance);
  EXPECT_NEAR(r.comm_s, 0, kTolerance);
  EXPECT_NEAR(r.exposed_comm_s, 0, kTolerance);
  EXPECT_NEAR(r.overlap_ratio, 1, kTolerance);
  ASSERT_EQ(r.collectives.size(), 6u);
  EXPECT_EQ(r.collectives[0].bytes, 2000);
  EXPECT_NEAR(r.collectives[0].end_s, r.collectives[0].start_s, kTolerance);
  // A shard is the whole param: 4000 of params, 4000 of gradient shards and
  // 8000 of Adam moments, plus at n2's start activations and p1's grad. A
  // gathered group aliases its shards (the worker's world of one): no
  // memory of its own.
  EXPECT_EQ(r.peak_bytes, 16000 + 350 + 2000);
  EXPECT_EQ(r.peak_breakdown.gathered_params, 0);
}

TEST_F(TwoLayerTest, Simulate_WaitWithoutAllGather_FailsNamingActionAndGroup) {
  absl::StatusOr<Schedule> schedule = ParseSchedule(R"(
schedule v1 graph=0000000000000000 mode=zero3 budget=0
group g0 p0
before n0 wait g0
)");
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  absl::StatusOr<SimResult> r = Simulate(graph_, *schedule, TestHardware());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("action 0 (before n0 wait g0): node n0 waits on group "
                        "g0 but no ALLGATHER of it was issued"));
}

TEST_F(TwoLayerTest, Simulate_WaitAfterRelease_Fails) {
  Schedule schedule = Load("sim_two_layer_on_demand.txt");
  // Drop "before n2 allgather g1": n2's WAIT then follows n1's RELEASE.
  ASSERT_EQ(schedule.actions[6].kind, ActionKind::kAllGather);
  schedule.actions.erase(schedule.actions.begin() + 6);
  absl::StatusOr<SimResult> r = Simulate(graph_, schedule, TestHardware());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("action 6 (before n2 wait g1): node n2 waits on group "
                        "g1 but no ALLGATHER of it was issued since its last "
                        "RELEASE"));
}

TEST_F(TwoLayerTest, Simulate_UnknownIds_Fail) {
  Schedule schedule = Load("sim_two_layer_on_demand.txt");
  schedule.actions[0].group_id = 9;
  EXPECT_THAT(Simulate(graph_, schedule, TestHardware()).status().message(),
              HasSubstr("action 0 (before n0 allgather g9): group g9 is not "
                        "defined by the schedule"));

  schedule = Load("sim_two_layer_on_demand.txt");
  schedule.actions[13].node_id = 42;
  EXPECT_THAT(Simulate(graph_, schedule, TestHardware()).status().message(),
              HasSubstr("action 13 (after n42 reduce_scatter p0): unknown "
                        "node n42"));

  schedule = Load("sim_two_layer_on_demand.txt");
  schedule.actions[13].param_ids = {0, 7};
  EXPECT_THAT(Simulate(graph_, schedule, TestHardware()).status().message(),
              HasSubstr("unknown param p7"));
}

TEST_F(TwoLayerTest, Simulate_GroupGatheredTwice_HoldsBothBuffers) {
  absl::StatusOr<Schedule> schedule = ParseSchedule(R"(
schedule v1 graph=0000000000000000 mode=zero3 budget=0
group g0 p0
before n0 allgather g0
before n0 allgather g0
before n0 wait g0
after n0 release g0
)");
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  SimResult r = MustSimulate(graph_, *schedule, TestHardware());
  // The WAIT is for the later gather, [1,2]; one RELEASE frees both.
  EXPECT_NEAR(r.nodes[0].start_s, 2 * kMs, kTolerance);
  EXPECT_EQ(r.nodes[0].memory_after_bytes, kTwoLayerStatic + 100);
  // Peak at n0's end, before the RELEASE: both buffers and n0's activations.
  // (At n3's start the never-reduced gradients reach the same level.)
  EXPECT_EQ(r.peak_bytes, kTwoLayerStatic + 4000 + 100);
  EXPECT_EQ(r.peak_breakdown.gathered_params, 4000);
  EXPECT_EQ(r.peak_node_id, 0);
}

TEST_F(TwoLayerTest, Simulate_FittedCollectiveModel_PricesGathersWithFit) {
  HardwareModel hw = TestHardware();
  absl::StatusOr<PiecewiseLinear> fit = PiecewiseLinear::Fit({{2000, 3e-3}});
  ASSERT_TRUE(fit.ok());
  hw.allgather_fit = *fit;
  SimResult r = MustSimulate(graph_, Load("sim_two_layer_on_demand.txt"), hw);
  // Four gathers at 3 ms, two reduce-scatters at 1 ms on the ring.
  EXPECT_NEAR(r.comm_s, 14 * kMs, kTolerance);
}

class GradAccumTest : public ::testing::Test {
 protected:
  GradAccumTest() : graph_(LoadGraph("sim_grad_accum_graph.txt")) {}
  Graph graph_;
};

// One param: 1000 shard + 2000 persistent + 1000 gradient shard + 2000 Adam.
constexpr int64_t kGradAccumStatic = 1000 + 2000 + 1000 + 2000;

TEST_F(GradAccumTest, Simulate_Accumulation_FullGradientLivesAcrossBatches) {
  // The refresh of persistent p0 after the previous step [0,1] (the steady
  // state: it is issued as the step begins, and n0, which uses p0, waits
  // for it), then n0 [1,2] n1 [2,4] n2 [4,5] n3 [5,7] RS p0 [7,8] n4 [8,9].
  // p0 is persistent: no other gathers.
  SimResult r =
      MustSimulate(graph_, LoadSchedule("sim_grad_accum_schedule.txt", graph_),
                   TestHardware());
  EXPECT_NEAR(r.iteration_s, 9 * kMs, kTolerance);
  EXPECT_NEAR(r.comm_s, 2 * kMs, kTolerance);
  EXPECT_NEAR(r.exposed_comm_s, 2 * kMs, kTolerance);
  ASSERT_EQ(r.collectives.size(), 2u);
  EXPECT_EQ(r.collectives[0].action_index, -1);
  EXPECT_EQ(r.collectives[0].kind, ActionKind::kAllGather);
  EXPECT_NEAR(r.collectives[0].start_s, 0, kTolerance);
  EXPECT_NEAR(r.collectives[1].start_s, 7 * kMs, kTolerance);

  // Allocated once at n1's start, kept through micro-batch 1, freed when the
  // reduce-scatter ends at 7.
  EXPECT_EQ(r.nodes[0].memory_after_bytes, kGradAccumStatic + 100);
  EXPECT_EQ(r.nodes[1].memory_after_bytes, kGradAccumStatic + 2000);
  EXPECT_EQ(r.nodes[2].memory_after_bytes, kGradAccumStatic + 2000 + 100);
  EXPECT_EQ(r.nodes[3].memory_after_bytes, kGradAccumStatic + 2000);
  EXPECT_EQ(r.nodes[4].memory_after_bytes, kGradAccumStatic);

  EXPECT_EQ(r.peak_bytes, kGradAccumStatic + 2000 + 100);
  EXPECT_EQ(r.peak_node_id, 1);  // first reached at n1's start
  EXPECT_EQ(r.peak_breakdown.sharded_params, 1000);
  EXPECT_EQ(r.peak_breakdown.persistent_params, 2000);
  EXPECT_EQ(r.peak_breakdown.gathered_params, 0);
  EXPECT_EQ(r.peak_breakdown.activations, 100);
  EXPECT_EQ(r.peak_breakdown.gradients, 3000);
  EXPECT_EQ(r.peak_breakdown.optimizer_states, 2000);
}

TEST_F(GradAccumTest,
       Simulate_ReduceScatterInFlight_NextBackwardAllocatesAgain) {
  // Reducing after each micro-batch: RS p0 [3,4] is still running when n3
  // starts at 4 and needs a fresh full gradient.
  Schedule schedule = LoadSchedule("sim_grad_accum_schedule.txt", graph_);
  Action rs = schedule.actions[0];
  rs.node_id = 1;
  schedule.actions.insert(schedule.actions.begin(), rs);
  SimResult r = MustSimulate(graph_, schedule, TestHardware());
  EXPECT_NEAR(r.comm_s, 3 * kMs, kTolerance);  // two RS and the refresh
  EXPECT_EQ(r.peak_bytes, kGradAccumStatic + 100 + 2 * 2000);
  EXPECT_EQ(r.peak_node_id, 3);
  EXPECT_EQ(r.peak_breakdown.gradients, 1000 + 2 * 2000);
}

// `graph` with `frozen` frozen and `schedule` without its reductions of them
// (the schedule the lowering gives a frozen param).
Graph Frozen(Graph graph, int32_t frozen) {
  for (Param& p : graph.params) {
    if (p.id == frozen) p.trainable = false;
  }
  return graph;
}
Schedule WithoutReductionsOf(Schedule schedule, int32_t frozen) {
  std::vector<Action> kept;
  for (Action a : schedule.actions) {
    if (a.kind == ActionKind::kReduceScatter) {
      a.param_ids.erase(
          std::remove(a.param_ids.begin(), a.param_ids.end(), frozen),
          a.param_ids.end());
      if (a.param_ids.empty()) continue;
    }
    kept.push_back(a);
  }
  schedule.actions = std::move(kept);
  return schedule;
}

// Freezing a.weight (p0) of the on-demand two-layer plan takes away exactly
// what its training cost: its reduce-scatter (1 ms on the link, [17,18]) and
// the optimizer's wait for it, its 1000-byte gradient shard and 2000 bytes of
// Adam moments for the whole iteration, and its 2000-byte full gradient
// from a.bwd's start until that reduce-scatter ended.
TEST_F(TwoLayerTest, Simulate_FrozenParam_DropsItsGradientStatesAndReduction) {
  const Schedule trained_plan = Load("sim_two_layer_on_demand.txt");
  const SimResult trained = MustSimulate(graph_, trained_plan, TestHardware());
  const Graph frozen_graph = Frozen(graph_, 0);
  const Schedule frozen_plan = WithoutReductionsOf(trained_plan, 0);
  ASSERT_EQ(frozen_plan.actions.size() + 1, trained_plan.actions.size());
  const SimResult frozen =
      MustSimulate(frozen_graph, frozen_plan, TestHardware());

  constexpr int64_t kGradShard = 1000;
  constexpr int64_t kStates = 2000;
  constexpr int64_t kFullGrad = 2000;
  EXPECT_NEAR(trained.comm_s - frozen.comm_s, 1 * kMs, kTolerance);
  EXPECT_NEAR(trained.exposed_comm_s - frozen.exposed_comm_s, 1 * kMs,
              kTolerance);
  EXPECT_NEAR(frozen.iteration_s, 18 * kMs, kTolerance);
  // Only b.weight's reduce-scatter is left.
  int reduce_scatters = 0;
  for (const CollectiveTimelineEntry& c : frozen.collectives) {
    if (c.kind != ActionKind::kReduceScatter) continue;
    ++reduce_scatters;
    EXPECT_EQ(frozen_plan.actions[c.action_index].param_ids,
              std::vector<int32_t>{1});
  }
  EXPECT_EQ(reduce_scatters, 1);
  // Peak at b's start in both: only the static bytes differ.
  EXPECT_EQ(trained.peak_node_id, 2);
  EXPECT_EQ(frozen.peak_node_id, 2);
  EXPECT_EQ(trained.peak_bytes - frozen.peak_bytes, kGradShard + kStates);
  EXPECT_EQ(trained.peak_breakdown.gradients - frozen.peak_breakdown.gradients,
            kGradShard);
  EXPECT_EQ(trained.peak_breakdown.optimizer_states -
                frozen.peak_breakdown.optimizer_states,
            kStates);
  EXPECT_EQ(frozen.peak_breakdown.gathered_params,
            trained.peak_breakdown.gathered_params);
  // After a.bwd the trained plan still holds p0's full gradient.
  EXPECT_EQ(
      trained.nodes[3].memory_after_bytes - frozen.nodes[3].memory_after_bytes,
      kGradShard + kStates + kFullGrad);
}

// A persistent frozen param is not re-gathered after the optimizer (the step
// does not change it): no refresh, and no gradient or states.
TEST_F(GradAccumTest, Simulate_FrozenPersistentParam_IsNotRefreshed) {
  const Schedule trained_plan =
      LoadSchedule("sim_grad_accum_schedule.txt", graph_);
  const SimResult trained = MustSimulate(graph_, trained_plan, TestHardware());
  const SimResult frozen = MustSimulate(
      Frozen(graph_, 0), WithoutReductionsOf(trained_plan, 0), TestHardware());
  EXPECT_NEAR(trained.comm_s, 2 * kMs, kTolerance);
  EXPECT_NEAR(frozen.comm_s, 0, kTolerance);
  EXPECT_TRUE(frozen.collectives.empty());
  EXPECT_NEAR(frozen.iteration_s, 7 * kMs, kTolerance);  // n0..n4 back to back
  // Gradient shard 1000, full gradient 2000 and Adam moments 2000.
  EXPECT_EQ(trained.peak_bytes - frozen.peak_bytes, 1000 + 2000 + 2000);
  EXPECT_EQ(frozen.peak_bytes, 1000 + 2000 + 100);
  EXPECT_EQ(frozen.peak_breakdown.gradients, 0);
  EXPECT_EQ(frozen.peak_breakdown.optimizer_states, 0);
}

TEST(SimulatorTest, Simulate_TinyFixture_IsSelfConsistent) {
  Graph graph = LoadGraph("tiny_graph.txt");
  Schedule schedule = LoadSchedule("tiny_schedule.txt", graph);
  SimResult r = MustSimulate(graph, schedule, HardwareModel::H100(2));
  EXPECT_EQ(r.nodes.size(), graph.nodes.size());
  EXPECT_EQ(r.collectives.size(), 11u);  // 10 actions + the refresh of p0
  EXPECT_EQ(r.group_exposed_s.size(), 3u);
  EXPECT_GE(r.iteration_s, r.lower_bound_s);
  EXPECT_EQ(r.peak_breakdown.total(), r.peak_bytes);
  // p5 (head, 1000x64 f32) is persistent.
  EXPECT_EQ(r.peak_breakdown.persistent_params, 256000);
  // o0 says 500 KiB, but p0's shard holds only 32000 x 8 bytes of states.
  EXPECT_EQ(r.offloaded_bytes, 256000);
}

}  // namespace
}  // namespace tandem
