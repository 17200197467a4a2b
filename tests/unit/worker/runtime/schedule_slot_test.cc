#include "worker/runtime/schedule_slot.h"

#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

Schedule Version(int64_t v) {
  Schedule s;
  s.version = v;
  return s;
}

TEST(ScheduleSlotTest, Agree_AllRanksHoldVersion_Switches) {
  ScheduleSlot slot(Version(1));
  ASSERT_TRUE(slot.Offer(Version(2), 0).ok());
  const ScheduleReport mine = slot.Report();
  EXPECT_EQ(mine.pending_version, 2);
  const Schedule* next = slot.Agree({mine, mine, mine}, 1);
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->version, 2);
  EXPECT_EQ(slot.active().version, 2);
  EXPECT_EQ(slot.Report().pending_version, 0);
}

TEST(ScheduleSlotTest, Agree_OneRankLacksIt_Waits) {
  ScheduleSlot slot(Version(1));
  ASSERT_TRUE(slot.Offer(Version(2), 0).ok());
  const ScheduleReport mine = slot.Report();
  EXPECT_EQ(slot.Agree({mine, ScheduleReport{}}, 1), nullptr);
  EXPECT_EQ(slot.active().version, 1);
  // Next boundary the other rank has it too.
  const ScheduleReport again = slot.Report();
  EXPECT_NE(slot.Agree({again, again}, 2), nullptr);
}

TEST(ScheduleSlotTest, Agree_BeforeNotBefore_Waits) {
  ScheduleSlot slot(Version(1));
  ASSERT_TRUE(slot.Offer(Version(2), 3).ok());
  ScheduleReport r = slot.Report();
  EXPECT_EQ(slot.Agree({r, r}, 2), nullptr);
  r = slot.Report();
  EXPECT_NE(slot.Agree({r, r}, 3), nullptr);
}

TEST(ScheduleSlotTest, OfferBetweenReportAndAgree_DecidesOnReported) {
  ScheduleSlot slot(Version(1));
  ASSERT_TRUE(slot.Offer(Version(2), 0).ok());
  const ScheduleReport r = slot.Report();
  ASSERT_TRUE(slot.Offer(Version(3), 0).ok());  // arrives mid-exchange
  const Schedule* next = slot.Agree({r, r}, 1);
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->version, 2);                  // what every rank agreed on
  EXPECT_EQ(slot.Report().pending_version, 3);  // v3 still pending
}

TEST(ScheduleSlotTest, Offer_NotNewer_Rejected) {
  ScheduleSlot slot(Version(4));
  EXPECT_EQ(slot.Offer(Version(4), 0).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(slot.Offer(Version(6), 0).ok());
  EXPECT_FALSE(slot.Offer(Version(5), 0).ok());
}

TEST(ScheduleSlotTest, Agree_OneRankNearBudget_AllSwitchToFallback) {
  ScheduleSlot slot(Version(1), Version(-1));
  ASSERT_TRUE(slot.Offer(Version(2), 0).ok());
  const ScheduleReport mine = slot.Report(/*near_budget=*/false);
  ScheduleReport other = mine;
  other.near_budget = true;
  // Every rank decides on the same reports: the fallback wins over v2.
  const Schedule* next = slot.Agree({mine, other}, 1);
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->version, -1);
  EXPECT_TRUE(slot.fallback_active());
  // v2 was planned before the guard tripped: dropped, and not offered again.
  EXPECT_EQ(slot.Report().pending_version, 0);
  EXPECT_FALSE(slot.Offer(Version(2), 0).ok());
  // Near again under the fallback: nothing to switch to.
  const ScheduleReport near = slot.Report(true);
  EXPECT_EQ(slot.Agree({near, near}, 2), nullptr);
  // The coordinator's next plan replaces the fallback the usual way.
  ASSERT_TRUE(slot.Offer(Version(3), 0).ok());
  const ScheduleReport r = slot.Report();
  next = slot.Agree({r, r}, 3);
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->version, 3);
  EXPECT_FALSE(slot.fallback_active());
}

