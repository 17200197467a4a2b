#include "common/ir/proto_convert.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/common/test_graphs.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using testing::TwoLayerGraph;
using testing::TwoLayerProfile;
using testing::TwoLayerSchedule;

TEST(ProtoConvertTest, Graph_RoundTrip_IsEqual) {
  Graph g = TwoLayerGraph();
  g.nodes[5].recompute = true;
  g.nodes[5].workspace_bytes = 1 << 20;
  const v1::Graph proto = ToProto(g);
  auto back = FromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, g);
}

TEST(ProtoConvertTest, Graph_ReduceDType_RoundTrips) {
  Graph g = TwoLayerGraph();
  for (Param& p : g.params) p.dtype = DType::kBF16;
  EXPECT_EQ(ToProto(g).reduce_dtype(), v1::DTYPE_UNSPECIFIED);
  g.reduce_dtype = DType::kF32;
  const v1::Graph proto = ToProto(g);
  EXPECT_EQ(proto.reduce_dtype(), v1::DTYPE_F32);
  auto back = FromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, g);
}

TEST(ProtoConvertTest, Graph_ToProto_FillsDerivedFields) {
  const Graph g = TwoLayerGraph();
  const v1::Graph proto = ToProto(g);
  EXPECT_EQ(proto.hash(), g.StructuralHash());
  ASSERT_EQ(proto.params_size(), 4);
  EXPECT_EQ(proto.params(2).numel(), 15);
  EXPECT_EQ(proto.params(2).shard_numel(), 8);  // world 2, padded to 16
  EXPECT_EQ(proto.params(3).dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(proto.nodes(0).forward_id(), -1);
  EXPECT_EQ(proto.nodes(4).forward_id(), 3);
  EXPECT_EQ(proto.nodes(8).phase(), v1::PHASE_OPTIMIZER);
}

TEST(ProtoConvertTest, Graph_WireRoundTrip_IsEqual) {
  const Graph g = TwoLayerGraph();
  std::string wire;
  ASSERT_TRUE(ToProto(g).SerializeToString(&wire));
  v1::Graph parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  auto back = FromProto(parsed);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, g);
}

TEST(ProtoConvertTest, Graph_UnspecifiedDType_IsRejected) {
  v1::Graph proto = ToProto(TwoLayerGraph());
  proto.mutable_params(1)->set_dtype(v1::DTYPE_UNSPECIFIED);
  auto back = FromProto(proto);
  EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(back.status().message()),
              HasSubstr("param p1: dtype is unspecified"));
}

TEST(ProtoConvertTest, Graph_UnspecifiedPhase_IsRejected) {
  v1::Graph proto = ToProto(TwoLayerGraph());
  proto.mutable_nodes(2)->set_phase(v1::PHASE_UNSPECIFIED);
  EXPECT_THAT(std::string(FromProto(proto).status().message()),
              HasSubstr("node n2: phase is unspecified"));
}

TEST(ProtoConvertTest, Graph_NumelMismatch_IsRejected) {
  v1::Graph proto = ToProto(TwoLayerGraph());
  proto.mutable_params(1)->set_numel(5);
  EXPECT_THAT(std::string(FromProto(proto).status().message()),
              HasSubstr("numel 5 does not match its shape (256)"));
}

TEST(ProtoConvertTest, Graph_StaleHash_IsRejected) {
  v1::Graph proto = ToProto(TwoLayerGraph());
  proto.mutable_params(1)->set_name("renamed");
  EXPECT_THAT(std::string(FromProto(proto).status().message()),
              HasSubstr("does not match its structure"));
  proto.clear_hash();
  EXPECT_TRUE(FromProto(proto).ok());
}

TEST(ProtoConvertTest, Graph_BackwardWithoutTwin_KeepsItAbsent) {
  v1::Graph proto = ToProto(TwoLayerGraph());
  proto.clear_hash();
  proto.mutable_nodes(4)->set_forward_id(-1);
  auto back = FromProto(proto);
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->nodes[4].forward_id.has_value());
}

TEST(ProtoConvertTest, Schedule_RoundTrip_IsEqual) {
  const Graph g = TwoLayerGraph();
  const Schedule s = TwoLayerSchedule(g);
  auto back = FromProto(ToProto(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, s);
  Schedule zero1 = s;
  zero1.mode = ShardingMode::kZero1;
  EXPECT_EQ(*FromProto(ToProto(zero1)), zero1);
}

TEST(ProtoConvertTest, Schedule_UnspecifiedEnums_AreRejected) {
  const Graph g = TwoLayerGraph();
  v1::Schedule proto = ToProto(TwoLayerSchedule(g));
  proto.set_mode(v1::SHARDING_MODE_UNSPECIFIED);
  EXPECT_THAT(std::string(FromProto(proto).status().message()),
              HasSubstr("mode is unspecified"));

  proto = ToProto(TwoLayerSchedule(g));
  proto.mutable_actions(3)->set_kind(v1::ACTION_KIND_UNSPECIFIED);
  EXPECT_THAT(std::string(FromProto(proto).status().message()),
              HasSubstr("action 3: kind is unspecified"));

  proto = ToProto(TwoLayerSchedule(g));
  proto.mutable_actions(2)->set_position(v1::ANCHOR_POSITION_UNSPECIFIED);
  EXPECT_THAT(std::string(FromProto(proto).status().message()),
              HasSubstr("action 2: position is unspecified"));
}

TEST(ProtoConvertTest, Profile_RoundTrip_IsEqual) {
  const Graph g = TwoLayerGraph();
  Profile p = TwoLayerProfile(g);
  p.host_copy_bytes = 12345;
  p.host_copy_s = 0.5;
  p.compute_s_per_allgather_byte = 1.5e-9;
  p.compute_s_per_reduce_scatter_byte = 2.5e-9;
  p.compute_s_per_copy_byte = 3e-10;
  p.allgather_stretch = 1.75;
  p.reduce_scatter_stretch = 1.5;
  p.copy_stretch = 1;
  ASSERT_FALSE(p.collectives.empty());
  p.collectives[0].computing_s = p.collectives[0].run_s / 2;
  ASSERT_FALSE(p.nodes.empty());
  p.nodes[0].allgather_overlap_bytes = 111;
  p.nodes[0].reduce_scatter_overlap_bytes = 222;
  p.nodes[0].copy_overlap_bytes = 333;
  p.allgather_scratch = {1, 1 << 20};
  p.reduce_scatter_scratch = {2, 0};
  ASSERT_FALSE(p.memory.empty());
  p.memory[0].rise_bytes = 4096;
  p.memory[0].net_bytes = -1024;
  auto back = FromProto(ToProto(p));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, p);
}

TEST(ProtoConvertTest, Profile_UnknownCollectiveKind_IsRejected) {
  v1::Profile proto = ToProto(TwoLayerProfile(TwoLayerGraph()));
  proto.mutable_collectives(1)->set_kind(static_cast<v1::CollectiveKind>(42));
  EXPECT_THAT(std::string(FromProto(proto).status().message()),
              HasSubstr("collective 1: kind is unspecified or unknown (42)"));
}

}  // namespace
}  // namespace tandem
