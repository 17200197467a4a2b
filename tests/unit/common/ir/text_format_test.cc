#include "common/ir/text_format.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/ir/graph.h"
#include "common/ir/profile.h"
#include "common/ir/schedule.h"
#include "common/ir/validate.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

// Predicates for EXPECT_PRED2, which prints both strings on failure.
bool Contains(absl::string_view text, absl::string_view fragment) {
  return absl::StrContains(text, fragment);
}

bool StartsWith(absl::string_view text, absl::string_view prefix) {
  return absl::StartsWith(text, prefix);
}

std::string ReadTestdata(const std::string& name) {
  const std::string path = absl::StrCat(TANDEM_TESTDATA_DIR, "/", name);
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file.good()) << "cannot open " << path;
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

uint64_t Bits(double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

Node MakeNode(int32_t id, std::string name, Phase phase) {
  Node node;
  node.id = id;
  node.name = std::move(name);
  node.phase = phase;
  return node;
}

Param MakeParam(int32_t id, std::string name, std::vector<int64_t> shape,
                DType dtype, std::string unit) {
  Param param;
  param.id = id;
  param.name = std::move(name);
  param.shape = std::move(shape);
  param.dtype = dtype;
  param.unit = std::move(unit);
  return param;
}

// Two micro-batches of a one-layer model, with every node attribute set
// somewhere.
Graph MakeGraph() {
  Graph graph;
  graph.name = "two-mb/llama.tiny";
  graph.world_size = 8;
  graph.micro_batches = 2;
  graph.tokens_per_micro_batch = 4096;
  graph.params.push_back(
      MakeParam(0, "embed.weight", {32000, 512}, DType::kBF16, "embed"));
  graph.params.push_back(MakeParam(1, "layers.0.attn.wq.weight", {512, 512},
                                   DType::kF32, "layers.0"));
  graph.params.push_back(
      MakeParam(2, "layers.0.norm.scale", {512}, DType::kF16, ""));
  for (int32_t mb = 0; mb < 2; ++mb) {
    Node embed =
        MakeNode(mb * 4, absl::StrCat("embed.mb", mb), Phase::kForward);
    embed.micro_batch = mb;
    embed.param_ids = {0};
    embed.time_s = 0.1;
    embed.activation_bytes = 4 << 20;
    Node layer =
        MakeNode(mb * 4 + 1, absl::StrCat("layers.0.mb", mb), Phase::kForward);
    layer.micro_batch = mb;
    layer.param_ids = {1, 2};
    layer.flops = 1.0 / 3;
    layer.time_s = 1e-300;
    layer.activation_bytes = 123456789012;
    layer.workspace_bytes = 7;
    Node layer_bwd = MakeNode(mb * 4 + 2, absl::StrCat("layers.0.bwd.mb", mb),
                              Phase::kBackward);
    layer_bwd.micro_batch = mb;
    layer_bwd.forward_id = layer.id;
    layer_bwd.recompute = true;
    layer_bwd.param_ids = {1, 2};
    layer_bwd.flops = 2e12;
    layer_bwd.time_s = 0.0025;
    Node embed_bwd = MakeNode(mb * 4 + 3, absl::StrCat("embed.bwd.mb", mb),
                              Phase::kBackward);
    embed_bwd.micro_batch = mb;
    embed_bwd.forward_id = embed.id;
    embed_bwd.param_ids = {0};
    graph.nodes.push_back(embed);
    graph.nodes.push_back(layer);
    graph.nodes.push_back(layer_bwd);
    graph.nodes.push_back(embed_bwd);
  }
  Node opt = MakeNode(8, "optimizer", Phase::kOptimizer);
  opt.param_ids = {0, 1, 2};
  opt.time_s = 0.3;
  graph.nodes.push_back(opt);
  return graph;
}

Action MakeAction(ActionKind kind, int32_t node_id, AnchorPosition position) {
  Action action;
  action.kind = kind;
  action.node_id = node_id;
  action.position = position;
  return action;
}

// Every action kind at both anchors, plus fields a kind does not use.
Schedule MakeSchedule() {
  Schedule schedule;
  schedule.graph_hash = "0123456789abcdef";
  schedule.version = 42;
  schedule.mode = ShardingMode::kZero1;
  schedule.budget_bytes = int64_t{80} << 30;
  schedule.groups = {{0, {1, 2}}, {7, {0}}, {8, {}}};
  schedule.persistent_param_ids = {3, 4};
  schedule.offloads = {{0, {1}, 1 << 20}, {2, {}, 0}};

  Action gather =
      MakeAction(ActionKind::kAllGather, 1, AnchorPosition::kBefore);
  gather.group_id = 7;
  Action wait = MakeAction(ActionKind::kWait, 1, AnchorPosition::kBefore);
  wait.group_id = 7;
  Action release = MakeAction(ActionKind::kRelease, 1, AnchorPosition::kAfter);
  release.group_id = 7;
  Action reduce =
      MakeAction(ActionKind::kReduceScatter, 5, AnchorPosition::kAfter);
  reduce.param_ids = {1, 2};
  Action reduce_empty =
      MakeAction(ActionKind::kReduceScatter, 6, AnchorPosition::kBefore);
  Action offload = MakeAction(ActionKind::kOffload, 0, AnchorPosition::kAfter);
  offload.offload_id = 2;
  Action reload = MakeAction(ActionKind::kReload, 9, AnchorPosition::kBefore);
  reload.offload_id = 0;
  // Fields the kind ignores still round-trip.
  Action odd = MakeAction(ActionKind::kWait, 3, AnchorPosition::kAfter);
  odd.group_id = 1;
  odd.param_ids = {5};
  odd.offload_id = 4;
  Action odd_reduce =
      MakeAction(ActionKind::kReduceScatter, 3, AnchorPosition::kAfter);
  odd_reduce.group_id = 2;
  odd_reduce.offload_id = 1;
  Action odd_reload =
      MakeAction(ActionKind::kReload, 3, AnchorPosition::kAfter);
  odd_reload.group_id = 3;
  odd_reload.param_ids = {0, 1};
  schedule.actions = {gather,  wait,   release, reduce,     reduce_empty,
                      offload, reload, odd,     odd_reduce, odd_reload};

  schedule.prediction.iteration_s = 0.1;
  schedule.prediction.compute_s = 1.0 / 3;
  schedule.prediction.comm_s = 1e-300;
  schedule.prediction.exposed_comm_s = 0.02;
  schedule.prediction.copy_s = 0;
  schedule.prediction.peak_bytes = (int64_t{1} << 30) + 1;
  schedule.provenance.passes = {"zero3-insert", "prefetch", "unshard"};
  schedule.provenance.window_first_iteration = 10;
  schedule.provenance.window_last_iteration = 20;
  schedule.provenance.plan_wall_s = 0.003;
  schedule.provenance.reason = "drift";
  return schedule;
}

Profile MakeProfile() {
  Profile profile;
  profile.graph_hash = "fedcba9876543210";
  profile.rank = Profile::kAggregateRank;
  profile.schedule_version = 3;
  profile.first_iteration = 100;
  profile.last_iteration = 199;
  profile.iteration_s = 0.1;
  profile.peak_bytes = 3 << 20;
  profile.nodes = {{0, 0.001, 10}, {1, 1.0 / 3, 1}, {2, 1e-300, 0}};
  CollectiveTiming gather;
  gather.kind = CollectiveKind::kAllGather;
  gather.group_id = 2;
  gather.bytes = 4 << 20;
  gather.issue_to_done_s = 0.002;
  gather.exposed_s = 0.0005;
  gather.node_id = 1;
  CollectiveTiming reduce;
  reduce.kind = CollectiveKind::kReduceScatter;
  reduce.param_ids = {1, 2};
  reduce.bytes = 12345;
  reduce.issue_to_done_s = 0.1;
  reduce.node_id = 5;
  CollectiveTiming all_reduce;
  all_reduce.kind = CollectiveKind::kAllReduce;
  all_reduce.param_ids = {0};
  all_reduce.node_id = 6;
  // Fields the kind ignores still round-trip.
  CollectiveTiming odd_gather = gather;
  odd_gather.param_ids = {3};
  CollectiveTiming odd_reduce;
  odd_reduce.kind = CollectiveKind::kAllReduce;
  odd_reduce.group_id = 9;
  profile.collectives = {gather, reduce, all_reduce, odd_gather, odd_reduce};
  profile.memory = {{0, 1 << 20, 2 << 20}, {5, 0, 0}};
  return profile;
}

// --- Graph -----------------------------------------------------------------

TEST(PrintGraphTest, PrintGraph_FullGraph_ParsesBackEqual) {
  const Graph graph = MakeGraph();
  absl::StatusOr<Graph> parsed = ParseGraph(PrintGraph(graph));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, graph);
  EXPECT_EQ(parsed->StructuralHash(), graph.StructuralHash());
}