TEST(ScheduleSlotTest, Agree_NearBudgetWithoutFallback_KeepsSchedule) {
  ScheduleSlot slot(Version(1));
  const ScheduleReport near = slot.Report(true);
  EXPECT_EQ(slot.Agree({near, near}, 1), nullptr);
  EXPECT_EQ(slot.active().version, 1);
}

// The versions active at iterations first..first+count-1, each boundary
// agreed with every rank reporting the same.
std::vector<int64_t> RunVersions(ScheduleSlot& slot, int64_t first, int count) {
  std::vector<int64_t> out;
  for (int64_t i = first; i < first + count; ++i) {
    const ScheduleReport r = slot.Report();
    slot.Agree({r, r}, i);
    out.push_back(slot.active().version);
  }
  return out;
}

// A comparison: v2 offered with v1 as its incumbent, blocks of 2, takes
// effect at iteration 5 and alternates v2 v2 v1 v1 v2 v2 ... from there, a
// function of the iteration alone. A newer plan ends it.
TEST(ScheduleSlotTest, Offer_WithIncumbent_AlternatesInBlocks) {
  ScheduleSlot slot(Version(1));
  ASSERT_TRUE(slot.Offer(Version(2), 5, Version(1), 2).ok());
  EXPECT_FALSE(slot.alternating());
  EXPECT_EQ(RunVersions(slot, 3, 10),
            (std::vector<int64_t>{1, 1, 2, 2, 1, 1, 2, 2, 1, 1}));
  EXPECT_TRUE(slot.alternating());
  // v3 is newer than the candidate, whichever of the two runs now.
  ASSERT_TRUE(slot.Offer(Version(3), 0).ok());
  EXPECT_EQ(RunVersions(slot, 13, 4), (std::vector<int64_t>{3, 3, 3, 3}));
  EXPECT_FALSE(slot.alternating());
}

// Only a schedule newer than the candidate replaces a comparison, even on
// the incumbent's turn; a bad alternation is refused.
TEST(ScheduleSlotTest, Offer_DuringComparison_OlderThanCandidateRefused) {
  ScheduleSlot slot(Version(4));
  EXPECT_EQ(slot.Offer(Version(5), 0, Version(4), 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(slot.Offer(Version(5), 0, Version(6), 3).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(slot.Offer(Version(5), 0, Version(4), 1).ok());
  EXPECT_EQ(RunVersions(slot, 1, 2), (std::vector<int64_t>{5, 4}));
  EXPECT_FALSE(slot.Offer(Version(5), 0).ok());
}

// A comparison with an end: two block pairs of 2, then v2 runs on by
// itself, with no newer offer.
TEST(ScheduleSlotTest, Offer_WithBlockPairs_CandidateRunsOnAfterThem) {
  ScheduleSlot slot(Version(1));
  ASSERT_TRUE(slot.Offer(Version(2), 0, Version(0), 2, 2).ok());
  EXPECT_EQ(RunVersions(slot, 1, 12),
            (std::vector<int64_t>{2, 2, 0, 0, 2, 2, 0, 0, 2, 2, 2, 2}));
  EXPECT_FALSE(slot.alternating());
  EXPECT_FALSE(slot.Offer(Version(3), 0, Version(2), 2, -1).ok());
}

// The memory guard ends a comparison: the fallback runs until the next plan.
TEST(ScheduleSlotTest, Agree_NearBudgetDuringComparison_FallbackEndsIt) {
  ScheduleSlot slot(Version(1), Version(-1));
  ASSERT_TRUE(slot.Offer(Version(2), 0, Version(1), 1).ok());
  EXPECT_EQ(RunVersions(slot, 1, 2), (std::vector<int64_t>{2, 1}));
  const ScheduleReport near = slot.Report(true);
  ASSERT_NE(slot.Agree({near, near}, 3), nullptr);
  EXPECT_TRUE(slot.fallback_active());
  EXPECT_FALSE(slot.alternating());
  EXPECT_EQ(RunVersions(slot, 4, 3), (std::vector<int64_t>{-1, -1, -1}));
}

}  // namespace
}  // namespace tandem
