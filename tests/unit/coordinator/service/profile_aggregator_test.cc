#include "coordinator/service/profile_aggregator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/ir/profile_fields.h"
#include "common/ir/proto_convert.h"
#include "common/ir/text_format.h"
#include "common/ir/validate.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string ReadTestData(const std::string& name) {
  const std::string path = std::string(TANDEM_TESTDATA_DIR) + "/" + name;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

class ProfileAggregatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Graph> graph = ParseGraph(ReadTestData("tiny_graph.txt"));
    ASSERT_TRUE(graph.ok()) << graph.status();
    graph_ = *std::move(graph);
    hash_ = graph_.StructuralHash();
  }

  // A profile in text form, measured on tiny_graph.txt ($hash).
  Profile P(const std::string& text) {
    absl::StatusOr<Profile> p =
        ParseProfile(absl::StrReplaceAll(text, {{"$hash", hash_}}));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.value_or(Profile());
  }

  // Rank `rank`'s profile of window first..last: its iteration time and one
  // node time, both in ms.
  Profile Window(int rank, int first, int last, double iteration_ms,
                 double n1_ms = 0.5) {
    return P(absl::StrCat("profile graph=$hash rank=", rank,
                          " version=0 window=", first, "..", last,
                          " iteration=", iteration_ms, "ms peak=1MiB\n",
                          "time n1 ", n1_ms, "ms samples=2\n"));
  }

  Graph graph_;
  std::string hash_;
};

TEST_F(ProfileAggregatorTest,
       AggregateProfiles_ThreeRanks_SlowestTimeLargestMemory) {
  std::map<int32_t, Profile> by_rank;
  by_rank[0] = P(R"(
profile graph=$hash rank=0 version=1 window=10..19 iteration=10ms peak=4MiB ag_stretch=1.5
time n0 0.2ms samples=10
time n1 0.5ms samples=10
collective allgather g0 at=n0 bytes=1KiB issue_to_done=0.3ms run=0.1ms computing=0.1ms exposed=0.1ms
collective reduce_scatter p0 at=n7 bytes=1KiB issue_to_done=0.4ms exposed=0
memory n0 before=1MiB after=2MiB
)");
  by_rank[1] = P(R"(
profile graph=$hash rank=1 version=1 window=10..19 iteration=12ms peak=3MiB ag_stretch=1.7
time n0 0.3ms samples=10
time n1 0.4ms samples=10
collective allgather g0 at=n0 bytes=1KiB issue_to_done=0.2ms run=0.18ms computing=0.09ms exposed=0.15ms
collective reduce_scatter p0 at=n7 bytes=1KiB issue_to_done=0.6ms exposed=0
memory n0 before=1.5MiB after=1MiB
)");
  by_rank[2] = P(R"(
profile graph=$hash rank=2 version=1 window=10..19 iteration=11ms peak=5MiB
time n0 0.1ms samples=10
time n1 0.7ms samples=10
collective allgather g0 at=n0 bytes=1KiB issue_to_done=0.1ms run=0.05ms computing=0.05ms exposed=0
collective reduce_scatter p0 at=n7 bytes=1KiB issue_to_done=0.5ms exposed=0.2ms
memory n0 before=1MiB after=3MiB
)");
  absl::StatusOr<Profile> out = AggregateProfiles(by_rank);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->rank, Profile::kAggregateRank);
  EXPECT_EQ(out->schedule_version, 1);
  EXPECT_EQ(out->first_iteration, 10);
  EXPECT_EQ(out->last_iteration, 19);
  EXPECT_DOUBLE_EQ(out->iteration_s, 12e-3);
  EXPECT_EQ(out->peak_bytes, 5 << 20);
  ASSERT_EQ(out->nodes.size(), 2u);
  EXPECT_EQ(out->nodes[0].node_id, 0);
  EXPECT_DOUBLE_EQ(out->nodes[0].time_s, 0.3e-3);
  EXPECT_EQ(out->nodes[1].node_id, 1);
  EXPECT_DOUBLE_EQ(out->nodes[1].time_s, 0.7e-3);
  ASSERT_EQ(out->collectives.size(), 2u);
  EXPECT_DOUBLE_EQ(out->collectives[0].issue_to_done_s, 0.3e-3);
  EXPECT_DOUBLE_EQ(out->collectives[0].exposed_s, 0.15e-3);
  // The run time the collective fit reads: the slowest rank's too.
  EXPECT_DOUBLE_EQ(out->collectives[0].run_s, 0.18e-3);
  // With the compute that ran alongside it on that rank, and the largest
  // stretch any rank's probe measured.
  EXPECT_DOUBLE_EQ(out->collectives[0].computing_s, 0.09e-3);
  EXPECT_DOUBLE_EQ(out->allgather_stretch, 1.7);
  EXPECT_DOUBLE_EQ(out->collectives[1].issue_to_done_s, 0.6e-3);
  EXPECT_DOUBLE_EQ(out->collectives[1].exposed_s, 0.2e-3);
  ASSERT_EQ(out->memory.size(), 1u);
  EXPECT_EQ(out->memory[0].before_bytes, 3 << 19);
  EXPECT_EQ(out->memory[0].after_bytes, 3 << 20);
}