TEST(PrintGraphTest, PrintGraph_ReduceDType_PrintedAndParsedBack) {
  Graph graph = MakeGraph();
  EXPECT_FALSE(absl::StrContains(PrintGraph(graph), "reduce="));
  graph.reduce_dtype = DType::kF32;
  const std::string text = PrintGraph(graph);
  EXPECT_TRUE(absl::StrContains(text, " reduce=f32\n")) << text;
  absl::StatusOr<Graph> parsed = ParseGraph(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, graph);
}

TEST(PrintGraphTest, PrintGraph_SmallGraph_GivesReadableText) {
  Graph graph;
  graph.name = "tiny";
  graph.world_size = 2;
  graph.tokens_per_micro_batch = 512;
  graph.params.push_back(
      MakeParam(0, "embed.weight", {1000, 64}, DType::kF32, "embed"));
  Node fwd = MakeNode(0, "embed", Phase::kForward);
  fwd.param_ids = {0};
  fwd.flops = 1e6;
  fwd.time_s = 0.001;
  fwd.activation_bytes = 4096;
  Node bwd = MakeNode(5, "embed.bwd", Phase::kBackward);
  bwd.forward_id = 0;
  bwd.param_ids = {0};
  bwd.time_s = 0.002;
  graph.nodes = {fwd, bwd, MakeNode(9, "optimizer", Phase::kOptimizer)};

  EXPECT_EQ(PrintGraph(graph),
            "graph tiny world=2 micro_batches=1 tokens=512\n"
            "param p0 embed.weight f32[1000,64] unit=embed\n"
            "node n0 embed fwd params=p0 flops=1e+06 time=0.001 act=4096\n"
            "node n5 embed.bwd bwd of=n0 params=p0 time=0.002\n"
            "node n9 optimizer opt\n");
}

TEST(PrintGraphTest, PrintGraph_DefaultNodeAttributes_AreOmitted) {
  Graph graph;
  graph.name = "g";
  graph.nodes.push_back(MakeNode(3, "plain", Phase::kForward));
  const std::string text = PrintGraph(graph);
  EXPECT_PRED2(Contains, text, "\nnode n3 plain fwd\n");
  absl::StatusOr<Graph> parsed = ParseGraph(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, graph);
  EXPECT_FALSE(parsed->nodes[0].forward_id.has_value());
}

TEST(PrintGraphTest, PrintGraph_AwkwardDoubles_RoundTripBitExact) {
  const double values[] = {0.1,
                           1e-300,
                           1.0 / 3,
                           2.0 / 3,
                           -0.0,
                           123456789.123456789,
                           1e300,
                           std::numeric_limits<double>::max(),
                           std::numeric_limits<double>::min(),
                           std::numeric_limits<double>::denorm_min(),
                           std::numeric_limits<double>::infinity(),
                           -2.5e-7};
  for (double v : values) {
    SCOPED_TRACE(v);
    Graph graph;
    graph.name = "doubles";
    Node node = MakeNode(0, "n", Phase::kForward);
    node.flops = v;
    node.time_s = -v;
    graph.nodes.push_back(node);
    absl::StatusOr<Graph> parsed = ParseGraph(PrintGraph(graph));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(Bits(parsed->nodes[0].flops), Bits(v));
    EXPECT_EQ(Bits(parsed->nodes[0].time_s), Bits(-v));
  }
}

TEST(PrintGraphTest, PrintGraph_RecomputeMicroBatchAndTwin_RoundTrip) {
  Graph graph;
  graph.name = "g";
  graph.micro_batches = 4;
  Node fwd = MakeNode(10, "block", Phase::kForward);
  fwd.micro_batch = 3;
  Node bwd = MakeNode(11, "block.bwd", Phase::kBackward);
  bwd.micro_batch = 3;
  bwd.forward_id = 10;
  bwd.recompute = true;
  // A twin id of 0 must still print: it is present, not default.
  Node bwd0 = MakeNode(12, "other.bwd", Phase::kBackward);
  bwd0.forward_id = 0;
  graph.nodes = {fwd, bwd, bwd0};

  const std::string text = PrintGraph(graph);
  EXPECT_PRED2(Contains, text,
               "node n11 block.bwd bwd mb=3 of=n10 recompute\n");
  EXPECT_PRED2(Contains, text, "node n12 other.bwd bwd of=n0\n");
  absl::StatusOr<Graph> parsed = ParseGraph(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, graph);
  EXPECT_EQ(parsed->nodes[1].micro_batch, 3);
  EXPECT_EQ(parsed->nodes[1].forward_id, 10);
  EXPECT_TRUE(parsed->nodes[1].recompute);
  EXPECT_EQ(parsed->nodes[2].forward_id, 0);
}

