#include "coordinator/passes/invariant_checkers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "common/lowering/schedule_semantics.h"
#include "common/models/graph_builder.h"
#include "coordinator/passes/pass_pipeline.h"
#include "coordinator/passes/zero3_insert_pass.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// A two-layer llama, world 2: n0 embed, n1 l0.attn, n2 l0.mlp, n3 l1.attn,
// n4 l1.mlp, n5 norm, n6 lm_head, n7 loss, then backward n8..n15, n16 opt.
Graph SmallGraph() {
  ModelConfig c;
  c.layers = 2;
  c.d_model = 32;
  c.heads = 2;
  c.kv_heads = 2;
  c.ffn = 64;
  c.vocab = 64;
  c.seq_len = 8;
  c.world_size = 2;
  return *BuildModelGraph(c);
}

Schedule Baseline(const Graph& g) {
  PlanningContext ctx(g, HardwareModel::H100(2));
  Zero3InsertPass pass;
  EXPECT_TRUE(pass.Run(ctx).ok());
  return ctx.schedule();
}

// Index of the first action matching kind, node and position.
size_t Find(const Schedule& s, ActionKind kind, int32_t node,
            AnchorPosition pos) {
  for (size_t i = 0; i < s.actions.size(); ++i) {
    const Action& a = s.actions[i];
    if (a.kind == kind && a.node_id == node && a.position == pos) return i;
  }
  ADD_FAILURE() << "no such action";
  return 0;
}

TEST(ScheduleInvariantsTest, Baseline_HasNoViolations) {
  const Graph g = SmallGraph();
  EXPECT_TRUE(CheckScheduleSemantics(g, Baseline(g)).ok());
}

struct Plant {
  const char* what;
  std::function<void(Schedule&)> apply;
  ViolationKind kind;
  const char* expect;
};

class PlantedViolationTest : public ::testing::TestWithParam<Plant> {};

TEST_P(PlantedViolationTest, Check_PlantedViolation_IsCaught) {
  const Graph g = SmallGraph();
  Schedule s = Baseline(g);
  GetParam().apply(s);
  std::vector<Violation> found = FindGatherViolations(g, s);
  std::vector<Violation> reduce = FindReduceViolations(g, s);
  found.insert(found.end(), reduce.begin(), reduce.end());
  ASSERT_FALSE(found.empty()) << GetParam().what;
  bool matched = false;
  for (const Violation& v : found) {
    if (v.kind == GetParam().kind &&
        v.message.find(GetParam().expect) != std::string::npos) {
      matched = true;
    }
  }
  EXPECT_TRUE(matched) << GetParam().what << ": " << found[0].message;
  const absl::Status status = CheckScheduleSemantics(g, s);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
}

using K = ActionKind;
using P = AnchorPosition;

