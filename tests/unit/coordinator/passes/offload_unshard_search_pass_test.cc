#include "coordinator/passes/offload_unshard_search_pass.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "common/lowering/schedule_semantics.h"
#include "coordinator/passes/offload_pass.h"
#include "coordinator/passes/planning_context.h"
#include "coordinator/passes/prefetch_pass.h"
#include "coordinator/passes/unshard_pass.h"
#include "coordinator/passes/zero3_insert_pass.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/passes/pass_test_util.h"

namespace tandem {
namespace {

using ::tandem::testing::LoadPassGraph;
using ::tandem::testing::PassTestHardware;

// offload_unshard_search.txt: on-demand peak 38975616 bytes at the head's
// workspace; this budget leaves ~1 MB of headroom after prefetch.
constexpr int64_t kBudget = 40000000;

// ALLGATHERs per group name ("a", "b", "c": each group holds one block).
std::map<std::string, int> GathersPerBlock(const Graph& graph,
                                           const Schedule& schedule) {
  std::map<int32_t, std::string> block_of_group;
  for (const GatherGroup& g : schedule.groups) {
    block_of_group[g.id] = graph.params[g.param_ids.front()].unit;
  }
  std::map<std::string, int> gathers;
  for (const Action& a : schedule.actions) {
    if (a.kind == ActionKind::kAllGather) ++gathers[block_of_group[a.group_id]];
  }
  return gathers;
}

int64_t OffloadedBytes(const Schedule& schedule) {
  int64_t bytes = 0;
  for (const OffloadEntry& e : schedule.offloads) bytes += e.bytes;
  return bytes;
}

class OffloadUnshardSearchTest : public ::testing::Test {
 protected:
  // The pipeline up to the search: zero3-insert, offload, prefetch.
  std::unique_ptr<PlanningContext> Prefetched(const std::string& fixture,
                                              int64_t budget) {
    absl::StatusOr<Graph> graph = LoadPassGraph(fixture);
    EXPECT_TRUE(graph.ok()) << graph.status();
    graph_ = *graph;
    PlannerOptions options;
    options.memory_margin = 0;
    auto context = std::make_unique<PlanningContext>(
        graph_, PassTestHardware(/*latency_s=*/0, budget), options);
    Zero3InsertPass insert;
    EXPECT_TRUE(insert.Run(*context).ok());
    EXPECT_TRUE(context->Resimulate().ok());
    OffloadPass offload;
    EXPECT_TRUE(offload.Run(*context).ok());
    PrefetchPass prefetch;
    EXPECT_TRUE(prefetch.Run(*context).ok());
    EXPECT_TRUE(context->Resimulate().ok());
    return context;
  }

  // The fixed order the search replaces (no gradient accumulation here).
  static void RunFixedOrder(PlanningContext& context) {
    OffloadPass lend(OffloadPass::Role::kLend);
    UnshardPass unshard;
    OffloadPass give_back(OffloadPass::Role::kReturn);
    PrefetchPass prefetch;
    for (PlanningPass* pass : std::initializer_list<PlanningPass*>{
             &lend, &unshard, &give_back, &prefetch}) {
      absl::StatusOr<bool> changed = pass->Run(context);
      ASSERT_TRUE(changed.ok()) << pass->name() << ": " << changed.status();
      ASSERT_TRUE(context.Resimulate().ok());
    }
  }

