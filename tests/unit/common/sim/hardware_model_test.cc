#include "common/sim/hardware_model.h"

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

PiecewiseLinear MustFit(std::vector<std::pair<int64_t, double>> points) {
  absl::StatusOr<PiecewiseLinear> fit = PiecewiseLinear::Fit(std::move(points));
  EXPECT_TRUE(fit.ok()) << fit.status();
  return fit.ok() ? *fit : PiecewiseLinear();
}

TEST(PiecewiseLinearTest, Fit_UnsortedPoints_PassesThroughEachPoint) {
  PiecewiseLinear f = MustFit({{4000, 4.0}, {1000, 2.0}, {2000, 3.0}});
  EXPECT_EQ(f.points(), (std::vector<std::pair<int64_t, double>>{
                            {1000, 2.0}, {2000, 3.0}, {4000, 4.0}}));
  EXPECT_DOUBLE_EQ(f(1000), 2.0);
  EXPECT_DOUBLE_EQ(f(2000), 3.0);
  EXPECT_DOUBLE_EQ(f(4000), 4.0);
}

TEST(PiecewiseLinearTest, Call_BetweenPoints_Interpolates) {
  PiecewiseLinear f = MustFit({{1000, 2.0}, {2000, 3.0}, {4000, 4.0}});
  EXPECT_DOUBLE_EQ(f(1500), 2.5);
  EXPECT_DOUBLE_EQ(f(3000), 3.5);
}

TEST(PiecewiseLinearTest, Call_BeyondEnds_ExtendsFirstAndLastSegments) {
  PiecewiseLinear f = MustFit({{1000, 2.0}, {2000, 3.0}, {4000, 8.0}});
  EXPECT_DOUBLE_EQ(f(8000), 18.0);  // the last segment: 1/400 s per byte
  EXPECT_DOUBLE_EQ(f(500), 1.5);    // the first: 1/1000 s per byte
  EXPECT_DOUBLE_EQ(f(0), 1.0);      // the fitted latency
}

// Past the largest size, never at a rate faster than the line through the
// first and last points: the last segment here (1/2000 s per byte) is
// flatter than that line (1/1500), as when two large sizes measured close
// together differ by noise. What an all-gather profile on a 2 Gbit/s link
// gave (2 KB, 3.2 MB, 4.3 MB), priced at 17 MB, the refresh of every
// persistent param: at the link's rate, not 1.2 GB/s.
TEST(PiecewiseLinearTest, Call_PastTheLast_NoFlatterThanFirstToLast) {
  PiecewiseLinear f = MustFit({{1000, 2.0}, {2000, 3.0}, {4000, 4.0}});
  EXPECT_NEAR(f(8000), 4.0 + 4000.0 * 2.0 / 3000.0, 1e-12);
  EXPECT_DOUBLE_EQ(f(3000), 3.5);  // between points: interpolated
  PiecewiseLinear ag = MustFit({{2048, 0.00051},
                                {3155968, 0.01322},
                                {3155968, 0.01458},
                                {4325376, 0.01297},
                                {4325376, 0.01686}});
  const double at_17mb = ag(16951296);
  // 16.95 MB at the first-to-last rate (about 290 MB/s): 0.058 s; the last
  // segment alone gave 0.025 s.
  EXPECT_NEAR(
      at_17mb,
      0.0149 + (16951296 - 4325376) * (0.0149 - 0.00051) / (4325376 - 2048),
      1e-4);
  EXPECT_GT(at_17mb, 0.05);
}

TEST(PiecewiseLinearTest, Call_ExtrapolationBelowZero_ClampsAtZero) {
  PiecewiseLinear f = MustFit({{1000, 1.0}, {2000, 3.0}});
  EXPECT_DOUBLE_EQ(f(250), 0.0);
  EXPECT_DOUBLE_EQ(f(0), 0.0);
}

TEST(PiecewiseLinearTest, Fit_EqualBytes_AveragesSeconds) {
  PiecewiseLinear f = MustFit({{1000, 1.0}, {2000, 4.0}, {1000, 3.0}});
  ASSERT_EQ(f.points().size(), 2u);
  EXPECT_DOUBLE_EQ(f(1000), 2.0);
  EXPECT_DOUBLE_EQ(f(1500), 3.0);
}

