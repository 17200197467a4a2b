#include "worker/runtime/interference_probe.h"

#include <mutex>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker/loopback_world.h"

namespace tandem {
namespace {

InterferenceProbeOptions SmallProbe() {
  InterferenceProbeOptions options;
  options.collective_bytes = 1 << 20;
  options.repetitions = 1;
  return options;
}

void ExpectSane(const InterferenceProbe& p) {
  for (double stretch :
       {p.allgather_stretch, p.reduce_scatter_stretch, p.copy_stretch}) {
    EXPECT_GE(stretch, 1);
    EXPECT_LE(stretch, 4);
  }
  EXPECT_GE(p.compute_s_per_allgather_byte, 0);
  EXPECT_GE(p.compute_s_per_reduce_scatter_byte, 0);
  EXPECT_GE(p.compute_s_per_copy_byte, 0);
  // The host link: the probe copy's bytes and its time alone.
  EXPECT_EQ(p.host_copy_bytes, int64_t{32} << 20);
  EXPECT_GT(p.host_copy_s, 0);
  EXPECT_GT(p.probe_s, 0);
}

// Two ranks: both sides of the contention are measured for every kind, and
// every rank reports the same figures (they share the machine's cores).
TEST(InterferenceProbeTest, TwoRanks_EveryKindMeasuredAndRanksAgree) {
  std::mutex mu;
  std::vector<InterferenceProbe> probes;
  RunLoopbackWorld(2, [&](int, Communicator& comm) {
    absl::StatusOr<InterferenceProbe> probe =
        MeasureInterference(comm, at::kCPU, SmallProbe());
    ASSERT_TRUE(probe.ok()) << probe.status();
    std::lock_guard<std::mutex> lock(mu);
    probes.push_back(*probe);
  });
  ASSERT_EQ(probes.size(), 2u);
  for (const InterferenceProbe& p : probes) ExpectSane(p);
  EXPECT_DOUBLE_EQ(probes[0].allgather_stretch, probes[1].allgather_stretch);
  EXPECT_DOUBLE_EQ(probes[0].reduce_scatter_stretch,
                   probes[1].reduce_scatter_stretch);
  EXPECT_DOUBLE_EQ(probes[0].copy_stretch, probes[1].copy_stretch);
  EXPECT_DOUBLE_EQ(probes[0].compute_s_per_allgather_byte,
                   probes[1].compute_s_per_allgather_byte);
  // A collective's loss is the slower rank's at each repetition: never
  // below what either rank lost itself (the mean over ranks, which the
  // probe reported before, is below the one that lost more).
  for (const InterferenceProbe& p : probes) {
    EXPECT_GE(p.compute_s_per_allgather_byte,
              p.own_compute_s_per_allgather_byte);
    EXPECT_GE(p.compute_s_per_reduce_scatter_byte,
              p.own_compute_s_per_reduce_scatter_byte);
  }
}

// One rank: no collective moves anything, so neither side of their
// contention exists; the copy is still measured.
TEST(InterferenceProbeTest, OneRank_CollectivesNeitherCostNorStretch) {
  RunLoopbackWorld(1, [&](int, Communicator& comm) {
    absl::StatusOr<InterferenceProbe> probe =
        MeasureInterference(comm, at::kCPU, SmallProbe());
    ASSERT_TRUE(probe.ok()) << probe.status();
    ExpectSane(*probe);
    EXPECT_EQ(probe->compute_s_per_allgather_byte, 0);
    EXPECT_EQ(probe->allgather_stretch, 1);
    EXPECT_EQ(probe->reduce_scatter_stretch, 1);
  });
}

}  // namespace
}  // namespace tandem