INSTANTIATE_TEST_SUITE_P(
    AllInvariants, PlantedViolationTest,
    ::testing::Values(
        Plant{"release before the forward use",
              [](Schedule& s) {
                // Move n1's release to before n1: n1 then uses released params.
                s.actions[Find(s, K::kRelease, 1, P::kAfter)].position =
                    P::kBefore;
              },
              ViolationKind::kUseAfterRelease, "n1 'layers.0.attn' uses p"},
        Plant{"missing gather",
              [](Schedule& s) {
                s.actions.erase(s.actions.begin() +
                                Find(s, K::kAllGather, 2, P::kBefore));
              },
              ViolationKind::kGatherMisuse, "waits for no gather in flight"},
        Plant{"missing wait",
              [](Schedule& s) {
                s.actions.erase(s.actions.begin() +
                                Find(s, K::kWait, 3, P::kBefore));
              },
              ViolationKind::kUseBeforeGather, "before its gather completes"},
        Plant{"gather and wait both missing",
              [](Schedule& s) {
                s.actions.erase(s.actions.begin() +
                                Find(s, K::kWait, 4, P::kBefore));
                s.actions.erase(s.actions.begin() +
                                Find(s, K::kAllGather, 4, P::kBefore));
              },
              ViolationKind::kUseBeforeGather, "before any gather"},
        Plant{"gathered twice",
              [](Schedule& s) {
                Action again = s.actions[Find(s, K::kAllGather, 1, P::kBefore)];
                again.position = P::kAfter;
                s.actions.insert(s.actions.begin(), again);
              },
              ViolationKind::kGatherMisuse, "already gathered"},
        Plant{"left gathered",
              [](Schedule& s) {
                // The last release of every group is in backward; drop one.
                for (size_t i = s.actions.size(); i-- > 0;) {
                  if (s.actions[i].kind == K::kRelease) {
                    s.actions.erase(s.actions.begin() + i);
                    break;
                  }
                }
              },
              ViolationKind::kGatherMisuse, "still gathered at the end"},
        Plant{"reduced twice",
              [](Schedule& s) {
                for (const Action& a : s.actions) {
                  if (a.kind == K::kReduceScatter) {
                    s.actions.push_back(a);
                    break;
                  }
                }
              },
              ViolationKind::kReduceCount, "reduced 2 times"},
        Plant{"never reduced",
              [](Schedule& s) {
                for (size_t i = 0; i < s.actions.size(); ++i) {
                  if (s.actions[i].kind == K::kReduceScatter) {
                    s.actions.erase(s.actions.begin() + i);
                    break;
                  }
                }
              },
              ViolationKind::kReduceCount, "reduced 0 times"},
        Plant{"reduced too early",
              [](Schedule& s) {
                for (Action& a : s.actions) {
                  if (a.kind == K::kReduceScatter) {
                    a.node_id = 0;  // during forward
                    break;
                  }
                }
              },
              ViolationKind::kReduceTooEarly,
              "before its gradient is complete"}),
    [](const auto& info) {
      std::string name = info.param.what;
      for (char& c : name) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

// A pass that plants a use-after-release, to see the pipeline name it.
class BreakingPass : public PlanningPass {
 public:
  absl::string_view name() const override { return "breaking"; }

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override {
    Schedule& s = context.schedule();
    s.actions[Find(s, K::kRelease, 1, P::kAfter)].position = P::kBefore;
    return true;
  }
};

// A pass that adds a group gathered all iteration long, raising the peak.
class BloatingPass : public PlanningPass {
 public:
  absl::string_view name() const override { return "bloating"; }

 protected:
  absl::StatusOr<bool> RunImpl(PlanningContext& context) override {
    Schedule& s = context.schedule();
    for (const Param& p : context.graph().params) {
      s.persistent_param_ids.push_back(p.id);
    }
    s.groups.clear();
    std::vector<Action> kept;
    for (const Action& a : s.actions) {
      if (a.kind == K::kReduceScatter) kept.push_back(a);
    }
    s.actions = kept;
    return true;
  }
};

TEST(PipelineCheckersTest, ViolatingPass_FailsNamingCheckerAndPass) {
  const Graph g = SmallGraph();
  PlanningContext ctx(g, HardwareModel::H100(2));
  PassPipeline pipeline("test");
  pipeline.AddPass<Zero3InsertPass>();
  pipeline.AddPass<BreakingPass>();
  pipeline.AddInvariantChecker<GatherBeforeUseChecker>();
  pipeline.AddInvariantChecker<NoUseAfterReleaseChecker>();
  pipeline.AddInvariantChecker<ReduceOnceChecker>();
  const absl::Status s = pipeline.Run(ctx).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("no-use-after-release failed after breaking"));
}

TEST(PipelineCheckersTest, PassRaisingPeakOverBudget_FailsMemoryChecker) {
  const Graph g = SmallGraph();
  HardwareModel hw = HardwareModel::H100(2);
  PlanningContext probe(g, hw);
  Zero3InsertPass insert;
  ASSERT_TRUE(insert.Run(probe).ok());
  ASSERT_TRUE(probe.Resimulate().ok());
  hw.budget_bytes = probe.sim().peak_bytes;  // the baseline just fits

  PlanningContext ctx(g, hw);
  PassPipeline pipeline("test");
  pipeline.AddPass<Zero3InsertPass>();
  pipeline.AddPass<BloatingPass>();
  pipeline.AddInvariantChecker<MemoryBudgetChecker>();
  const absl::Status s = pipeline.Run(ctx).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("memory-budget failed after bloating: simulated peak"));
}

}  // namespace
}  // namespace tandem