// A rank that recorded another sequence of collectives (or memory samples)
// cannot be matched entry by entry: its entries are left out, the other
// ranks' still count.
TEST_F(ProfileAggregatorTest,
       AggregateProfiles_ListLengthsDiffer_MatchesOnlyEqualLengths) {
  std::map<int32_t, Profile> by_rank;
  by_rank[0] = P(R"(
profile graph=$hash rank=0 window=0..1 iteration=1ms
collective allgather g0 at=n0 bytes=1KiB issue_to_done=1ms exposed=0
memory n0 before=1MiB after=1MiB
)");
  by_rank[1] = P(R"(
profile graph=$hash rank=1 window=0..1 iteration=1ms
collective allgather g0 at=n0 bytes=1KiB issue_to_done=9ms exposed=9ms
collective allgather g1 at=n1 bytes=1KiB issue_to_done=9ms exposed=9ms
memory n0 before=9MiB after=9MiB
memory n1 before=9MiB after=9MiB
)");
  by_rank[2] = P(R"(
profile graph=$hash rank=2 window=0..1 iteration=1ms
collective allgather g0 at=n0 bytes=1KiB issue_to_done=2ms exposed=0.5ms
memory n0 before=2MiB after=3MiB
)");
  absl::StatusOr<Profile> out = AggregateProfiles(by_rank);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->collectives.size(), 1u);
  EXPECT_DOUBLE_EQ(out->collectives[0].issue_to_done_s, 2e-3);
  EXPECT_DOUBLE_EQ(out->collectives[0].exposed_s, 0.5e-3);
  ASSERT_EQ(out->memory.size(), 1u);
  EXPECT_EQ(out->memory[0].before_bytes, 2 << 20);
  EXPECT_EQ(out->memory[0].after_bytes, 3 << 20);
}

TEST_F(ProfileAggregatorTest, AggregateProfiles_NodeOnlyOnLaterRank_IsKept) {
  std::map<int32_t, Profile> by_rank;
  by_rank[0] =
      P("profile graph=$hash rank=0 window=0..1 iteration=1ms\n"
        "time n1 1ms samples=2\n");
  by_rank[1] =
      P("profile graph=$hash rank=1 window=0..1 iteration=1ms\n"
        "time n1 2ms samples=2\ntime n8 3ms samples=2\n");
  absl::StatusOr<Profile> out = AggregateProfiles(by_rank);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->nodes.size(), 2u);
  EXPECT_EQ(out->nodes[0].node_id, 1);
  EXPECT_DOUBLE_EQ(out->nodes[0].time_s, 2e-3);
  EXPECT_EQ(out->nodes[1].node_id, 8);
  EXPECT_DOUBLE_EQ(out->nodes[1].time_s, 3e-3);
}

TEST_F(ProfileAggregatorTest, AggregateProfiles_HostCopies_SlowestRankRate) {
  std::map<int32_t, Profile> by_rank;
  // Rank 0: 8 MiB in 4 ms (2.1 GB/s); rank 1: 4 MiB in 4 ms (1.05 GB/s);
  // rank 2 copied nothing.
  by_rank[0] =
      P("profile graph=$hash rank=0 window=0..1 iteration=1ms copied=8MiB "
        "copy_time=4ms\n");
  by_rank[1] =
      P("profile graph=$hash rank=1 window=0..1 iteration=1ms copied=4MiB "
        "copy_time=4ms\n");
  by_rank[2] = P("profile graph=$hash rank=2 window=0..1 iteration=1ms\n");
  absl::StatusOr<Profile> out = AggregateProfiles(by_rank);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->host_copy_bytes, 4 << 20);
  EXPECT_DOUBLE_EQ(out->host_copy_s, 4e-3);
}

