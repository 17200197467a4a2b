// Small IR values built in code, shared by the common tests.
#ifndef TANDEM_TESTS_UNIT_COMMON_TEST_GRAPHS_H_
#define TANDEM_TESTS_UNIT_COMMON_TEST_GRAPHS_H_

#include "common/ir/graph.h"
#include "common/ir/profile.h"
#include "common/ir/schedule.h"

namespace tandem::testing {

// Two layers and a head: n0 embed, n1 l0, n2 l1, n3 loss forward; their
// backward twins n4..n7 in reverse; n8 optimizer.
inline Graph TwoLayerGraph() {
  Graph g;
  g.name = "two-layer";
  g.world_size = 2;
  g.micro_batches = 1;
  g.tokens_per_micro_batch = 256;
  g.params = {
      {0, "embed.weight", {100, 16}, DType::kF32, "embed"},
      {1, "layers.0.w", {16, 16}, DType::kF32, "layers.0"},
      {2, "layers.0.b", {15}, DType::kF32, "layers.0"},
      {3, "layers.1.w", {16, 16}, DType::kBF16, "layers.1"},
  };
  auto fwd = [](int32_t id, const char* name, std::vector<int32_t> params) {
    Node n;
    n.id = id;
    n.name = name;
    n.phase = Phase::kForward;
    n.param_ids = std::move(params);
    n.flops = 1e6 * (id + 1);
    n.time_s = 1e-3 * (id + 1);
    n.activation_bytes = 4096 * (id + 1);
    return n;
  };
  auto bwd = [](int32_t id, const Node& f) {
    Node n;
    n.id = id;
    n.name = f.name + ".bwd";
    n.phase = Phase::kBackward;
    n.forward_id = f.id;
    n.param_ids = f.param_ids;
    n.flops = 2 * f.flops;
    n.time_s = 2 * f.time_s;
    return n;
  };
  g.nodes = {fwd(0, "embed", {0}), fwd(1, "layers.0", {1, 2}),
             fwd(2, "layers.1", {3}), fwd(3, "loss", {})};
  for (int i = 3; i >= 0; --i) g.nodes.push_back(bwd(7 - i, g.nodes[i]));
  Node opt;
  opt.id = 8;
  opt.name = "optimizer";
  opt.phase = Phase::kOptimizer;
  opt.time_s = 5e-4;
  g.nodes.push_back(opt);
  return g;
}

// A schedule for TwoLayerGraph using every action kind.
inline Schedule TwoLayerSchedule(const Graph& g) {
  Schedule s;
  s.graph_hash = g.StructuralHash();
  s.version = 3;
  s.groups = {{0, {1, 2}}, {1, {3}}};
  s.persistent_param_ids = {0};
  s.offloads = {{0, {1, 2, 3}, 12345}};
  using K = ActionKind;
  using P = AnchorPosition;
  s.actions = {
      {K::kOffload, 0, P::kAfter, 0, {}, 0},
      {K::kAllGather, 1, P::kBefore, 0, {}, 0},
      {K::kWait, 1, P::kBefore, 0, {}, 0},
      {K::kAllGather, 1, P::kAfter, 1, {}, 0},
      {K::kRelease, 1, P::kAfter, 0, {}, 0},
      {K::kWait, 2, P::kBefore, 1, {}, 0},
      {K::kReduceScatter, 5, P::kAfter, 0, {3}, 0},
      {K::kReduceScatter, 6, P::kAfter, 0, {1, 2}, 0},
      {K::kReload, 8, P::kBefore, 0, {}, 0},
  };
  s.prediction = {0.0123, 0.01, 0.004, 0.0023, 0.001, 1 << 20};
  s.provenance.passes = {"zero3-insert", "prefetch"};
  s.provenance.window_first_iteration = 10;
  s.provenance.window_last_iteration = 20;
  s.provenance.plan_wall_s = 0.002;
  s.provenance.reason = "drift";
  s.budget_bytes = int64_t{80} << 30;
  return s;
}

inline Profile TwoLayerProfile(const Graph& g) {
  Profile p;
  p.graph_hash = g.StructuralHash();
  p.rank = 1;
  p.schedule_version = 3;
  p.first_iteration = 10;
  p.last_iteration = 20;
  p.iteration_s = 0.015;
  p.peak_bytes = 3 << 20;
  p.nodes = {{0, 0.001, 11}, {5, 0.0042, 11}};
  p.collectives = {
      {CollectiveKind::kAllGather, 0, {}, 4096, 0.002, 0.0005, 1},
      {CollectiveKind::kReduceScatter, 0, {1, 2}, 4096, 0.003, 0.0, 6},
  };
  p.memory = {{1, 1000, 2000}, {6, 3000, 2500}};
  return p;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UNIT_COMMON_TEST_GRAPHS_H_
