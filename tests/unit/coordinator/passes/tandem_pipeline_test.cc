// The recommended Tandem pipeline (coordinator/passes/README.md) end to end:
// invariants and budget after every pass, and the bench's targets on a real
// model graph.
#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/lowering/schedule_semantics.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"
#include "coordinator/passes/invariant_checkers.h"
#include "coordinator/passes/offload_pass.h"
#include "coordinator/passes/pass_pipeline.h"
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

void AddTandemPasses(PassPipeline& pipeline) {
  pipeline.AddPass<Zero3InsertPass>();
  pipeline.AddPass<OffloadPass>();
  pipeline.AddPass<PrefetchPass>();
  pipeline.AddPass<OffloadPass>(OffloadPass::Role::kLend);
  pipeline.AddPass<UnshardPass>();
  pipeline.AddPass<OffloadPass>(OffloadPass::Role::kReturn);
  pipeline.AddPass<PrefetchPass>();
  pipeline.AddInvariantChecker<GatherBeforeUseChecker>();
  pipeline.AddInvariantChecker<NoUseAfterReleaseChecker>();
  pipeline.AddInvariantChecker<ReduceOnceChecker>();
  pipeline.AddInvariantChecker<MemoryBudgetChecker>();
}

class RecordingSink : public PassRecordSink {
 public:
  void Record(const PassRecord& record) override { records.push_back(record); }
  std::vector<PassRecord> records;
};

TEST(TandemPipelineTest, Run_OffloadFixture_FitsBudgetAfterEveryPass) {
  absl::StatusOr<Graph> graph = LoadPassGraph("offload_states.txt");
  ASSERT_TRUE(graph.ok()) << graph.status();
  PlanningContext context(*graph, PassTestHardware(0, 36000000));
  // Seeded with the on-demand plan the job starts from, as the planner does:
  // the memory checker judges every pass against it.
  Zero3InsertPass seed;
  ASSERT_TRUE(seed.Run(context).ok());
  ASSERT_TRUE(context.Resimulate().ok());
  RecordingSink sink;
  PassPipeline pipeline("tandem", &sink);
  AddTandemPasses(pipeline);

  absl::StatusOr<bool> changed = pipeline.Run(context);

  ASSERT_TRUE(changed.ok()) << changed.status();
  ASSERT_EQ(sink.records.size(), 7u);
  EXPECT_FALSE(sink.records[0].changed);
  EXPECT_EQ(sink.records[1].pass, "offload");
  EXPECT_TRUE(sink.records[1].changed);
  for (size_t i = 1; i < sink.records.size(); ++i) {
    EXPECT_LE(sink.records[i].peak_after_bytes, 36000000)
        << sink.records[i].pass;
  }
  // Offloading costs no time here; prefetch and unshard then save some.
  EXPECT_LT(context.sim().iteration_s, sink.records[0].iteration_after_s);
  EXPECT_TRUE(CheckScheduleSemantics(*graph, context.schedule()).ok());
}

struct ModelCase {
  std::string model;
  int world;
  int micro_batch;
  int seq_len;
};

class TandemPipelineModelTest : public ::testing::TestWithParam<ModelCase> {};

TEST_P(TandemPipelineModelTest, Run_PaperScaleModel_NearLowerBoundQuickly) {
  const ModelCase& c = GetParam();
  absl::StatusOr<ModelConfig> config = ParseModelConfig(absl::StrCat(
      "preset=", c.model, " micro_batch=", c.micro_batch,
      " seq_len=", c.seq_len, " checkpointing=true world=", c.world));
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Graph> graph = BuildModelGraph(*config);
  ASSERT_TRUE(graph.ok()) << graph.status();
  PlanningContext context(*graph, HardwareModel::H100(c.world));
  Zero3InsertPass seed;
  ASSERT_TRUE(seed.Run(context).ok());
  ASSERT_TRUE(context.Resimulate().ok());
  const double on_demand_s = context.sim().iteration_s;
  RecordingSink sink;
  PassPipeline pipeline("tandem", &sink);
  AddTandemPasses(pipeline);

  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<bool> changed = pipeline.Run(context);
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();

  ASSERT_TRUE(changed.ok()) << changed.status();
  const SimResult& sim = context.sim();
  EXPECT_LE(sim.peak_bytes, context.budget());
  EXPECT_LE(sim.iteration_s, 1.10 * sim.lower_bound_s);
  // Never slower than on demand.
  EXPECT_LT(sim.iteration_s, on_demand_s);
  EXPECT_LT(wall_s, 1.0);
}

INSTANTIATE_TEST_SUITE_P(
    Bench, TandemPipelineModelTest,
    ::testing::Values(ModelCase{"llama3-70b", 32, 1, 512},
                      ModelCase{"llama3-70b", 32, 4, 2048},
                      ModelCase{"llama3-70b", 16, 4, 2048},
                      ModelCase{"mixtral-8x7b", 32, 2, 1024}),
    [](const ::testing::TestParamInfo<ModelCase>& info) {
      std::string name =
          absl::StrCat(info.param.model, "_w", info.param.world, "_mb",
                       info.param.micro_batch, "_s", info.param.seq_len);
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

}  // namespace
}  // namespace tandem
