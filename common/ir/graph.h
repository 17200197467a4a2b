// The iteration graph IR: one training iteration as an ordered list of nodes
// and the params they use (common/README.md, "The IR"). Plain value types; see
// validate.h for the rules a well-formed graph keeps, text_format.h for the
// readable form and proto_convert.h for tandem.v1.Graph.
#ifndef TANDEM_COMMON_IR_GRAPH_H_
#define TANDEM_COMMON_IR_GRAPH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace tandem {

enum class DType { kF32, kBF16, kF16 };

// Bytes of one element.
int DTypeBytes(DType dtype);
// Bytes of optimizer state per param element: two fp32 Adam moments, plus
// an fp32 master copy of a low-precision param. The simulator, the lowering
// and the worker's executor all count it.
int64_t OptimizerStateBytesPerElement(DType param_dtype);
// "f32", "bf16", "f16".
absl::string_view DTypeName(DType dtype);
std::optional<DType> ParseDType(absl::string_view name);

enum class Phase { kForward, kBackward, kOptimizer };

// "fwd", "bwd", "opt".
absl::string_view PhaseName(Phase phase);
std::optional<Phase> ParsePhase(absl::string_view name);

struct Param {
  // Largest element count a param may have (2^48): keeps byte counts of any
  // dtype far from int64 overflow.
  static constexpr int64_t kMaxNumel = int64_t{1} << 48;

  int32_t id = 0;
  // Module path, e.g. "layers.3.attn.wq.weight"; unique within a graph.
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kF32;
  // FSDP-style wrapping unit, e.g. "layers.3"; params of one unit are
  // gathered together by unit-based policies.
  std::string unit;
  // False for a frozen param (PyTorch's requires_grad=False): still sharded
  // and gathered for every use (the forward reads it), but it has no
  // gradient, no REDUCE_SCATTER, no optimizer state and is never updated.
  bool trainable = true;

  int64_t numel() const;
  int64_t bytes() const { return numel() * DTypeBytes(dtype); }
  // Elements each rank owns: numel padded up to a multiple of world_size,
  // divided by world_size.
  int64_t shard_numel(int world_size) const;

  bool operator==(const Param& other) const;
  bool operator!=(const Param& other) const { return !(*this == other); }
};

struct Node {
  int32_t id = 0;
  // Unique within a graph.
  std::string name;
  Phase phase = Phase::kForward;
  // 0-based micro-batch of a forward or backward node.
  int32_t micro_batch = 0;
  // Backward nodes: the forward node they mirror.
  std::optional<int32_t> forward_id;
  // Backward nodes under activation checkpointing recompute the forward first.
  bool recompute = false;
  std::vector<int32_t> param_ids;
  double flops = 0;
  // Measured or estimated seconds.
  double time_s = 0;
  // Activations a forward node leaves alive until its backward twin ends.
  int64_t activation_bytes = 0;
  // Bytes alive only while the node runs.
  int64_t workspace_bytes = 0;
  // What a profile measured the node's own allocations to do beyond the
  // estimates above (set by the planner's CalibrateMemory; not part of the
  // graph's text form; 0: not measured): extra bytes (>= 0) held while it
  // runs, and bytes it leaves allocated at its end (negative: fewer), which
  // the simulator carries from node to node as a running sum.
  int64_t measured_extra_bytes = 0;
  int64_t measured_carry_bytes = 0;

  bool operator==(const Node& other) const;
  bool operator!=(const Node& other) const { return !(*this == other); }
};

struct Graph {
  std::string name;
  int32_t world_size = 1;
  int32_t micro_batches = 1;
  // Tokens per rank per micro-batch.
  int64_t tokens_per_micro_batch = 0;
  // Mixed precision: gradients are reduce-scattered in this dtype (f32 for
  // bf16 params that reduce in f32); unset, each param's own dtype.
  std::optional<DType> reduce_dtype;
  std::vector<Param> params;
  // Execution order.
  std::vector<Node> nodes;

  // Lookups by id; nullptr when absent. Linear in the graph size: build an
  // index (GraphIndex) for repeated lookups.
  const Param* FindParam(int32_t id) const;
  const Node* FindNode(int32_t id) const;

  int64_t TotalParamNumel() const;
  // The dtype `param`'s gradient is reduce-scattered in.
  DType GradReduceDType(const Param& param) const {
    return reduce_dtype.value_or(param.dtype);
  }
  // Bytes of `param`'s gradient shard on one rank, reduced once per step (in
  // its reduce dtype), and of the padded buffer its reduce-scatter moves.
  int64_t GradShardBytes(const Param& param) const;
  int64_t ReduceScatterBytes(const Param& param) const;
  // Structural hash: 16 lowercase hex digits over param names, shapes, dtypes,
  // which params are frozen, a reduce dtype that differs from a trained
  // param's dtype, and the node order (names, phases, params, twins). Times,
  // FLOPs, byte estimates and the world size do not change it; a graph whose
  // params all train in their own dtype hashes as it did before frozen params
  // and reduce dtypes existed.
  std::string StructuralHash() const;

  bool operator==(const Graph& other) const;
  bool operator!=(const Graph& other) const { return !(*this == other); }
};

// One unit of a model (a program node, an archive unit) as the iteration
// graph sees it: the params it uses, whether its backward recomputes it,
// and what its forward keeps for backward.
struct IterationUnit {
  std::string name;
  std::vector<int32_t> param_ids;
  bool recompute = false;
  int64_t activation_bytes = 0;
};

// Appends one iteration's nodes to `graph` (its params already in place):
// per micro-batch (graph.micro_batches, at least one), each unit's forward
// node in order ("mbK." before the name when there are several), then each
// backward twin ("<name>.bwd") in reverse, then the optimizer. The one
// skeleton both the worker (DeriveGraph) and the coordinator's submit check
// of an archive build, so that the two graphs hash alike.
void AppendIterationNodes(const std::vector<IterationUnit>& units,
                          Graph& graph);

// Id -> position maps. Positions are indices into Graph::params /
// Graph::nodes; with duplicate ids the first wins.
class GraphIndex {
 public:
  explicit GraphIndex(const Graph& graph);

  // Index into graph.params / graph.nodes, or -1 when unknown.
  int ParamPos(int32_t id) const;
  int NodePos(int32_t id) const;

 private:
  absl::flat_hash_map<int32_t, int> param_pos_;
  absl::flat_hash_map<int32_t, int> node_pos_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_IR_GRAPH_H_