TEST(PrintGraphTest, PrintGraph_NamesNeedingQuotes_RoundTrip) {
  const std::string names[] = {"",          "has space",
                               "a=b",       "x#y",
                               "q\"uote",   "back\\slash",
                               "c,d",       "tab\there",
                               "new\nline", std::string("nul\0b", 5),
                               "\x7f",      "caf\xc3\xa9"};
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    Graph graph;
    graph.name = name;
    graph.params.push_back(MakeParam(0, name, {2}, DType::kF32, name));
    graph.nodes.push_back(MakeNode(0, name, Phase::kForward));
    const std::string text = PrintGraph(graph);
    absl::StatusOr<Graph> parsed = ParseGraph(text);
    ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
    EXPECT_EQ(*parsed, graph);
  }
}

TEST(PrintGraphTest, PrintGraph_PlainNames_PrintUnquoted) {
  Graph graph;
  graph.name = "run-7/llama_1b.v2";
  graph.params.push_back(
      MakeParam(0, "layers.3/attn-wq.weight", {2}, DType::kF32, "layers.3"));
  const std::string text = PrintGraph(graph);
  EXPECT_PRED2(Contains, text, "graph run-7/llama_1b.v2 ");
  EXPECT_PRED2(Contains, text,
               "param p0 layers.3/attn-wq.weight f32[2] "
               "unit=layers.3\n");
}

TEST(ParseGraphTest, ParseGraph_Fixture_HasExpectedContents) {
  absl::StatusOr<Graph> graph = ParseGraph(ReadTestdata("tiny_graph.txt"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->name, "tiny");
  EXPECT_EQ(graph->world_size, 2);
  EXPECT_EQ(graph->micro_batches, 1);
  EXPECT_EQ(graph->tokens_per_micro_batch, 512);
  ASSERT_EQ(graph->params.size(), 6u);
  EXPECT_EQ(graph->params[0].name, "embed.weight");
  EXPECT_EQ(graph->params[0].shape, (std::vector<int64_t>{1000, 64}));
  EXPECT_EQ(graph->params[2].shape, (std::vector<int64_t>{64}));
  EXPECT_EQ(graph->params[3].unit, "layers.1");
  ASSERT_EQ(graph->nodes.size(), 9u);
  const Node& layer1 = graph->nodes[2];
  EXPECT_EQ(layer1.param_ids, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(layer1.flops, 4.2e6);
  EXPECT_EQ(layer1.time_s, 0.0005);
  EXPECT_EQ(layer1.activation_bytes, 128 * 1024);
  EXPECT_EQ(layer1.workspace_bytes, 16 * 1024);
  const Node& layer1_bwd = graph->nodes[5];
  EXPECT_EQ(layer1_bwd.phase, Phase::kBackward);
  EXPECT_EQ(layer1_bwd.forward_id, 2);
  EXPECT_TRUE(layer1_bwd.recompute);
  EXPECT_FALSE(graph->nodes[6].recompute);
  EXPECT_EQ(graph->nodes[7].time_s, 0.0004);
  EXPECT_EQ(graph->nodes[8].phase, Phase::kOptimizer);
  EXPECT_TRUE(graph->nodes[8].param_ids.empty());  // it steps shards
  EXPECT_TRUE(ValidateGraph(*graph).ok()) << ValidateGraph(*graph);

  absl::StatusOr<Graph> reparsed = ParseGraph(PrintGraph(*graph));
  ASSERT_TRUE(reparsed.ok()) << reparsed.status();
  EXPECT_EQ(*reparsed, *graph);
}

TEST(ParseGraphTest, ParseGraph_TimeSuffixes_ScaleToSeconds) {
  absl::StatusOr<Graph> graph = ParseGraph(
      "graph g\n"
      "node n0 a fwd time=1ms\n"
      "node n1 b fwd time=250us\n"
      "node n2 c fwd time=40ns\n"
      "node n3 d fwd time=2s\n"
      "node n4 e fwd time=1.5\n"
      "node n5 f fwd time=1e3ms\n"
      "node n6 g fwd time=3ms\n"
      "node n7 h fwd time=-0.5ms\n");
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->nodes[0].time_s, 0.001);
  EXPECT_EQ(graph->nodes[1].time_s, 0.00025);
  EXPECT_EQ(graph->nodes[2].time_s, 4e-8);
  EXPECT_EQ(graph->nodes[3].time_s, 2.0);
  EXPECT_EQ(graph->nodes[4].time_s, 1.5);
  EXPECT_EQ(graph->nodes[5].time_s, 1.0);
  EXPECT_EQ(graph->nodes[6].time_s, 0.003);
  EXPECT_EQ(graph->nodes[7].time_s, -0.0005);
}

TEST(ParseGraphTest, ParseGraph_ByteSuffixes_ScaleToBytes) {
  absl::StatusOr<Graph> graph = ParseGraph(
      "graph g\n"
      "node n0 a fwd act=4KiB ws=17B\n"
      "node n1 b fwd act=2MiB ws=1GiB\n"
      "node n2 c fwd act=1.5GiB ws=0.5KiB\n"
      "node n3 d fwd act=123 ws=-1KiB\n");
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->nodes[0].activation_bytes, 4096);
  EXPECT_EQ(graph->nodes[0].workspace_bytes, 17);
  EXPECT_EQ(graph->nodes[1].activation_bytes, 2 * 1024 * 1024);
  EXPECT_EQ(graph->nodes[1].workspace_bytes, int64_t{1} << 30);
  EXPECT_EQ(graph->nodes[2].activation_bytes, int64_t{3} << 29);
  EXPECT_EQ(graph->nodes[2].workspace_bytes, 512);
  EXPECT_EQ(graph->nodes[3].activation_bytes, 123);
  EXPECT_EQ(graph->nodes[3].workspace_bytes, -1024);
}

TEST(ParseGraphTest, ParseGraph_CommentsBlankLinesAndCrlf_Ignored) {
  absl::StatusOr<Graph> graph = ParseGraph(
      "# leading comment\r\n"
      "\r\n"
      "   graph   g   world=4 # trailing comment\r\n"
      "\t param p0 w f32[2,3]#no space before the comment\r\n"
      "node n0 \"a # b\" fwd params=p0");
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->world_size, 4);
  ASSERT_EQ(graph->params.size(), 1u);
  EXPECT_EQ(graph->params[0].shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(graph->nodes.size(), 1u);
  EXPECT_EQ(graph->nodes[0].name, "a # b");
}

TEST(ParseGraphTest, ParseGraph_HeaderDefaultsAndEmptyLists_Accepted) {
  absl::StatusOr<Graph> graph =
      ParseGraph("graph g\nparam p0 s f32[]\nnode n0 a fwd params=\n");
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->world_size, 1);
  EXPECT_EQ(graph->micro_batches, 1);
  EXPECT_EQ(graph->tokens_per_micro_batch, 0);
  EXPECT_TRUE(graph->params[0].shape.empty());
  EXPECT_TRUE(graph->nodes[0].param_ids.empty());
}