TEST(PiecewiseLinearTest, Fit_SmallerTimeForMoreBytes_RaisesToEarlierPoint) {
  PiecewiseLinear f = MustFit({{1000, 2.0}, {2000, 1.5}, {3000, 3.0}});
  EXPECT_DOUBLE_EQ(f(2000), 2.0);
  EXPECT_DOUBLE_EQ(f(1500), 2.0);
  EXPECT_DOUBLE_EQ(f(2500), 2.5);
}

TEST(PiecewiseLinearTest, Fit_OnePoint_IsProportionalThroughOrigin) {
  PiecewiseLinear f = MustFit({{1000, 2e-3}});
  EXPECT_DOUBLE_EQ(f(500), 1e-3);
  EXPECT_DOUBLE_EQ(f(4000), 8e-3);
  EXPECT_DOUBLE_EQ(f(0), 0.0);
}

TEST(PiecewiseLinearTest, Fit_OnePointAtZeroBytes_IsConstant) {
  PiecewiseLinear f = MustFit({{0, 5e-6}});
  EXPECT_DOUBLE_EQ(f(0), 5e-6);
  EXPECT_DOUBLE_EQ(f(kGiB), 5e-6);
}

TEST(PiecewiseLinearTest, Call_Empty_ReturnsZero) {
  PiecewiseLinear f;
  EXPECT_TRUE(f.empty());
  EXPECT_DOUBLE_EQ(f(kGiB), 0.0);
}

