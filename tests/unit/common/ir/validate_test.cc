#include "common/ir/validate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"
#include "tests/unit/common/test_graphs.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using testing::TwoLayerGraph;
using testing::TwoLayerProfile;
using testing::TwoLayerSchedule;

template <typename T>
struct Case {
  const char* what;
  std::function<void(T&)> apply;
  // Fragments the error message must contain.
  std::vector<std::string> expect;
};

std::string CaseName(const char* what) {
  std::string name = what;
  for (char& c : name) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

void ExpectInvalid(const absl::Status& status,
                   const std::vector<std::string>& fragments) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  for (const std::string& f : fragments) {
    EXPECT_THAT(std::string(status.message()), HasSubstr(f));
  }
}

TEST(ValidateGraphTest, WellFormed_IsOk) {
  EXPECT_TRUE(ValidateGraph(TwoLayerGraph()).ok());
}

using GraphCase = Case<Graph>;
class ValidateGraphErrorTest : public ::testing::TestWithParam<GraphCase> {};

TEST_P(ValidateGraphErrorTest, Malformed_NamesTheProblem) {
  Graph g = TwoLayerGraph();
  GetParam().apply(g);
  ExpectInvalid(ValidateGraph(g), GetParam().expect);
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

INSTANTIATE_TEST_SUITE_P(
    AllPaths, ValidateGraphErrorTest,
    ::testing::Values(
        GraphCase{"zero world",
                  [](Graph& g) { g.world_size = 0; },
                  {"world_size must be >= 1, got 0"}},
        GraphCase{"zero micro batches",
                  [](Graph& g) { g.micro_batches = 0; },
                  {"micro_batches must be >= 1"}},
        GraphCase{"negative tokens",
                  [](Graph& g) { g.tokens_per_micro_batch = -5; },
                  {"tokens_per_micro_batch"}},
        GraphCase{"duplicate param id",
                  [](Graph& g) { g.params[2].id = 1; },
                  {"invalid param ids", "p1 is defined twice"}},
        GraphCase{"negative param id",
                  [](Graph& g) { g.params[0].id = -3; },
                  {"negative id"}},
        GraphCase{"duplicate param name",
                  [](Graph& g) { g.params[2].name = g.params[1].name; },
                  {"'layers.0.w' is defined twice"}},
        GraphCase{"empty param name",
                  [](Graph& g) { g.params[2].name = ""; },
                  {"p2 has no name"}},
        GraphCase{"empty shape",
                  [](Graph& g) { g.params[2].shape = {}; },
                  {"empty shape", "scalars are shape [1]"}},
        GraphCase{"negative dim",
                  [](Graph& g) {
                    g.params[1].shape = {16, -2};
                  },
                  {"'layers.0.w' has dimension -2"}},
        GraphCase{"zero dim",
                  [](Graph& g) { g.params[1].shape = {0}; },
                  {"has dimension 0"}},
        GraphCase{"huge param",
                  [](Graph& g) {
                    g.params[1].shape = {1 << 30, 1 << 30};
                  },
                  {"more than 2^48"}},
        GraphCase{"duplicate node id",
                  [](Graph& g) { g.nodes[2].id = 1; },
                  {"n1 is defined twice"}},
        GraphCase{"duplicate node name",
                  [](Graph& g) { g.nodes[2].name = "embed"; },
                  {"'embed' is defined twice"}},
        GraphCase{"unknown param use",
                  [](Graph& g) { g.nodes[1].param_ids.push_back(9); },
                  {"node n1 'layers.0' uses p9", "Declare every param"}},
        GraphCase{"negative time",
                  [](Graph& g) { g.nodes[1].time_s = -1; },
                  {"negative or non-finite", "time=-1"}},
        GraphCase{"nan flops",
                  [](Graph& g) { g.nodes[1].flops = kNaN; },
                  {"negative or non-finite"}},
        GraphCase{"infinite time",
                  [](Graph& g) {
                    g.nodes[1].time_s = std::numeric_limits<double>::infinity();
                  },
                  {"negative or non-finite"}},
        GraphCase{"negative activations",
                  [](Graph& g) { g.nodes[0].activation_bytes = -1; },
                  {"act=-1"}},
        GraphCase{"negative workspace",
                  [](Graph& g) { g.nodes[5].workspace_bytes = -7; },
                  {"ws=-7"}},
        GraphCase{"micro batch out of range",
                  [](Graph& g) { g.nodes[0].micro_batch = 1; },
                  {"mb=1, graph has 1"}},
        GraphCase{"backward without twin",
                  [](Graph& g) { g.nodes[4].forward_id.reset(); },
                  {"node n4 'loss.bwd' names no forward node"}},
        GraphCase{"twin unknown",
                  [](Graph& g) { g.nodes[4].forward_id = 77; },
                  {"names unknown node n77"}},
        GraphCase{"twin not forward",
                  [](Graph& g) { g.nodes[5].forward_id = 4; },
                  {"which is not a forward node"}},
        GraphCase{"twin mirrored twice",
                  [](Graph& g) {
                    g.nodes[6].forward_id = 2;
                    g.nodes[6].param_ids = g.nodes[2].param_ids;
                  },
                  {"is mirrored twice (n5 and n6)"}},
        GraphCase{"twin other params",
                  [](Graph& g) { g.nodes[6].param_ids = {1}; },
                  {"uses other params than node n1"}},
        GraphCase{"backward before forward",
                  [](Graph& g) {
                    std::swap(g.nodes[2], g.nodes[5]);  // l1.bwd before l1
                  },
                  {"runs before its forward"}},
        GraphCase{"twin other micro batch",
                  [](Graph& g) {
                    g.micro_batches = 2;
                    g.nodes[5].micro_batch = 1;
                  },
                  {"is in micro-batch 1 but its forward"}},
        GraphCase{"forward with twin",
                  [](Graph& g) { g.nodes[1].forward_id = 0; },
                  {"forward nodes with backward-only attributes"}},
        GraphCase{"forward with recompute",
                  [](Graph& g) { g.nodes[1].recompute = true; },
                  {"Only backward nodes take"}},
        GraphCase{"optimizer with params",
                  [](Graph& g) { g.nodes[8].param_ids = {0}; },
                  {"optimizer nodes that name params", "drop their params="}},
        GraphCase{"node after optimizer",
                  [](Graph& g) { std::swap(g.nodes[7], g.nodes[8]); },
                  {"runs after the optimizer"}}),
    [](const auto& info) { return CaseName(info.param.what); });

TEST(ValidateGraphTest, ManyOffenders_ListIsCapped) {
  Graph g = TwoLayerGraph();
  for (int i = 0; i < 8; ++i) g.nodes[i].param_ids.push_back(100 + i);
  const absl::Status s = ValidateGraph(g);
  EXPECT_THAT(std::string(s.message()), HasSubstr("and 3 more"));
  EXPECT_THAT(std::string(s.message()), ::testing::Not(HasSubstr("uses p107")));
}

TEST(ValidateScheduleTest, WellFormed_IsOk) {
  const Graph g = TwoLayerGraph();
  EXPECT_TRUE(ValidateSchedule(TwoLayerSchedule(g), g).ok());
}

using ScheduleCase = Case<Schedule>;
class ValidateScheduleErrorTest
    : public ::testing::TestWithParam<ScheduleCase> {};

TEST_P(ValidateScheduleErrorTest, Malformed_NamesTheProblem) {
  const Graph g = TwoLayerGraph();
  Schedule s = TwoLayerSchedule(g);
  GetParam().apply(s);
  ExpectInvalid(ValidateSchedule(s, g), GetParam().expect);
}

INSTANTIATE_TEST_SUITE_P(
    AllPaths, ValidateScheduleErrorTest,
    ::testing::Values(
        ScheduleCase{"other graph",
                     [](Schedule& s) { s.graph_hash = "00000000deadbeef"; },
                     {"schedule is for graph 00000000deadbeef",
                      "Plan a schedule for this graph"}},
        ScheduleCase{
            "no hash", [](Schedule& s) { s.graph_hash.clear(); }, {"<none>"}},
        ScheduleCase{"negative version",
                     [](Schedule& s) { s.version = -1; },
                     {"version must be >= 0"}},
        ScheduleCase{"negative budget",
                     [](Schedule& s) { s.budget_bytes = -1; },
                     {"budget must be >= 0"}},
        ScheduleCase{"duplicate group",
                     [](Schedule& s) { s.groups[1].id = 0; },
                     {"g0 is defined twice"}},
        ScheduleCase{"empty group",
                     [](Schedule& s) { s.groups[1].param_ids.clear(); },
                     {"g1 is empty"}},
        ScheduleCase{"group unknown param",
                     [](Schedule& s) { s.groups[1].param_ids = {42}; },
                     {"g1 names unknown param p42"}},
        ScheduleCase{"param in two groups",
                     [](Schedule& s) {
                       s.groups[1].param_ids = {3, 1};
                     },
                     {"p1 is in g0 and g1"}},
        ScheduleCase{"persistent unknown",
                     [](Schedule& s) {
                       s.persistent_param_ids = {0, 9};
                     },
                     {"p9 is unknown"}},
        ScheduleCase{"persistent twice",
                     [](Schedule& s) {
                       s.persistent_param_ids = {0, 0};
                     },
                     {"p0 is listed twice"}},
        ScheduleCase{"offload duplicate",
                     [](Schedule& s) { s.offloads.push_back(s.offloads[0]); },
                     {"o0 is defined twice"}},
        ScheduleCase{"offload unknown param",
                     [](Schedule& s) { s.offloads[0].param_ids = {5}; },
                     {"o0 names unknown param p5"}},
        ScheduleCase{"offload empty",
                     [](Schedule& s) { s.offloads[0].param_ids.clear(); },
                     {"o0 names no params"}},
        ScheduleCase{"offload negative bytes",
                     [](Schedule& s) { s.offloads[0].bytes = -1; },
                     {"o0 has bytes=-1"}},
        ScheduleCase{
            "action missing node",
            [](Schedule& s) { s.actions[1].node_id = 99; },
            {"action 1 (before n99 allgather) names unknown node n99"}},
        ScheduleCase{"action missing group",
                     [](Schedule& s) { s.actions[2].group_id = 7; },
                     {"names unknown group g7"}},
        ScheduleCase{"release missing group",
                     [](Schedule& s) { s.actions[4].group_id = 5; },
                     {"release) names unknown group g5"}},
        ScheduleCase{"reduce scatter without params",
                     [](Schedule& s) { s.actions[6].param_ids.clear(); },
                     {"reduce_scatter) names no params"}},
        ScheduleCase{"reduce scatter unknown param",
                     [](Schedule& s) {
                       s.actions[6].param_ids = {3, 11};
                     },
                     {"names unknown param p11"}},
        ScheduleCase{"reload missing entry",
                     [](Schedule& s) { s.actions[8].offload_id = 4; },
                     {"names unknown offload entry o4"}},
        ScheduleCase{"negative prediction",
                     [](Schedule& s) { s.prediction.exposed_comm_s = -1; },
                     {"prediction has a negative"}},
        ScheduleCase{"nan prediction",
                     [](Schedule& s) { s.prediction.iteration_s = kNaN; },
                     {"prediction has a negative or non-finite"}},
        ScheduleCase{
            "bad window",
            [](Schedule& s) { s.provenance.window_first_iteration = 30; },
            {"provenance is malformed"}}),
    [](const auto& info) { return CaseName(info.param.what); });

TEST(ValidateProfileTest, WellFormed_IsOk) {
  const Graph g = TwoLayerGraph();
  EXPECT_TRUE(ValidateProfile(TwoLayerProfile(g), g).ok());
}

using ProfileCase = Case<Profile>;
class ValidateProfileErrorTest : public ::testing::TestWithParam<ProfileCase> {
};

TEST_P(ValidateProfileErrorTest, Malformed_NamesTheProblem) {
  const Graph g = TwoLayerGraph();
  Profile p = TwoLayerProfile(g);
  GetParam().apply(p);
  ExpectInvalid(ValidateProfile(p, g), GetParam().expect);
}

INSTANTIATE_TEST_SUITE_P(
    AllPaths, ValidateProfileErrorTest,
    ::testing::Values(
        ProfileCase{"other graph",
                    [](Profile& p) { p.graph_hash = "0123456789abcdef"; },
                    {"measured on graph 0123456789abcdef"}},
        ProfileCase{
            "bad rank", [](Profile& p) { p.rank = -2; }, {"rank must be >= 0"}},
        ProfileCase{"bad window",
                    [](Profile& p) { p.first_iteration = 21; },
                    {"window 21..20 is malformed"}},
        ProfileCase{"negative iteration",
                    [](Profile& p) { p.iteration_s = -0.1; },
                    {"iteration time"}},
        ProfileCase{"unknown node time",
                    [](Profile& p) { p.nodes[0].node_id = 50; },
                    {"time of unknown node n50"}},
        ProfileCase{"negative node time",
                    [](Profile& p) { p.nodes[1].time_s = -1; },
                    {"time of n5 is -1"}},
        ProfileCase{
            "negative overlap bytes",
            [](Profile& p) { p.nodes[1].reduce_scatter_overlap_bytes = -5; },
            {"with 0, -5 and 0 bytes moved alongside"}},
        ProfileCase{"negative interference",
                    [](Profile& p) { p.compute_s_per_copy_byte = -1e-9; },
                    {"compute seconds per transferred byte"}},
        ProfileCase{"stretch below one",
                    [](Profile& p) { p.reduce_scatter_stretch = 0.5; },
                    {"rs_stretch is 0.5", "must be 1 to 4 (0: not measured)"}},
        ProfileCase{"stretch above four",
                    [](Profile& p) { p.copy_stretch = 7; },
                    {"copy_stretch is 7"}},
        ProfileCase{"computing beyond the run",
                    [](Profile& p) { p.collectives[0].computing_s = 0.5; },
                    {"allgather at n", "was computing 0.5s"}},
        ProfileCase{"negative computing",
                    [](Profile& p) { p.collectives[0].computing_s = -1; },
                    {"negative or non-finite"}},
        ProfileCase{"bad collective scratch",
                    [](Profile& p) {
                      p.reduce_scatter_scratch = {9, 0};
                    },
                    {"0 to 4 copies", "got 9 copies"}},
        ProfileCase{"negative node rise",
                    [](Profile& p) { p.memory[0].rise_bytes = -1; },
                    {"memory of n1 is negative"}},
        ProfileCase{"collective unknown node",
                    [](Profile& p) { p.collectives[0].node_id = 60; },
                    {"allgather at n60 names an unknown node"}},
        ProfileCase{"collective unknown param",
                    [](Profile& p) { p.collectives[1].param_ids = {8}; },
                    {"reduce_scatter at n6 names unknown param p8"}},
        ProfileCase{"collective negative bytes",
                    [](Profile& p) { p.collectives[0].bytes = -1; },
                    {"negative or non-finite"}},
        ProfileCase{"exposed above issue to done",
                    [](Profile& p) { p.collectives[0].exposed_s = 0.01; },
                    {"exposed 0.01s > issue_to_done 0.002s"}},
        ProfileCase{"memory unknown node",
                    [](Profile& p) { p.memory[0].node_id = 70; },
                    {"memory of unknown node n70"}},
        ProfileCase{"memory negative",
                    [](Profile& p) { p.memory[1].after_bytes = -5; },
                    {"memory of n6 is negative"}}),
    [](const auto& info) { return CaseName(info.param.what); });

}  // namespace
}  // namespace tandem