TEST_F(ProfileAggregatorTest, AggregateProfiles_NoProfiles_InvalidArgument) {
  EXPECT_EQ(AggregateProfiles({}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ProfileAggregatorTest, AddProfile_AllRanksReported_WindowCompletes) {
  ProfileAggregator agg(3);
  ASSERT_TRUE(agg.SetGraph(graph_).ok());
  for (int rank : {0, 2}) {
    absl::StatusOr<std::optional<Profile>> r =
        agg.AddProfile(rank, Window(rank, 0, 4, 10 + rank, 1.0 + rank));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->has_value()) << "rank " << rank << " completed the window";
  }
  EXPECT_EQ(agg.open_windows(), 1);
  absl::StatusOr<std::optional<Profile>> r =
      agg.AddProfile(1, Window(1, 0, 4, 11, 5.0));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  const Profile& aggregate = **r;
  EXPECT_EQ(aggregate.rank, Profile::kAggregateRank);
  EXPECT_EQ(aggregate.first_iteration, 0);
  EXPECT_EQ(aggregate.last_iteration, 4);
  EXPECT_DOUBLE_EQ(aggregate.iteration_s, 12e-3);
  ASSERT_EQ(aggregate.nodes.size(), 1u);
  EXPECT_DOUBLE_EQ(aggregate.nodes[0].time_s, 5e-3);
  EXPECT_EQ(agg.open_windows(), 0);
}

TEST_F(ProfileAggregatorTest, AddProfile_OutOfOrderWindows_EachCompletes) {
  ProfileAggregator agg(2);
  ASSERT_TRUE(agg.SetGraph(graph_).ok());
  ASSERT_FALSE(agg.AddProfile(0, Window(0, 2, 3, 20))->has_value());
  ASSERT_FALSE(agg.AddProfile(0, Window(0, 0, 1, 10))->has_value());
  absl::StatusOr<std::optional<Profile>> first =
      agg.AddProfile(1, Window(1, 0, 1, 15));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((*first)->last_iteration, 1);
  EXPECT_DOUBLE_EQ((*first)->iteration_s, 15e-3);
  EXPECT_EQ(agg.open_windows(), 1);
  absl::StatusOr<std::optional<Profile>> second =
      agg.AddProfile(1, Window(1, 2, 3, 25));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(second->has_value());
  EXPECT_EQ((*second)->first_iteration, 2);
  EXPECT_DOUBLE_EQ((*second)->iteration_s, 25e-3);
  EXPECT_EQ(agg.open_windows(), 0);
}

// Once a window completes, the job is past older ones: they are dropped, and
// a late profile of one is ignored rather than starting it again.
TEST_F(ProfileAggregatorTest, AddProfile_WindowBeforeCompletedOne_IsIgnored) {
  ProfileAggregator agg(2);
  ASSERT_TRUE(agg.SetGraph(graph_).ok());
  ASSERT_FALSE(agg.AddProfile(0, Window(0, 0, 1, 10))->has_value());
  ASSERT_FALSE(agg.AddProfile(0, Window(0, 2, 3, 10))->has_value());
  ASSERT_TRUE(agg.AddProfile(1, Window(1, 2, 3, 10))->has_value());
  EXPECT_EQ(agg.open_windows(), 0);
  absl::StatusOr<std::optional<Profile>> late =
      agg.AddProfile(1, Window(1, 0, 1, 10));
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_FALSE(late->has_value());
  EXPECT_EQ(agg.open_windows(), 0);
}

TEST_F(ProfileAggregatorTest, AddProfile_SameRankTwice_ReplacesItsProfile) {
  ProfileAggregator agg(2);
  ASSERT_TRUE(agg.SetGraph(graph_).ok());
  ASSERT_FALSE(agg.AddProfile(0, Window(0, 0, 1, 50))->has_value());
  ASSERT_FALSE(agg.AddProfile(0, Window(0, 0, 1, 10))->has_value());
  absl::StatusOr<std::optional<Profile>> r =
      agg.AddProfile(1, Window(1, 0, 1, 20));
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_DOUBLE_EQ((*r)->iteration_s, 20e-3);
}

TEST_F(ProfileAggregatorTest, AddProfile_ManyOpenWindows_OldestDropped) {
  ProfileAggregator agg(2);
  ASSERT_TRUE(agg.SetGraph(graph_).ok());
  for (int w = 0; w <= ProfileAggregator::kMaxOpenWindows; ++w) {
    ASSERT_FALSE(
        agg.AddProfile(0, Window(0, 2 * w, 2 * w + 1, 10))->has_value());
  }
  EXPECT_EQ(agg.open_windows(), ProfileAggregator::kMaxOpenWindows);
  // Window 0 was dropped, and is too old to open again.
  const int newest = 2 * ProfileAggregator::kMaxOpenWindows;
  ASSERT_FALSE(agg.AddProfile(1, Window(1, 0, 1, 10))->has_value());
  EXPECT_EQ(agg.open_windows(), ProfileAggregator::kMaxOpenWindows);
  ASSERT_TRUE(
      agg.AddProfile(1, Window(1, newest, newest + 1, 10))->has_value());
  EXPECT_EQ(agg.open_windows(), 0);
}

// The per-job quota on profiles held awaiting other ranks: a profile that
// would pass it is refused with the figures, what completes a window is
// never held, and what leaves frees its bytes.
TEST_F(ProfileAggregatorTest, AddProfile_PastHeldBytesQuota_Refused) {
  const int64_t one = ProfileAggregator::ProfileBytes(Window(0, 0, 1, 10));
  ProfileAggregator agg(2, 2 * one + one / 2);
  ASSERT_TRUE(agg.SetGraph(graph_).ok());
  ASSERT_FALSE(agg.AddProfile(0, Window(0, 0, 1, 10))->has_value());
  ASSERT_FALSE(agg.AddProfile(0, Window(0, 2, 3, 10))->has_value());
  EXPECT_EQ(agg.held_bytes(), 2 * one);
  absl::StatusOr<std::optional<Profile>> third =
      agg.AddProfile(0, Window(0, 4, 5, 10));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()),
              HasSubstr("past the per-job quota of"));
  EXPECT_THAT(std::string(third.status().message()),
              HasSubstr("2 open windows"));
  EXPECT_EQ(agg.open_windows(), 2);
  // Replacing its own profile of an open window adds nothing.
  EXPECT_TRUE(agg.AddProfile(0, Window(0, 2, 3, 12)).ok());
  // Rank 1 completes the newer window: both leave, nothing is held.
  ASSERT_TRUE(agg.AddProfile(1, Window(1, 2, 3, 10))->has_value());
  EXPECT_EQ(agg.open_windows(), 0);
  EXPECT_EQ(agg.held_bytes(), 0);
  ASSERT_FALSE(agg.AddProfile(0, Window(0, 4, 5, 10))->has_value());
  EXPECT_EQ(agg.held_bytes(), one);
}

