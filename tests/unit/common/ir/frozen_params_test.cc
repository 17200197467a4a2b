// Frozen params (Param::trainable false) through the shared contract: the
// IR's forms and hash, validation, the starting schedules (no reduction and
// no optimizer state for them), the least-memory plan and the semantic
// checks that refuse a frozen param reduced.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/ir/graph.h"
#include "common/ir/proto_convert.h"
#include "common/ir/text_format.h"
#include "common/ir/validate.h"
#include "common/lowering/anchored_schedule.h"
#include "common/lowering/gradient_reduction.h"
#include "common/lowering/least_memory.h"
#include "common/lowering/lowering.h"
#include "common/lowering/schedule_semantics.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

Graph Tiny(int grad_accum) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(
      "preset=tiny-llama world=2 grad_accum=" + std::to_string(grad_accum));
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Graph> graph = BuildModelGraph(*config);
  EXPECT_TRUE(graph.ok()) << graph.status();
  return *graph;
}

// The embedding and the first block frozen, as a fine-tuning job would.
std::vector<int32_t> Freeze(Graph& graph) {
  std::vector<int32_t> frozen;
  for (Param& p : graph.params) {
    if (p.id == 0 || absl::StartsWith(p.name, "layers.0.")) {
      p.trainable = false;
      frozen.push_back(p.id);
    }
  }
  EXPECT_GE(frozen.size(), 2u);
  EXPECT_LT(frozen.size(), graph.params.size());
  return frozen;
}

bool Contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

int Reduces(const Schedule& s, int32_t id) {
  int n = 0;
  for (const Action& a : s.actions) {
    if (a.kind == ActionKind::kReduceScatter && Contains(a.param_ids, id)) ++n;
  }
  return n;
}

TEST(FrozenParamsTest,
     StructuralHash_AllTrained_UnchangedAndFreezingChangesIt) {
  Graph graph = Tiny(1);
  const std::string trained = graph.StructuralHash();
  // The same graph with the flag spelled out hashes the same.
  for (Param& p : graph.params) p.trainable = true;
  EXPECT_EQ(graph.StructuralHash(), trained);
  graph.params[0].trainable = false;
  const std::string first = graph.StructuralHash();
  EXPECT_NE(first, trained);
  graph.params[0].trainable = true;
  graph.params[1].trainable = false;
  EXPECT_NE(graph.StructuralHash(), first);
  EXPECT_NE(graph.StructuralHash(), trained);
}

TEST(FrozenParamsTest, TextAndProto_RoundTripTheFlag) {
  Graph graph = Tiny(1);
  const std::vector<int32_t> frozen = Freeze(graph);
  const std::string text = PrintGraph(graph);
  EXPECT_THAT(text, HasSubstr(" frozen\n"));
  absl::StatusOr<Graph> parsed = ParseGraph(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, graph);
  EXPECT_EQ(parsed->StructuralHash(), graph.StructuralHash());

  const v1::Graph proto = ToProto(graph);
  for (const v1::Param& p : proto.params()) {
    EXPECT_EQ(p.frozen(), Contains(frozen, p.id())) << p.name();
  }
  absl::StatusOr<Graph> back = FromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, graph);

  // A trained param prints no flag, and `frozen` takes no value.
  EXPECT_THAT(PrintGraph(Tiny(1)), ::testing::Not(HasSubstr("frozen")));
  absl::StatusOr<Graph> bad =
      ParseGraph("graph g\nparam p0 w f32[4] frozen=yes\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("flag"));
}

TEST(FrozenParamsTest, LowerZero3_GathersFrozenParamsButNeverReducesThem) {
  for (int accum : {1, 3}) {
    Graph graph = Tiny(accum);
    const std::vector<int32_t> frozen = Freeze(graph);
    for (GradientReduction reduction :
         {GradientReduction::kOnce, GradientReduction::kPerMicroBatch}) {
      const Schedule s =
          LowerZero3(graph, {}, GatherGrouping::kPerNode, reduction);
      EXPECT_TRUE(CheckScheduleSemantics(graph, s).ok())
          << CheckScheduleSemantics(graph, s);
      for (const Param& p : graph.params) {
        const bool grouped = std::any_of(
            s.groups.begin(), s.groups.end(),
            [&](const GatherGroup& g) { return Contains(g.param_ids, p.id); });
        EXPECT_TRUE(grouped) << p.name;  // the forward reads every param
        const int expected = !p.trainable ? 0
                             : reduction == GradientReduction::kPerMicroBatch
                                 ? accum
                                 : 1;
        EXPECT_EQ(Reduces(s, p.id), expected) << p.name << " accum " << accum;
      }
    }
  }
}

