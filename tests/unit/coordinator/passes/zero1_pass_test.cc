#include "coordinator/passes/zero1_pass.h"

#include <memory>

#include "common/lowering/schedule_semantics.h"
#include "coordinator/passes/planning_context.h"
#include "coordinator/passes/zero3_insert_pass.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/passes/pass_test_util.h"

namespace tandem {
namespace {

using ::tandem::testing::LoadPassGraph;
using ::tandem::testing::PassTestHardware;
using ::tandem::testing::ScheduleBody;

class Zero1PassTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Graph> graph = LoadPassGraph("offload_states.txt");
    ASSERT_TRUE(graph.ok()) << graph.status();
    graph_ = *graph;
    context_ = std::make_unique<PlanningContext>(graph_, PassTestHardware());
  }

  Graph graph_;
  std::unique_ptr<PlanningContext> context_;
};

TEST_F(Zero1PassTest, Run_ThreeMegabyteBuckets_ReducesPerBucketAndGathers) {
  Zero1Pass zero1(/*bucket_bytes=*/3000000);

  absl::StatusOr<bool> changed = zero1.Run(*context_);

  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  // c's gradient (1e6 bytes) waits for b's (2e6) to fill a bucket; a's
  // (8e6) is a bucket of its own. The updated params come back in the same
  // buckets, all gathers issued before the first wait.
  EXPECT_EQ(ScheduleBody(context_->schedule()),
            "group g0 p2,p1\n"
            "group g1 p0\n"
            "persistent p0,p1,p2\n"
            "after n4 reduce_scatter p2,p1\n"
            "after n5 reduce_scatter p0\n"
            "after n6 allgather g0\n"
            "after n6 allgather g1\n"
            "after n6 wait g0\n"
            "after n6 wait g1\n");
  EXPECT_EQ(context_->schedule().mode, ShardingMode::kZero1);
  EXPECT_TRUE(CheckScheduleSemantics(graph_, context_->schedule()).ok());
  ASSERT_TRUE(context_->Resimulate().ok());
  // Two reduce-scatters (3 and 8 ms) and two gathers (3 and 8 ms).
  EXPECT_DOUBLE_EQ(context_->sim().comm_s, 0.022);
  // Replicated params: full bytes, no gathered buffers.
  EXPECT_EQ(context_->sim().peak_breakdown.gathered_params, 0);
}

TEST_F(Zero1PassTest, Run_DefaultBucket_OneBucketAfterLastGradient) {
  Zero1Pass zero1;
  EXPECT_EQ(zero1.bucket_bytes(), int64_t{32} << 20);

  ASSERT_TRUE(zero1.Run(*context_).ok());

  EXPECT_EQ(ScheduleBody(context_->schedule()),
            "group g0 p2,p1,p0\n"
            "persistent p0,p1,p2\n"
            "after n5 reduce_scatter p2,p1,p0\n"
            "after n6 allgather g0\n"
            "after n6 wait g0\n");
}

TEST_F(Zero1PassTest, Run_AfterZero3Insert_ReplacesThePlan) {
  Zero3InsertPass insert;
  ASSERT_TRUE(insert.Run(*context_).ok());
  Zero1Pass zero1(/*bucket_bytes=*/3000000);

  absl::StatusOr<bool> changed = zero1.Run(*context_);

  ASSERT_TRUE(changed.ok());
  EXPECT_TRUE(*changed);
  EXPECT_EQ(context_->schedule().groups.size(), 2u);
  EXPECT_EQ(context_->schedule().actions.size(), 6u);
  EXPECT_TRUE(CheckScheduleSemantics(graph_, context_->schedule()).ok());
}

TEST_F(Zero1PassTest, Run_Twice_ReturnsFalseTheSecondTime) {
  Zero1Pass zero1(/*bucket_bytes=*/3000000);
  ASSERT_TRUE(zero1.Run(*context_).ok());

  absl::StatusOr<bool> changed = zero1.Run(*context_);

  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
}

}  // namespace
}  // namespace tandem