TEST_F(ProfileAggregatorTest, AddProfile_InvalidProfile_RejectedNotCounted) {
  ProfileAggregator agg(2);
  ASSERT_TRUE(agg.SetGraph(graph_).ok());
  Profile other = Window(0, 0, 1, 10);
  other.graph_hash = "0123456789abcdef";
  absl::StatusOr<std::optional<Profile>> r = agg.AddProfile(0, other);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("profile from rank 0: profile was measured on graph "
                        "0123456789abcdef"));
  Profile unknown_node = Window(0, 0, 1, 10);
  unknown_node.nodes[0].node_id = 99;
  EXPECT_EQ(agg.AddProfile(0, unknown_node).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(agg.AddProfile(2, Window(0, 0, 1, 10)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Rank 1 alone completes nothing: rank 0's rejected profiles never counted.
  ASSERT_FALSE(agg.AddProfile(1, Window(1, 0, 1, 10))->has_value());
  EXPECT_EQ(agg.open_windows(), 1);
}

// The one way in from the wire: bounded and converted once.
TEST_F(ProfileAggregatorTest, Decode_OverTheBoundOrUnconvertible_Refused) {
  v1::Profile proto = ToProto(Window(1, 0, 1, 10));
  absl::StatusOr<Profile> ok = ProfileAggregator::Decode(1, proto);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(*ok == Window(1, 0, 1, 10));
  v1::Profile huge = proto;
  for (int i = 0; i < ProfileAggregator::kMaxProfileEntries; ++i) {
    huge.add_memory()->set_node_id(0);
  }
  absl::StatusOr<Profile> r = ProfileAggregator::Decode(1, huge);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("profile from rank 1 has 200001 entries; at most "
                        "200000 are accepted: send shorter windows"));
  v1::Profile unknown_kind = proto;
  unknown_kind.add_collectives()->set_node_id(1);  // kind unspecified
  EXPECT_EQ(ProfileAggregator::Decode(1, unknown_kind).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The aggregate of profiles valid for the graph is valid too: every rule
// ValidateProfile checks survives the combination (maxima, minima, the
// pace's pairs), which is why the planner reads it without checking again
// (README.md, "The path of a profile"). Ranks measured with every time,
// size and split drawn at random within each rank's own rules.
TEST_F(ProfileAggregatorTest, AggregateOfValidProfiles_IsValid) {
  const Profile base = P(absl::StrReplaceAll(ReadTestData("tiny_profile.txt"),
                                             {{"2526b90883cc6176", "$hash"}}));
  std::mt19937 rng(7);
  auto scale = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 50; ++trial) {
    SCOPED_TRACE(trial);
    std::map<int32_t, Profile> by_rank;
    for (int32_t rank : {0, 1, 2}) {
      Profile p = base;
      p.rank = rank;
      p.iteration_s *= scale(0.5, 2);
      p.peak_bytes = static_cast<int64_t>(p.peak_bytes * scale(0.5, 2));
      p.peak_min_bytes = static_cast<int64_t>(p.peak_bytes * scale(0.5, 1));
      for (NodeTiming& t : p.nodes) {
        t.time_s *= scale(0.5, 2);
        t.allgather_overlap_bytes = static_cast<int64_t>(scale(0, 1e6));
      }
      for (CollectiveTiming& c : p.collectives) {
        c.issue_to_done_s *= scale(0.5, 2);
        c.exposed_s = c.issue_to_done_s * scale(0, 1);
        c.run_s = c.issue_to_done_s * scale(0.2, 1);
        c.computing_s = c.run_s * scale(0, 1);
      }
      for (MemorySample& m : p.memory) {
        m.before_bytes = static_cast<int64_t>(m.before_bytes * scale(0.5, 2));
        m.after_bytes = static_cast<int64_t>(m.after_bytes * scale(0.5, 2));
      }
      ASSERT_TRUE(ValidateProfile(p, graph_).ok())
          << ValidateProfile(p, graph_);
      by_rank[rank] = std::move(p);
    }
    absl::StatusOr<Profile> aggregate = AggregateProfiles(by_rank);
    ASSERT_TRUE(aggregate.ok()) << aggregate.status();
    EXPECT_TRUE(ValidateProfile(*aggregate, graph_).ok())
        << ValidateProfile(*aggregate, graph_);
  }
}

TEST_F(ProfileAggregatorTest, SetGraph_AfterEarlyProfiles_FlushesThem) {
  ProfileAggregator agg(2);
  EXPECT_EQ(agg.graph(), nullptr);
  ASSERT_FALSE(agg.AddProfile(1, Window(1, 0, 1, 30, 2.0))->has_value());
  ASSERT_FALSE(agg.AddProfile(0, Window(0, 0, 1, 20, 4.0))->has_value());
  ASSERT_FALSE(agg.AddProfile(0, Window(0, 2, 3, 20))->has_value());
  EXPECT_EQ(agg.held_profiles(), 3);
  EXPECT_EQ(agg.open_windows(), 0);

  absl::StatusOr<ProfileAggregator::GraphAccepted> accepted =
      agg.SetGraph(graph_);
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_TRUE(accepted->is_new);
  EXPECT_THAT(accepted->dropped, IsEmpty());
  ASSERT_EQ(accepted->completed.size(), 1u);
  const Profile& aggregate = accepted->completed[0];
  EXPECT_EQ(aggregate.last_iteration, 1);
  EXPECT_DOUBLE_EQ(aggregate.iteration_s, 30e-3);
  EXPECT_DOUBLE_EQ(aggregate.nodes[0].time_s, 4e-3);
  EXPECT_EQ(agg.held_profiles(), 0);
  EXPECT_EQ(agg.open_windows(), 1);  // 2..3, rank 0 only
  ASSERT_NE(agg.graph(), nullptr);
  EXPECT_EQ(agg.graph_hash(), hash_);
}

TEST_F(ProfileAggregatorTest, AddProfile_BeforeGraph_BoundedPerRank) {
  ProfileAggregator agg(2);
  for (int i = 0; i < ProfileAggregator::kMaxEarlyProfilesPerRank; ++i) {
    ASSERT_TRUE(agg.AddProfile(0, Window(0, 2 * i, 2 * i + 1, 10)).ok());
  }
  absl::StatusOr<std::optional<Profile>> refused =
      agg.AddProfile(0, Window(0, 100, 101, 10));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            "rank 0 sent more than 4 profiles before the graph: rank 0 must "
            "report the graph first");
  // Another rank's allowance is its own.
  EXPECT_TRUE(agg.AddProfile(1, Window(1, 0, 1, 10)).ok());
  EXPECT_EQ(agg.held_profiles(),
            ProfileAggregator::kMaxEarlyProfilesPerRank + 1);
}

TEST_F(ProfileAggregatorTest, SetGraph_EarlyProfileInvalid_DroppedWithReason) {
  ProfileAggregator agg(2);
  Profile other = Window(1, 0, 1, 10);
  other.graph_hash = "0123456789abcdef";
  ASSERT_TRUE(agg.AddProfile(1, other).ok());  // unchecked until the graph
  ASSERT_TRUE(agg.AddProfile(0, Window(0, 0, 1, 10)).ok());
  absl::StatusOr<ProfileAggregator::GraphAccepted> accepted =
      agg.SetGraph(graph_);
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_THAT(accepted->completed, IsEmpty());
  ASSERT_EQ(accepted->dropped.size(), 1u);
  EXPECT_THAT(accepted->dropped[0],
              HasSubstr("profile from rank 1: profile was measured on graph "
                        "0123456789abcdef"));
  EXPECT_EQ(agg.open_windows(), 1);
}

TEST_F(ProfileAggregatorTest, CheckHash_Mismatch_NamesRankAndBothHashes) {
  ProfileAggregator agg(2);
  ASSERT_TRUE(agg.SetGraph(graph_).ok());
  EXPECT_TRUE(agg.CheckHash(1, hash_).ok());
  const absl::Status s = agg.CheckHash(1, "00000000deadbeef");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "graph hash mismatch: rank 1 built graph 00000000deadbeef but "
            "rank 0 built " +
                hash_ +
                "; every rank must build the same model from the same spec");
}