TEST(PiecewiseLinearTest, Fit_NoPoints_Fails) {
  absl::StatusOr<PiecewiseLinear> fit = PiecewiseLinear::Fit({});
  EXPECT_EQ(fit.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(fit.status().message(), HasSubstr("at least one"));
}

TEST(PiecewiseLinearTest, Fit_NegativeOrNonFinitePoint_Fails) {
  EXPECT_THAT(PiecewiseLinear::Fit({{-1, 1.0}}).status().message(),
              HasSubstr("(-1 bytes, 1 s)"));
  EXPECT_EQ(PiecewiseLinear::Fit({{10, -1.0}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      PiecewiseLinear::Fit({{10, std::numeric_limits<double>::infinity()}})
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(HardwareModelTest, H100_Defaults_MatchDesign) {
  HardwareModel hw = HardwareModel::H100(64);
  EXPECT_EQ(hw.world_size, 64);
  EXPECT_EQ(hw.ranks_per_node, 8);
  EXPECT_DOUBLE_EQ(hw.intra_node_bytes_per_s, 370e9);
  EXPECT_DOUBLE_EQ(hw.inter_node_bytes_per_s, 50e9);
  EXPECT_DOUBLE_EQ(hw.collective_latency_s, 20e-6);
  EXPECT_DOUBLE_EQ(hw.host_bytes_per_s, 50e9);
  EXPECT_EQ(hw.device_memory_bytes, 80 * kGiB);
  EXPECT_EQ(hw.budget(), 80 * kGiB);
}

TEST(HardwareModelTest, AllGatherSeconds_OneNode_UsesNvlinkRing) {
  HardwareModel hw = HardwareModel::H100(8);
  const double expected = 20e-6 + 1073741824.0 * 7 / (8 * 370e9);
  EXPECT_DOUBLE_EQ(hw.AllGatherSeconds(kGiB), expected);
  EXPECT_DOUBLE_EQ(hw.ReduceScatterSeconds(kGiB), expected);
}

TEST(HardwareModelTest, AllGatherSeconds_AcrossNodes_UsesNic) {
  HardwareModel hw = HardwareModel::H100(16);
  const double expected = 20e-6 + 1073741824.0 * 15 / (16 * 50e9);
  EXPECT_DOUBLE_EQ(hw.AllGatherSeconds(kGiB), expected);
  EXPECT_DOUBLE_EQ(hw.ReduceScatterSeconds(kGiB), expected);
}

TEST(HardwareModelTest, CollectiveSeconds_WorldOne_IsZero) {
  HardwareModel hw = HardwareModel::H100(1);
  EXPECT_DOUBLE_EQ(hw.AllGatherSeconds(kGiB), 0.0);
  EXPECT_DOUBLE_EQ(hw.ReduceScatterSeconds(kGiB), 0.0);
}

TEST(HardwareModelTest, CollectiveSeconds_EmptyBuffer_IsZero) {
  HardwareModel hw = HardwareModel::H100(8);
  EXPECT_DOUBLE_EQ(hw.AllGatherSeconds(0), 0.0);
  EXPECT_DOUBLE_EQ(hw.ReduceScatterSeconds(0), 0.0);
}

TEST(HardwareModelTest, AllGatherSeconds_WithFit_UsesFitNotRing) {
  HardwareModel hw = HardwareModel::H100(8);
  hw.allgather_fit = MustFit({{1 << 20, 1e-4}, {1 << 21, 1.5e-4}});
  EXPECT_DOUBLE_EQ(hw.AllGatherSeconds(3 << 19), 1.25e-4);
  EXPECT_DOUBLE_EQ(hw.AllGatherSeconds(1 << 22), 2.5e-4);
  // The reduce-scatter has no fit: still the ring.
  EXPECT_DOUBLE_EQ(hw.ReduceScatterSeconds(kGiB),
                   20e-6 + 1073741824.0 * 7 / (8 * 370e9));
}

TEST(HardwareModelTest, HostCopySeconds_OneGigabyte_TakesTwentyMs) {
  HardwareModel hw = HardwareModel::H100(8);
  EXPECT_DOUBLE_EQ(hw.HostCopySeconds(1'000'000'000), 0.02);
  EXPECT_DOUBLE_EQ(hw.HostCopySeconds(0), 0.0);
}

TEST(HardwareModelTest, Budget_Set_OverridesDeviceMemory) {
  HardwareModel hw = HardwareModel::H100(8);
  hw.budget_bytes = 70 * kGiB;
  EXPECT_EQ(hw.budget(), 70 * kGiB);
}

TEST(ParseHardwareModelTest, Parse_Empty_GivesH100ForWorldOne) {
  absl::StatusOr<HardwareModel> hw = ParseHardwareModel("");
  ASSERT_TRUE(hw.ok()) << hw.status();
  EXPECT_EQ(hw->world_size, 1);
  EXPECT_DOUBLE_EQ(hw->intra_node_bytes_per_s, 370e9);
  EXPECT_EQ(hw->device_memory_bytes, 80 * kGiB);
  EXPECT_EQ(hw->budget_bytes, 0);
}

TEST(ParseHardwareModelTest, Parse_EveryKey_SetsEveryField) {
  absl::StatusOr<HardwareModel> hw = ParseHardwareModel(
      "world=16, ranks_per_node=4 intra_gbps=300 inter_gbps=25\n"
      "latency_us=10,host_gbps=32 memory=40GiB budget=36GiB\n"
      "ag_cpu_s_per_gb=0.5 rs_cpu_s_per_gb=0.75 copy_cpu_s_per_gb=0");
  ASSERT_TRUE(hw.ok()) << hw.status();
  EXPECT_EQ(hw->world_size, 16);
  EXPECT_EQ(hw->ranks_per_node, 4);
  EXPECT_DOUBLE_EQ(hw->intra_node_bytes_per_s, 300e9);
  EXPECT_DOUBLE_EQ(hw->inter_node_bytes_per_s, 25e9);
  EXPECT_DOUBLE_EQ(hw->collective_latency_s, 10e-6);
  EXPECT_DOUBLE_EQ(hw->host_bytes_per_s, 32e9);
  EXPECT_EQ(hw->device_memory_bytes, 40 * kGiB);
  EXPECT_EQ(hw->budget_bytes, 36 * kGiB);
  EXPECT_DOUBLE_EQ(hw->compute_s_per_allgather_byte, 0.5e-9);
  EXPECT_DOUBLE_EQ(hw->compute_s_per_reduce_scatter_byte, 0.75e-9);
  EXPECT_DOUBLE_EQ(hw->compute_s_per_copy_byte, 0);
}

TEST(ParseHardwareModelTest, Parse_ByteSuffixes_ScaleByPowersOf1024) {
  struct Case {
    const char* text;
    int64_t bytes;
  };
  for (const Case& c : {Case{"memory=1000", 1000}, Case{"memory=1000B", 1000},
                        Case{"memory=3KiB", 3072}, Case{"memory=5MiB", 5 << 20},
                        Case{"memory=1.5GiB", 3 * kGiB / 2},
                        Case{"memory=2TiB", 2048 * kGiB}}) {
    absl::StatusOr<HardwareModel> hw = ParseHardwareModel(c.text);
    ASSERT_TRUE(hw.ok()) << c.text << ": " << hw.status();
    EXPECT_EQ(hw->device_memory_bytes, c.bytes) << c.text;
  }
}

TEST(ParseHardwareModelTest, Parse_UnknownKey_ListsValidKeys) {
  absl::StatusOr<HardwareModel> hw = ParseHardwareModel("wrold=8");
  EXPECT_EQ(hw.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(hw.status().message(), HasSubstr("unknown key 'wrold'"));
  EXPECT_THAT(hw.status().message(),
              HasSubstr("world, ranks_per_node, intra_gbps, inter_gbps, "
                        "latency_us, host_gbps, ag_cpu_s_per_gb, "
                        "rs_cpu_s_per_gb, copy_cpu_s_per_gb, ag_stretch, "
                        "rs_stretch, copy_stretch, memory, budget"));
}

TEST(ParseHardwareModelTest, Parse_Stretch_OneToFour) {
  absl::StatusOr<HardwareModel> hw =
      ParseHardwareModel("ag_stretch=1.8 rs_stretch=1 copy_stretch=4");
  ASSERT_TRUE(hw.ok()) << hw.status();
  EXPECT_DOUBLE_EQ(hw->allgather_stretch, 1.8);
  EXPECT_DOUBLE_EQ(hw->reduce_scatter_stretch, 1);
  EXPECT_DOUBLE_EQ(hw->copy_stretch, 4);
  EXPECT_TRUE(hw->stretched());
  EXPECT_FALSE(HardwareModel::H100(8).stretched());
  for (const char* bad : {"ag_stretch=0.5", "rs_stretch=4.5", "copy_stretch=x",
                          "ag_stretch=nan"}) {
    absl::StatusOr<HardwareModel> parsed = ParseHardwareModel(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr("a number from 1 to 4"))
        << bad;
  }
}

TEST(ParseHardwareModelTest, Parse_BadValue_NamesKeyAndExpectation) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c : {
           Case{"world=0", "world='0': expected an integer >= 1"},
           Case{"ranks_per_node=x", "ranks_per_node='x': expected an integer"},
           Case{"intra_gbps=-3",
                "intra_gbps='-3': expected a finite number > 0"},
           Case{"host_gbps=0", "host_gbps='0': expected a finite number > 0"},
           Case{"latency_us=nan", "latency_us='nan'"},
           Case{"rs_cpu_s_per_gb=-1",
                "rs_cpu_s_per_gb='-1': expected a finite number >= 0"},
           Case{"memory=12XB", "memory='12XB': expected a byte count"},
           Case{"memory=0", "memory='0': expected a byte count > 0"},
           Case{"budget=0.5B", "budget='0.5B': expected a byte count"},
           Case{"budget=GiB", "budget='GiB'"},
       }) {
    absl::StatusOr<HardwareModel> hw = ParseHardwareModel(c.text);
    EXPECT_EQ(hw.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(hw.status().message(), HasSubstr(c.message)) << c.text;
  }
}

TEST(ParseHardwareModelTest, Parse_ZeroLatency_IsAllowed) {
  absl::StatusOr<HardwareModel> hw = ParseHardwareModel("latency_us=0");
  ASSERT_TRUE(hw.ok()) << hw.status();
  EXPECT_DOUBLE_EQ(hw->collective_latency_s, 0.0);
}

TEST(ParseHardwareModelTest, Parse_BudgetAboveMemory_Fails) {
  absl::StatusOr<HardwareModel> hw =
      ParseHardwareModel("budget=41GiB memory=40GiB");
  EXPECT_EQ(hw.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(hw.status().message(),
              HasSubstr("budget (44023414784 bytes) exceeds device memory "
                        "(42949672960 bytes)"));
}

TEST(ParseHardwareModelTest, Parse_RepeatedKey_Fails) {
  absl::StatusOr<HardwareModel> hw = ParseHardwareModel("world=8 world=16");
  EXPECT_THAT(hw.status().message(), HasSubstr("key 'world' given twice"));
}

TEST(ParseHardwareModelTest, Parse_TokenWithoutEquals_Fails) {
  absl::StatusOr<HardwareModel> hw = ParseHardwareModel("world 8");
  EXPECT_THAT(hw.status().message(), HasSubstr("'world' is not key=value"));
}

}  // namespace
}  // namespace tandem