TEST(FrozenParamsTest,
     LowerZero1_FrozenParamsReplicatedNeitherReducedNorRegathered) {
  Graph graph = Tiny(2);
  const std::vector<int32_t> frozen = Freeze(graph);
  const Schedule s = LowerZero1(graph, 1);
  EXPECT_EQ(s.persistent_param_ids.size(), graph.params.size());
  EXPECT_TRUE(CheckScheduleSemantics(graph, s).ok())
      << CheckScheduleSemantics(graph, s);
  for (int32_t id : frozen) {
    EXPECT_EQ(Reduces(s, id), 0);
    for (const GatherGroup& g : s.groups) {
      EXPECT_FALSE(Contains(g.param_ids, id)) << "g" << g.id;
    }
  }
  for (const Param& p : graph.params) {
    if (p.trainable) EXPECT_EQ(Reduces(s, p.id), 1) << p.name;
  }
}

TEST(FrozenParamsTest, LeastMemory_OffloadsOnlyTrainedStates) {
  Graph graph = Tiny(2);
  const std::vector<int32_t> frozen = Freeze(graph);
  for (ShardingMode mode : {ShardingMode::kZero3, ShardingMode::kZero1}) {
    absl::StatusOr<Schedule> s = LeastMemorySchedule(graph, mode);
    ASSERT_TRUE(s.ok()) << s.status();
    Schedule published = *s;
    published.version = 0;
    EXPECT_TRUE(ValidateSchedule(published, graph).ok())
        << ValidateSchedule(published, graph);
    EXPECT_TRUE(CheckScheduleSemantics(graph, *s).ok());
    size_t offloaded = 0;
    for (const OffloadEntry& o : s->offloads) {
      for (int32_t id : o.param_ids) {
        EXPECT_FALSE(Contains(frozen, id)) << "o" << o.id;
        ++offloaded;
      }
    }
    EXPECT_EQ(offloaded, graph.params.size() - frozen.size());
    for (int32_t id : frozen) EXPECT_EQ(Reduces(*s, id), 0);
  }
  EXPECT_EQ(ParamStateBytes(graph.params[0], 2), 0);
  EXPECT_GT(ParamStateBytes(graph.params.back(), 2), 0);
}

TEST(FrozenParamsTest, SetGradientReduction_LeavesFrozenParamsAlone) {
  Graph graph = Tiny(2);
  const std::vector<int32_t> frozen = Freeze(graph);
  Schedule s = LowerZero3(graph, {});
  std::vector<int32_t> all;
  for (const Param& p : graph.params) all.push_back(p.id);
  SetGradientReduction(graph, all, GradientReduction::kPerMicroBatch, s);
  EXPECT_TRUE(CheckScheduleSemantics(graph, s).ok());
  for (int32_t id : frozen) EXPECT_EQ(Reduces(s, id), 0);
  EXPECT_EQ(Reduces(s, graph.params.back().id), 2);
  EXPECT_TRUE(GradientProductions(graph)[0].empty());
}

TEST(FrozenParamsTest, Semantics_FrozenParamReduced_IsAnErrorNamingIt) {
  Graph graph = Tiny(1);
  Freeze(graph);
  // The schedule of the same model with every param trained reduces p0.
  Graph trained = Tiny(1);
  Schedule s = LowerZero3(trained, {});
  s.graph_hash = graph.StructuralHash();
  ASSERT_EQ(Reduces(s, 0), 1);
  const absl::Status status = CheckScheduleSemantics(graph, s);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("is frozen (it has no gradient)"));
  EXPECT_THAT(status.message(), HasSubstr("p0 '" + graph.params[0].name));
  const std::vector<Violation> v = FindReduceViolations(graph, s);
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v[0].kind, ViolationKind::kReduceCount);
}

TEST(FrozenParamsTest, ValidateSchedule_OffloadOfFrozenState_IsRefused) {
  Graph graph = Tiny(1);
  Freeze(graph);
  Schedule s = LowerZero3(graph, {});
  s.offloads = {{0, {0}, 64}};
  const absl::Status status = ValidateSchedule(s, graph);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("o0 names frozen param p0"));
  EXPECT_THAT(status.message(), HasSubstr("no optimizer state"));
}

}  // namespace
}  // namespace tandem