  Graph graph_;
};

TEST_F(
    OffloadUnshardSearchTest,
    Run_ComputeBoundTightBudget_OffloadsStatesToKeepBlocksTheFixedOrderCannot) {
  std::unique_ptr<PlanningContext> fixed =
      Prefetched("offload_unshard_search.txt", kBudget);
  ASSERT_LT(fixed->sim().comm_s, fixed->sim().compute_s);  // compute-bound
  std::unique_ptr<PlanningContext> searched =
      Prefetched("offload_unshard_search.txt", kBudget);

  RunFixedOrder(*fixed);
  OffloadUnshardSearchPass search;
  absl::StatusOr<bool> changed = search.Run(*searched);

  // The fixed order does not lend (the plan is compute-bound), so unshard
  // has ~1 MB of headroom: nothing is kept and b.bwd waits for b's gather.
  EXPECT_EQ(OffloadedBytes(fixed->schedule()), 0);
  EXPECT_EQ(GathersPerBlock(graph_, fixed->schedule()),
            (std::map<std::string, int>{{"a", 2}, {"b", 2}, {"c", 2}}));
  EXPECT_NEAR(fixed->sim().iteration_s, 0.076, 1e-9);
  // The search lends a's and b's states (8e6 bytes on the host at the
  // turn) and unshard keeps a and b gathered from
  // forward to backward: 3 ms less exposed communication.
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_EQ(OffloadedBytes(searched->schedule()), 8000000);
  EXPECT_EQ(GathersPerBlock(graph_, searched->schedule()),
            (std::map<std::string, int>{{"a", 1}, {"b", 1}, {"c", 2}}));
  EXPECT_NEAR(searched->sim().iteration_s, 0.073, 1e-9);
  EXPECT_LE(searched->sim().peak_bytes, kBudget);
  EXPECT_TRUE(CheckScheduleSemantics(graph_, searched->schedule()).ok())
      << CheckScheduleSemantics(graph_, searched->schedule());
  EXPECT_EQ(search.name(), "offload-unshard-search");
}

TEST_F(OffloadUnshardSearchTest, Run_EveryFixture_NeverSlowerThanFixedOrder) {
  for (const auto& [fixture, budget] :
       std::vector<std::pair<std::string, int64_t>>{
           {"offload_unshard_search.txt", kBudget},
           {"offload_unshard_search.txt", 44000000},
           {"offload_lend.txt", 40000000},
           {"offload_states.txt", 36000000},
           {"unshard_knapsack.txt", 0},
           {"unshard_hold.txt", 0}}) {
    std::unique_ptr<PlanningContext> fixed = Prefetched(fixture, budget);
    std::unique_ptr<PlanningContext> searched = Prefetched(fixture, budget);
    RunFixedOrder(*fixed);
    OffloadUnshardSearchPass search;
    absl::StatusOr<bool> changed = search.Run(*searched);
    ASSERT_TRUE(changed.ok()) << fixture << ": " << changed.status();
    EXPECT_LE(searched->sim().iteration_s,
              fixed->sim().iteration_s * (1 + 1e-9))
        << fixture << " budget " << budget;
    EXPECT_LE(searched->sim().peak_bytes,
              std::max(searched->budget(), fixed->sim().peak_bytes))
        << fixture;
    EXPECT_TRUE(CheckScheduleSemantics(graph_, searched->schedule()).ok())
        << fixture;
  }
}

TEST_F(OffloadUnshardSearchTest,
       Run_Explaining_RecordsTheSamePlansDecisionsAndNamesTheChoice) {
  std::unique_ptr<PlanningContext> quiet =
      Prefetched("offload_unshard_search.txt", kBudget);
  std::unique_ptr<PlanningContext> explained =
      Prefetched("offload_unshard_search.txt", kBudget);
  explained->decisions().Start(explained->sim());
  OffloadUnshardSearchPass search;

  ASSERT_TRUE(search.Run(*quiet).ok());
  ASSERT_TRUE(search.Run(*explained).ok());

  EXPECT_EQ(explained->schedule(), quiet->schedule());
  const std::vector<Decision>& decisions =
      explained->decisions().explanation().decisions;
  ASSERT_FALSE(decisions.empty());
  bool lent = false;
  bool kept = false;
  for (const Decision& d : decisions) {
    // Under the search's name: the provenance names it, not its passes.
    EXPECT_EQ(d.pass, "offload-unshard-search") << d.what;
    lent = lent || d.kind == DecisionKind::kOffload;
    kept = kept || d.kind == DecisionKind::kKeep;
  }
  EXPECT_TRUE(lent);
  EXPECT_TRUE(kept);
  const Decision& last = decisions.back();
  EXPECT_EQ(last.pass, "offload-unshard-search");
  EXPECT_EQ(last.kind, DecisionKind::kPass);
  // Lending a's and b's states (the largest half) is as fast as lending
  // all, at a lower peak.
  EXPECT_TRUE(absl::StrContains(last.what, "largest 50% of the optimizer"))
      << last.what;
  EXPECT_TRUE(absl::StrContains(last.what, "fixed order gives 0.0760 s"))
      << last.what;
}

}  // namespace
}  // namespace tandem