TEST_F(ProfileAggregatorTest, SetGraph_EarlyHashDiffers_FailsNamingTheRank) {
  ProfileAggregator agg(3);
  ASSERT_TRUE(agg.CheckHash(1, hash_).ok());
  ASSERT_TRUE(agg.CheckHash(2, "00000000deadbeef").ok());  // held
  ASSERT_TRUE(agg.AddProfile(1, Window(1, 0, 1, 10)).ok());
  absl::StatusOr<ProfileAggregator::GraphAccepted> accepted =
      agg.SetGraph(graph_);
  EXPECT_EQ(accepted.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      std::string(accepted.status().message()),
      HasSubstr("rank 2 built graph 00000000deadbeef but rank 0 built " +
                hash_));
  // Rank 0's graph stays the reference; nothing held survives.
  EXPECT_EQ(agg.graph_hash(), hash_);
  EXPECT_EQ(agg.held_profiles(), 0);
  EXPECT_EQ(agg.open_windows(), 0);
}

TEST_F(ProfileAggregatorTest, SetGraph_Again_SameIsNoOpDifferentFails) {
  ProfileAggregator agg(2);
  ASSERT_TRUE(agg.SetGraph(graph_).ok());
  absl::StatusOr<ProfileAggregator::GraphAccepted> again = agg.SetGraph(graph_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->is_new);
  Graph other = graph_;
  other.params[1].shape[0] = 128;
  ASSERT_NE(other.StructuralHash(), hash_);
  absl::StatusOr<ProfileAggregator::GraphAccepted> changed =
      agg.SetGraph(other);
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(changed.status().message()),
              HasSubstr("rank 0 reported graph " + other.StructuralHash() +
                        " after graph " + hash_));
  EXPECT_EQ(agg.graph_hash(), hash_);
}