TEST(ParseGraphTest, ParseGraph_NegativeIdsAndValues_LeftToValidation) {
  absl::StatusOr<Graph> graph = ParseGraph(
      "graph g world=-1\nparam p-2 w f32[-3]\nnode n-1 a fwd mb=-1 time=-1\n");
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->world_size, -1);
  EXPECT_EQ(graph->params[0].id, -2);
  EXPECT_EQ(graph->params[0].shape, (std::vector<int64_t>{-3}));
  EXPECT_EQ(graph->nodes[0].id, -1);
  EXPECT_EQ(graph->nodes[0].micro_batch, -1);
  EXPECT_FALSE(ValidateGraph(*graph).ok());
}

// --- Schedule --------------------------------------------------------------

TEST(PrintScheduleTest, PrintSchedule_EveryActionKind_RoundTrips) {
  const Schedule schedule = MakeSchedule();
  const std::string text = PrintSchedule(schedule);
  absl::StatusOr<Schedule> parsed = ParseSchedule(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(*parsed, schedule);
  EXPECT_EQ(Bits(parsed->prediction.compute_s), Bits(1.0 / 3));
  EXPECT_EQ(Bits(parsed->prediction.comm_s), Bits(1e-300));
}

TEST(PrintScheduleTest, PrintSchedule_Actions_PrintOneReadableLineEach) {
  const std::string text = PrintSchedule(MakeSchedule());
  EXPECT_PRED2(Contains, text,
               "schedule v42 graph=0123456789abcdef mode=zero1 "
               "budget=85899345920\n");
  EXPECT_PRED2(Contains, text, "\ngroup g0 p1,p2\ngroup g7 p0\ngroup g8\n");
  EXPECT_PRED2(Contains, text, "\npersistent p3,p4\n");
  EXPECT_PRED2(Contains, text, "\noffload o0 p1 bytes=1048576\n");
  EXPECT_PRED2(Contains, text,
               "\nbefore n1 allgather g7\n"
               "before n1 wait g7\n"
               "after n1 release g7\n"
               "after n5 reduce_scatter p1,p2\n"
               "before n6 reduce_scatter\n"
               "after n0 offload o2\n"
               "before n9 reload o0\n");
  EXPECT_PRED2(Contains, text,
               "\nafter n3 wait g1 params=p5 offload=o4\n"
               "after n3 reduce_scatter group=g2 offload=o1\n"
               "after n3 reload o0 group=g3 params=p0,p1\n");
  EXPECT_PRED2(Contains, text,
               "\nprovenance passes=zero3-insert,prefetch,"
               "unshard window=10..20 wall=0.003 "
               "reason=drift\n");
}

TEST(PrintScheduleTest, PrintSchedule_DefaultSchedule_RoundTrips) {
  const Schedule schedule;
  const std::string text = PrintSchedule(schedule);
  EXPECT_PRED2(Contains, text, "graph=\"\"");
  absl::StatusOr<Schedule> parsed = ParseSchedule(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(*parsed, schedule);
}

TEST(PrintScheduleTest, PrintSchedule_WithNames_CommentsModelNamesRoundTrips) {
  Graph graph = MakeGraph();
  graph.nodes[1].name = "layers.0\nmb0";  // a control byte stays in-line
  const Schedule schedule = MakeSchedule();
  const std::string text = PrintSchedule(schedule, &graph);
  absl::StatusOr<Schedule> parsed = ParseSchedule(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(*parsed, schedule);
  // Without names, the same text less the comments.
  EXPECT_EQ(PrintSchedule(schedule, nullptr), PrintSchedule(schedule));
  EXPECT_PRED2(Contains, text,
               "schedule v42 graph=0123456789abcdef mode=zero1 "
               "budget=85899345920  # budget 80.00GiB\n");
  // The shared dotted prefix once, then each param's own part.
  EXPECT_PRED2(Contains, text,
               "\ngroup g0 p1,p2  # layers.0: attn.wq.weight, norm.scale\n"
               "group g7 p0  # embed.weight\ngroup g8\n");
  // Ids the graph does not have print as themselves.
  EXPECT_PRED2(Contains, text, "\npersistent p3,p4  # p3, p4\n");
  EXPECT_PRED2(Contains, text,
               "\noffload o0 p1 bytes=1048576  # layers.0.attn.wq.weight "
               "(1.00MiB)\n");
  EXPECT_PRED2(Contains, text, "\nbefore n1 allgather g7  # layers.0?mb0\n");
  EXPECT_PRED2(Contains, text,
               "\nafter n5 reduce_scatter p1,p2  # layers.0.mb1; "
               "layers.0: attn.wq.weight, norm.scale\n");
  EXPECT_PRED2(Contains, text, "peak=1073741825  # peak 1.00GiB\n");
}

TEST(PrintScheduleTest, PrintSchedule_AwkwardProvenanceStrings_RoundTrip) {
  Schedule schedule = MakeSchedule();
  schedule.provenance.passes = {"", "with,comma", "with space", "q\"uote"};
  schedule.provenance.reason = "user asked: re-plan # now";
  const std::string text = PrintSchedule(schedule);
  absl::StatusOr<Schedule> parsed = ParseSchedule(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(parsed->provenance.passes, schedule.provenance.passes);
  EXPECT_EQ(parsed->provenance.reason, schedule.provenance.reason);
}

TEST(ParseScheduleTest, ParseSchedule_Fixture_MatchesGraphFixture) {
  absl::StatusOr<Graph> graph = ParseGraph(ReadTestdata("tiny_graph.txt"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  absl::StatusOr<Schedule> schedule =
      ParseSchedule(ReadTestdata("tiny_schedule.txt"));
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  // If this fails, the structural hash changed: paste the new value into
  // tiny_schedule.txt and tiny_profile.txt.
  EXPECT_EQ(schedule->graph_hash, graph->StructuralHash());
  EXPECT_EQ(schedule->version, 1);
  EXPECT_EQ(schedule->mode, ShardingMode::kZero3);
  EXPECT_EQ(schedule->budget_bytes, 64 << 20);
  ASSERT_EQ(schedule->groups.size(), 3u);
  EXPECT_EQ(schedule->groups[1].param_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(schedule->persistent_param_ids, (std::vector<int32_t>{5}));
  ASSERT_EQ(schedule->offloads.size(), 1u);
  EXPECT_EQ(schedule->offloads[0].bytes, 500 * 1024);
  ASSERT_EQ(schedule->actions.size(), 24u);
  EXPECT_EQ(
      schedule->actions[0],
      (Action{ActionKind::kAllGather, 0, AnchorPosition::kBefore, 0, {}, 0}));
  EXPECT_EQ(
      schedule->actions[4],
      (Action{ActionKind::kOffload, 0, AnchorPosition::kAfter, 0, {}, 0}));
  EXPECT_EQ(schedule->actions[15], (Action{ActionKind::kReduceScatter,
                                           5,
                                           AnchorPosition::kAfter,
                                           0,
                                           {3, 4},
                                           0}));
  EXPECT_EQ(schedule->prediction.iteration_s, 0.0096);
  EXPECT_EQ(schedule->prediction.peak_bytes, 12 << 20);
  EXPECT_EQ(schedule->provenance.passes,
            (std::vector<std::string>{"zero3-insert", "prefetch", "unshard",
                                      "offload"}));
  EXPECT_EQ(schedule->provenance.window_first_iteration, 10);
  EXPECT_EQ(schedule->provenance.window_last_iteration, 19);
  EXPECT_EQ(schedule->provenance.plan_wall_s, 0.003);
  EXPECT_EQ(schedule->provenance.reason, "initial");
  const absl::Status valid = ValidateSchedule(*schedule, *graph);
  EXPECT_TRUE(valid.ok()) << valid;

  absl::StatusOr<Schedule> reparsed = ParseSchedule(PrintSchedule(*schedule));
  ASSERT_TRUE(reparsed.ok()) << reparsed.status();
  EXPECT_EQ(*reparsed, *schedule);
}

TEST(ParseScheduleTest,
     ParseSchedule_EmptyListsAndRepeatedPersistent_Accepted) {
  absl::StatusOr<Schedule> schedule = ParseSchedule(
      "schedule v0 graph=abc\n"
      "group g0\n"
      "persistent\n"
      "persistent p1,p2\n"
      "persistent p7\n"
      "offload o3 bytes=0\n"
      "after n2 reduce_scatter\n"
      "after n2 wait g0 params=\n");
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_TRUE(schedule->groups[0].param_ids.empty());
  EXPECT_EQ(schedule->persistent_param_ids, (std::vector<int32_t>{1, 2, 7}));
  EXPECT_TRUE(schedule->offloads[0].param_ids.empty());
  EXPECT_TRUE(schedule->actions[0].param_ids.empty());
  EXPECT_TRUE(schedule->actions[1].param_ids.empty());
  EXPECT_EQ(schedule->mode, ShardingMode::kZero3);
  EXPECT_EQ(schedule->prediction, Prediction{});
}

// --- Profile ---------------------------------------------------------------

TEST(PrintProfileTest, PrintProfile_AllCollectiveKinds_RoundTrip) {
  const Profile profile = MakeProfile();
  const std::string text = PrintProfile(profile);
  EXPECT_PRED2(Contains, text,
               "profile graph=fedcba9876543210 rank=-1 "
               "version=3 window=100..199 iteration=0.1 "
               "peak=3145728\n");
  EXPECT_PRED2(Contains, text,
               "\ncollective allreduce at=n0 bytes=0 "
               "issue_to_done=0 exposed=0 group=g9\n");
  absl::StatusOr<Profile> parsed = ParseProfile(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(*parsed, profile);
  EXPECT_EQ(parsed->rank, Profile::kAggregateRank);
  EXPECT_EQ(Bits(parsed->nodes[1].time_s), Bits(1.0 / 3));
}

TEST(PrintProfileTest, HostCopies_PrintedWhenMeasuredAndRoundTrip) {
  Profile profile = MakeProfile();
  profile.host_copy_bytes = 64 << 20;
  profile.host_copy_s = 0.02;
  const std::string text = PrintProfile(profile);
  EXPECT_PRED2(Contains, text,
               " peak=3145728 copied=67108864 copy_time=0.02\n");
  absl::StatusOr<Profile> parsed = ParseProfile(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(parsed->host_copy_bytes, 64 << 20);
  EXPECT_DOUBLE_EQ(parsed->host_copy_s, 0.02);
  // Without copies the header keeps its old form.
  EXPECT_EQ(PrintProfile(MakeProfile()).find("copied="), std::string::npos);
}

TEST(PrintProfileTest, Interference_PrintedWhenMeasuredAndRoundTrip) {
  Profile profile = MakeProfile();
  profile.compute_s_per_allgather_byte = 2e-9;
  profile.compute_s_per_reduce_scatter_byte = 3e-9;
  profile.nodes[0].allgather_overlap_bytes = 4096;
  profile.nodes[0].reduce_scatter_overlap_bytes = 100;
  profile.nodes[1].copy_overlap_bytes = 7;
  profile.allgather_stretch = 1.5;
  profile.copy_stretch = 2;
  profile.collectives[0].run_s = 0.0015;
  profile.collectives[0].computing_s = 0.001;
  const std::string text = PrintProfile(profile);
  EXPECT_PRED2(Contains, text,
               " ag_cpu_per_byte=2e-09 rs_cpu_per_byte=3e-09 ag_stretch=1.5 "
               "copy_stretch=2\n");
  EXPECT_PRED2(Contains, text, " run=0.0015 computing=0.001");
  EXPECT_PRED2(Contains, text, " ag_overlap=4096 rs_overlap=100\n");
  EXPECT_PRED2(Contains, text, " copy_overlap=7\n");
  absl::StatusOr<Profile> parsed = ParseProfile(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(*parsed, profile);
  // Unmeasured: the lines keep their old form.
  EXPECT_EQ(PrintProfile(MakeProfile()).find("cpu_per_byte"),
            std::string::npos);
  EXPECT_EQ(PrintProfile(MakeProfile()).find("overlap="), std::string::npos);
  EXPECT_EQ(PrintProfile(MakeProfile()).find("stretch"), std::string::npos);
  EXPECT_EQ(PrintProfile(MakeProfile()).find("computing="), std::string::npos);
}

TEST(PrintProfileTest, NodeMemoryAndScratch_PrintedWhenMeasuredAndRoundTrip) {
  Profile profile = MakeProfile();
  profile.allgather_scratch = {1, 0};
  profile.reduce_scatter_scratch = {2, 1 << 20};
  profile.memory.push_back({0, 100, 200, 300, -50});
  const std::string text = PrintProfile(profile);
  EXPECT_PRED2(Contains, text,
               " ag_scratch=1 rs_scratch=2 rs_scratch_cap=1048576\n");
  EXPECT_PRED2(Contains, text,
               "memory n0 before=100 after=200 rise=300 net=-50\n");
  absl::StatusOr<Profile> parsed = ParseProfile(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(*parsed, profile);
  EXPECT_EQ(PrintProfile(MakeProfile()).find("scratch"), std::string::npos);
}

TEST(ParseProfileTest, ParseProfile_Fixture_MatchesGraphFixture) {
  absl::StatusOr<Graph> graph = ParseGraph(ReadTestdata("tiny_graph.txt"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  absl::StatusOr<Profile> profile =
      ParseProfile(ReadTestdata("tiny_profile.txt"));
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->graph_hash, graph->StructuralHash());
  EXPECT_EQ(profile->rank, Profile::kAggregateRank);
  EXPECT_EQ(profile->schedule_version, 1);
  EXPECT_EQ(profile->first_iteration, 10);
  EXPECT_EQ(profile->last_iteration, 19);
  EXPECT_EQ(profile->iteration_s, 0.0099);
  EXPECT_EQ(profile->peak_bytes, 23 << 19);
  ASSERT_EQ(profile->nodes.size(), 9u);
  EXPECT_EQ(profile->nodes[7].node_id, 7);
  EXPECT_EQ(profile->nodes[7].time_s, 0.00041);
  EXPECT_EQ(profile->nodes[7].samples, 10);
  ASSERT_EQ(profile->collectives.size(), 7u);
  EXPECT_EQ(profile->collectives[0].kind, CollectiveKind::kAllGather);
  EXPECT_EQ(profile->collectives[0].bytes, 256000);
  EXPECT_EQ(profile->collectives[0].exposed_s, 0.0003);
  EXPECT_EQ(profile->collectives[4].param_ids, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(profile->collectives[4].node_id, 5);
  ASSERT_EQ(profile->memory.size(), 4u);
  EXPECT_EQ(profile->memory[0].after_bytes, 1310720);
  const absl::Status valid = ValidateProfile(*profile, *graph);
  EXPECT_TRUE(valid.ok()) << valid;

  absl::StatusOr<Profile> reparsed = ParseProfile(PrintProfile(*profile));
  ASSERT_TRUE(reparsed.ok()) << reparsed.status();
  EXPECT_EQ(*reparsed, *profile);
}

// --- Errors ----------------------------------------------------------------

enum class Doc { kGraph, kSchedule, kProfile };

absl::Status ParseAs(Doc doc, absl::string_view text) {
  switch (doc) {
    case Doc::kGraph:
      return ParseGraph(text).status();
    case Doc::kSchedule:
      return ParseSchedule(text).status();
    case Doc::kProfile:
      return ParseProfile(text).status();
  }
  return absl::InternalError("unknown document kind");
}

struct MalformedCase {
  const char* name;
  Doc doc;
  const char* text;
  // The message starts with this ("line N: ..."), or is checked only for
  // `fragment` when empty.
  const char* prefix;
  const char* fragment;
};

class MalformedTextTest : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(MalformedTextTest, Parse_MalformedText_InvalidArgumentNamesLineAndFix) {
  const MalformedCase& c = GetParam();
  const absl::Status status = ParseAs(c.doc, c.text);
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_PRED2(StartsWith, status.message(), c.prefix);
  EXPECT_PRED2(Contains, status.message(), c.fragment);
}

const MalformedCase kMalformedCases[] = {
    // Headers and document kinds.
    {"Empty", Doc::kGraph, "", "", "missing 'graph' header line"},
    {"OnlyComments", Doc::kSchedule, "# nothing\n\n  # here\n", "",
     "missing 'schedule' header line"},
    {"StatementBeforeHeader", Doc::kGraph, "param p0 w f32[1]\ngraph g\n",
     "line 1: ", "missing 'graph' header line"},
    {"ScheduleGivenToParseGraph", Doc::kGraph, "schedule v1 graph=abc\n",
     "line 1: ", "got a 'schedule' header: this text is a schedule"},
    {"GraphGivenToParseProfile", Doc::kProfile, "# c\ngraph g\n",
     "line 2: ", "this text is a graph, not a profile"},
    {"DuplicateHeader", Doc::kGraph, "graph a\nparam p0 w f32[1]\ngraph b\n",
     "line 3: ", "duplicate 'graph' header line (the first is at line 1)"},
    {"MissingGraphName", Doc::kGraph, "graph\n",
     "line 1: graph: ", "missing the graph name"},
    {"AttributeInsteadOfGraphName", Doc::kGraph, "graph world=2\n",
     "line 1: graph: ", "expected the graph name, got attribute 'world=2'"},
    {"UnknownHeaderAttribute", Doc::kGraph, "graph g worlds=2\n",
     "line 1: graph: ",
     "unknown attribute 'worlds' (expected one of world, micro_batches, "
     "tokens, reduce)"},
    {"BadReduceDType", Doc::kGraph, "graph g reduce=f64\n",
     "line 1: graph: ", "unknown dtype 'f64' (expected f32, bf16 or f16)"},
    // Params.
    {"BadParamIdPrefix", Doc::kGraph, "graph g\nparam x3 w f32[1]\n",
     "line 2: param: ", "expected a param id like p3, got 'x3'"},
    {"ParamIdNotANumber", Doc::kGraph, "graph g\nparam pp w f32[1]\n",
     "line 2: param: ", "expected a param id like p3, got 'pp'"},
    {"ParamIdOutOfRange", Doc::kGraph, "graph g\nparam p99999999999 w f32[1]\n",
     "line 2: param: ", "(out of range)"},
    {"MissingParamShape", Doc::kGraph, "graph g\nparam p0 w\n",
     "line 2: param p0: ", "missing dtype[shape] like f32[1024,64]"},
    {"ShapeWithoutBrackets", Doc::kGraph, "graph g\nparam p0 w f32\n",
     "line 2: param p0: ", "expected dtype[shape] like f32[1024,64]"},
    {"UnknownDtype", Doc::kGraph, "graph g\nparam p0 w f64[2]\n",
     "line 2: param p0: ",
     "unknown dtype 'f64' in 'f64[2]' (expected f32, "
     "bf16 or f16)"},
    {"BadDimension", Doc::kGraph, "graph g\nparam p0 w f32[2,x]\n",
     "line 2: param p0: ", "expected an integer dimension, got 'x'"},
    {"EmptyDimension", Doc::kGraph, "graph g\nparam p0 w f32[2,]\n",
     "line 2: param p0: ", "expected an integer dimension, got ''"},
    // Nodes.
    {"BadNodeIdPrefix", Doc::kGraph, "graph g\nnode p1 a fwd\n",
     "line 2: node: ", "expected a node id like n7, got 'p1'"},
    {"MissingPhase", Doc::kGraph, "graph g\nnode n0 a\n",
     "line 2: node n0: ", "missing a phase (fwd, bwd or opt)"},
    {"UnknownPhase", Doc::kGraph, "graph g\nnode n0 a forward\n",
     "line 2: node n0: ", "unknown phase 'forward' (expected fwd, bwd or opt)"},
    {"UnknownNodeAttribute", Doc::kGraph, "graph g\nnode n3 a fwd tim=1ms\n",
     "line 2: node n3: ",
     "unknown attribute 'tim' (expected one of mb, of, params, flops, time, "
     "act, ws, recompute)"},
    {"DuplicateAttribute", Doc::kGraph,
     "graph g\nnode n0 a fwd time=1 time=2\n",
     "line 2: node n0: ", "duplicate attribute 'time'"},
    {"BareTokenAmongAttributes", Doc::kGraph, "graph g\nnode n0 a fwd p0\n",
     "line 2: node n0: ", "unexpected 'p0' (expected key=value attributes"},
    {"FlagWithValue", Doc::kGraph, "graph g\nnode n0 a bwd recompute=1\n",
     "line 2: node n0: ", "'recompute' is a flag and takes no value"},
    {"MalformedTime", Doc::kGraph, "graph g\nnode n0 a fwd time=1xs\n",
     "line 2: node n0: ", "time: expected a time such as 0.002, 2ms"},
    {"TimeWithSpaceBeforeUnit", Doc::kGraph,
     "graph g\nnode n0 a fwd time=1 ms\n",
     "line 2: node n0: ", "unexpected 'ms'"},
    {"MalformedFlops", Doc::kGraph, "graph g\nnode n0 a fwd flops=lots\n",
     "line 2: node n0: ", "flops: expected a number such as 1e6"},
    {"FlopsOutOfRange", Doc::kGraph, "graph g\nnode n0 a fwd flops=1e999\n",
     "line 2: node n0: ", "flops: expected a number"},
    {"FractionalBytes", Doc::kGraph, "graph g\nnode n0 a fwd act=1.5B\n",
     "line 2: node n0: ", "act: expected a whole byte count"},
    {"UnknownByteUnit", Doc::kGraph, "graph g\nnode n0 a fwd act=4KB\n",
     "line 2: node n0: ",
     "act: expected a whole byte count such as 4096, 4KiB"},
    {"BytesOverflow", Doc::kGraph, "graph g\nnode n0 a fwd ws=9999999999GiB\n",
     "line 2: node n0: ", "(out of range)"},
    {"MicroBatchOutOfRange", Doc::kGraph,
     "graph g\nnode n0 a fwd mb=2147483648\n", "line 2: node n0: ",
     "mb: expected an integer, got '2147483648' (out of range)"},
    {"BadTwinId", Doc::kGraph, "graph g\nnode n1 a bwd of=0\n",
     "line 2: node n1: ", "of: expected a node id like n7, got '0'"},
    {"BadParamInList", Doc::kGraph, "graph g\nnode n0 a fwd params=p1,n2\n",
     "line 2: node n0: ",
     "params: expected a param id like p3, got 'n2' in list 'p1,n2'"},
    {"TrailingCommaInList", Doc::kGraph, "graph g\nnode n0 a fwd params=p1,\n",
     "line 2: node n0: ", "expected a param id like p3, got ''"},
    {"ScheduleStatementInGraph", Doc::kGraph, "graph g\ngroup g0 p1\n",
     "line 2: ",
     "unknown statement 'group' in a graph (expected param or node); 'group' "
     "lines belong in a schedule"},
    {"ProfileStatementInGraph", Doc::kGraph, "graph g\ntime n0 1ms\n",
     "line 2: ", "'time' lines belong in a profile"},
    {"LineNumberCountsCommentsAndBlanks", Doc::kGraph,
     "# c\n\ngraph g\n\n# x\nnode n0 a fwd time=zz\n",
     "line 6: node n0: ", "time: expected a time"},
    // Quoting.
    {"UnterminatedQuote", Doc::kGraph, "graph g\nparam p0 \"abc f32[1]\n",
     "line 2: ", "unterminated quoted string"},
    {"UnknownEscape", Doc::kGraph, "graph g\nparam p0 \"a\\qb\" f32[1]\n",
     "line 2: param p0: ", "unknown escape '\\q'"},
    {"BadHexEscape", Doc::kGraph, "graph g\nparam p0 \"a\\x4\" f32[1]\n",
     "line 2: param p0: ", "expected two hex digits after \\x"},
    {"QuoteInsideBareName", Doc::kGraph, "graph g\nparam p0 ab\"c\" f32[1]\n",
     "line 2: param p0: ", "a quote may only start a string"},
    {"TextAfterClosingQuote", Doc::kGraph, "graph \"g\"x\n",
     "line 1: graph: ", "unexpected text after the closing quote"},
    // Schedules.
    {"ScheduleMissingHash", Doc::kSchedule, "schedule v1 mode=zero3\n",
     "line 1: schedule: ", "missing attribute graph= (e.g. graph="},
    {"ScheduleBadVersion", Doc::kSchedule, "schedule 3 graph=abc\n",
     "line 1: schedule: ", "expected a version id like v3, got '3'"},
    {"ScheduleBadMode", Doc::kSchedule, "schedule v1 graph=abc mode=zero2\n",
     "line 1: schedule: ",
     "mode: unknown mode 'zero2' (expected zero3 or "
     "zero1)"},
    {"ScheduleBadBudget", Doc::kSchedule, "schedule v1 graph=abc budget=lots\n",
     "line 1: schedule: ", "budget: expected a whole byte count"},
    {"GroupBadId", Doc::kSchedule, "schedule v1 graph=abc\ngroup p0 p1\n",
     "line 2: group: ", "expected a group id like g2, got 'p0'"},
    {"GroupTrailingToken", Doc::kSchedule,
     "schedule v1 graph=abc\ngroup g0 p1 p2\n",
     "line 2: group g0: ", "unexpected 'p2' at the end of the line"},
    {"OffloadUnknownAttribute", Doc::kSchedule,
     "schedule v1 graph=abc\noffload o0 p1 size=4\n", "line 2: offload o0: ",
     "unknown attribute 'size' (expected one of bytes)"},
    {"ActionUnknownKind", Doc::kSchedule,
     "schedule v1 graph=abc\nbefore n1 gather g0\n", "line 2: before n1: ",
     "unknown action 'gather' (expected allgather, wait, release, "
     "reduce_scatter, offload or reload)"},
    {"ActionMissingNode", Doc::kSchedule, "schedule v1 graph=abc\nafter\n",
     "line 2: after: ", "missing a node id like n7"},
    {"ActionMissingGroup", Doc::kSchedule,
     "schedule v1 graph=abc\nbefore n1 allgather\n",
     "line 2: before n1 allgather: ", "missing a group id like g2"},
    {"ActionWrongArgumentKind", Doc::kSchedule,
     "schedule v1 graph=abc\nafter n1 release p0\n",
     "line 2: after n1 release: ", "expected a group id like g2, got 'p0'"},
    {"ReloadMissingEntry", Doc::kSchedule,
     "schedule v1 graph=abc\nbefore n9 reload\n",
     "line 2: before n9 reload: ", "missing an offload id like o1"},
    {"ActionExtraToken", Doc::kSchedule,
     "schedule v1 graph=abc\nbefore n1 wait g0 g1\n",
     "line 2: before n1 wait: ",
     "unexpected 'g1' (expected key=value attributes, one of params, offload)"},
    {"ActionAttributeForOwnField", Doc::kSchedule,
     "schedule v1 graph=abc\nbefore n1 wait g0 group=g1\n",
     "line 2: before n1 wait: ",
     "unknown attribute 'group' (expected one of params, offload)"},
    {"UnknownAnchor", Doc::kSchedule,
     "schedule v1 graph=abc\naround n1 wait g0\n", "line 2: ",
     "unknown statement 'around' in a schedule (expected group, persistent, "
     "offload, before, after, predict, provenance, explain or decision)"},
    {"DuplicatePredict", Doc::kSchedule,
     "schedule v1 graph=abc\npredict iteration=1\npredict iteration=2\n",
     "line 3: ", "duplicate 'predict' line (the first is at line 2)"},
    {"PredictBadTime", Doc::kSchedule,
     "schedule v1 graph=abc\npredict iteration=fast\n",
     "line 2: predict: ", "iteration: expected a time"},
    {"ProvenanceBadWindow", Doc::kSchedule,
     "schedule v1 graph=abc\nprovenance window=10-20\n", "line 2: provenance: ",
     "window: expected an iteration window like 10..20, got '10-20'"},
    {"ProvenanceEmptyPass", Doc::kSchedule,
     "schedule v1 graph=abc\nprovenance passes=a,,b\n",
     "line 2: provenance: ", "passes: empty element in list 'a,,b'"},
    {"NodeLineInSchedule", Doc::kSchedule,
     "schedule v1 graph=abc\nnode n0 a "
     "fwd\n",
     "line 2: ", "'node' lines belong in a graph"},
    // Profiles.
    {"ProfileMissingHash", Doc::kProfile, "profile rank=0\n",
     "line 1: profile: ", "missing attribute graph="},
    {"ProfileBadRank", Doc::kProfile, "profile graph=abc rank=r0\n",
     "line 1: profile: ", "rank: expected an integer, got 'r0'"},
    {"TimeMissingValue", Doc::kProfile, "profile graph=abc\ntime n0\n",
     "line 2: time n0: ", "missing the node's time"},
    {"TimeBadSamples", Doc::kProfile,
     "profile graph=abc\ntime n0 1ms samples=1.5\n",
     "line 2: time n0: ", "samples: expected an integer, got '1.5'"},
    {"CollectiveUnknownKind", Doc::kProfile,
     "profile graph=abc\ncollective broadcast g0\n", "line 2: collective: ",
     "unknown collective 'broadcast' (expected allgather, reduce_scatter or "
     "allreduce)"},
    {"CollectiveBadAnchor", Doc::kProfile,
     "profile graph=abc\ncollective allgather g0 at=5\n",
     "line 2: collective allgather: ", "at: expected a node id like n7"},
    {"MemoryUnknownAttribute", Doc::kProfile,
     "profile graph=abc\nmemory n0 before=1 peak=2\n", "line 2: memory n0: ",
     "unknown attribute 'peak' (expected one of before, after, rise, net)"},
    {"DuplicateProfileHeader", Doc::kProfile,
     "profile graph=abc\nprofile graph=abc\n",
     "line 2: ", "duplicate 'profile' header line"},
};

INSTANTIATE_TEST_SUITE_P(
    AllCases, MalformedTextTest, ::testing::ValuesIn(kMalformedCases),
    [](const ::testing::TestParamInfo<MalformedCase>& info) {
      return std::string(info.param.name);
    });

// --- Robustness ------------------------------------------------------------

// Every parser must answer OK or InvalidArgument, and whatever it accepts
// must print to text that parses back to the same print.
void ExpectParsesOrRejects(const std::string& text) {
  absl::StatusOr<Graph> graph = ParseGraph(text);
  if (graph.ok()) {
    const std::string printed = PrintGraph(*graph);
    absl::StatusOr<Graph> again = ParseGraph(printed);
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << printed;
    EXPECT_EQ(PrintGraph(*again), printed);
  } else {
    ASSERT_EQ(graph.status().code(), absl::StatusCode::kInvalidArgument)
        << graph.status();
  }
  absl::StatusOr<Schedule> schedule = ParseSchedule(text);
  if (schedule.ok()) {
    const std::string printed = PrintSchedule(*schedule);
    absl::StatusOr<Schedule> again = ParseSchedule(printed);
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << printed;
    EXPECT_EQ(PrintSchedule(*again), printed);
  } else {
    ASSERT_EQ(schedule.status().code(), absl::StatusCode::kInvalidArgument)
        << schedule.status();
  }
  absl::StatusOr<Profile> profile = ParseProfile(text);
  if (profile.ok()) {
    const std::string printed = PrintProfile(*profile);
    absl::StatusOr<Profile> again = ParseProfile(printed);
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << printed;
    EXPECT_EQ(PrintProfile(*again), printed);
  } else {
    ASSERT_EQ(profile.status().code(), absl::StatusCode::kInvalidArgument)
        << profile.status();
  }
}

TEST(ParseRobustnessTest, Parse_TruncatedFixtures_OkOrInvalidArgument) {
  for (const char* name :
       {"tiny_graph.txt", "tiny_schedule.txt", "tiny_profile.txt"}) {
    const std::string text = ReadTestdata(name);
    ASSERT_FALSE(text.empty()) << name;
    for (size_t length = 0; length <= text.size(); ++length) {
      SCOPED_TRACE(absl::StrCat(name, " truncated to ", length));
      ExpectParsesOrRejects(text.substr(0, length));
      if (HasFatalFailure()) return;
    }
  }
}

TEST(ParseRobustnessTest, Parse_MutatedFixtures_OkOrInvalidArgument) {
  // Bytes that mean something to the grammar, plus a few that do not.
  static constexpr char kInteresting[] = "=,\"\\# \t\r\n[]..--pngov0189eEiBsmu";
  std::mt19937 rng(20240611);
  int accepted = 0;
  for (const char* name :
       {"tiny_graph.txt", "tiny_schedule.txt", "tiny_profile.txt"}) {
    const std::string original = ReadTestdata(name);
    ASSERT_FALSE(original.empty()) << name;
    for (int round = 0; round < 1500; ++round) {
      std::string text = original;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !text.empty(); ++e) {
        const size_t pos = rng() % text.size();
        char byte = kInteresting[rng() % (sizeof(kInteresting) - 1)];
        if (rng() % 8 == 0) byte = static_cast<char>(rng() % 256);
        switch (rng() % 3) {
          case 0:
            text[pos] = byte;
            break;
          case 1:
            text.insert(pos, 1, byte);
            break;
          default:
            text.erase(pos, 1 + rng() % 8);
            break;
        }
      }
      SCOPED_TRACE(absl::StrCat(name, " round ", round, ":\n", text));
      ExpectParsesOrRejects(text);
      if (HasFatalFailure()) return;
      accepted += ParseGraph(text).ok() || ParseSchedule(text).ok() ||
                  ParseProfile(text).ok();
    }
  }
  // Some mutations (e.g. inside a comment) leave the text valid.
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace tandem