TEST_F(ProfileAggregatorTest, SetGraph_Malformed_InvalidArgumentKeepsNone) {
  absl::StatusOr<Graph> bad = ParseGraph(R"(
graph bad world=2 micro_batches=1 tokens=16
param p0 w f32[4,4] unit=a
node n0 a fwd params=p0 time=1ms
node n1 step opt params=p0 time=1ms
)");
  ASSERT_TRUE(bad.ok()) << bad.status();
  ProfileAggregator agg(2);
  absl::StatusOr<ProfileAggregator::GraphAccepted> accepted =
      agg.SetGraph(*bad);
  EXPECT_EQ(accepted.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(accepted.status().message()),
              HasSubstr("rank 0 sent a malformed graph"));
  EXPECT_EQ(agg.graph(), nullptr);
}

// Every measured field aggregates by its table's rule (common/ir/profile.cc),
// so a new field needs no aggregator code: rank 0 reports the smaller
// value, rank 1 the larger; a kWithPace field follows the record's pace.
template <typename Record>
Record& FieldTarget(Profile& p);
template <>
Profile& FieldTarget<Profile>(Profile& p) {
  return p;
}
template <>
NodeTiming& FieldTarget<NodeTiming>(Profile& p) {
  return p.nodes[0];
}
template <>
CollectiveTiming& FieldTarget<CollectiveTiming>(Profile& p) {
  return p.collectives[0];
}
template <>
MemorySample& FieldTarget<MemorySample>(Profile& p) {
  return p.memory[0];
}

template <typename Record>
void ExpectTableRules(absl::Span<const ProfileField<Record>> fields) {
  for (const ProfileField<Record>& f : fields) {
    if (f.combine == Combine::kOwnRule) continue;
    SCOPED_TRACE(std::string(f.proto_name));
    // Two ranks with one node, one collective and one memory sample each;
    // every field 0 but the one under test (and the pace fields, which
    // rank 1 leads unless the field under test is one).
    std::map<int32_t, Profile> by_rank;
    for (int32_t rank : {0, 1}) {
      Profile p;
      p.rank = rank;
      p.first_iteration = 0;
      p.last_iteration = 1;
      p.nodes = {NodeTiming{}};
      p.collectives = {CollectiveTiming{}};
      p.memory = {MemorySample{}};
      Record& r = FieldTarget<Record>(p);
      for (const ProfileField<Record>& pace : fields) {
        if (pace.combine == Combine::kPace) {
          SetFieldValue(pace, rank == 0 ? 1 : 2, &r);
        }
      }
      const double lo = f.bounds.lo > 0 ? f.bounds.lo : 1;
      SetFieldValue(f, rank == 0 ? lo : lo + 1, &r);
      by_rank[rank] = p;
    }
    absl::StatusOr<Profile> out = AggregateProfiles(by_rank);
    ASSERT_TRUE(out.ok()) << out.status();
    const double got = FieldValue(FieldTarget<Record>(*out), f);
    const double lo = f.bounds.lo > 0 ? f.bounds.lo : 1;
    switch (f.combine) {
      case Combine::kFirst:
        EXPECT_EQ(got, lo);
        break;
      case Combine::kMinPositive:
        EXPECT_EQ(got, lo);
        break;
      case Combine::kMax:
      case Combine::kPace:
      case Combine::kWithPace:  // rank 1 leads the pace
        EXPECT_EQ(got, lo + 1);
        break;
      case Combine::kOwnRule:
        break;
    }
  }
}

TEST(AggregateProfilesTest, EveryTableField_CombinesByItsRule) {
  ExpectTableRules(ProfileHeaderFields());
  ExpectTableRules(NodeTimingFields());
  ExpectTableRules(CollectiveTimingFields());
  ExpectTableRules(MemorySampleFields());
}

TEST(AggregateProfilesTest, WithPace_FollowsTheRankThatSetsThePace) {
  // Rank 0 is the slower on n1 and moved fewer bytes alongside; its bytes
  // are the ones kept, paired with its time.
  std::map<int32_t, Profile> by_rank;
  for (int32_t rank : {0, 1}) {
    Profile p;
    p.rank = rank;
    p.nodes = {
        NodeTiming{1, rank == 0 ? 0.003 : 0.002, 2, rank == 0 ? 100 : 900}};
    by_rank[rank] = p;
  }
  absl::StatusOr<Profile> out = AggregateProfiles(by_rank);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->nodes[0].time_s, 0.003);
  EXPECT_EQ(out->nodes[0].allgather_overlap_bytes, 100);
}

}  // namespace
}  // namespace tandem
