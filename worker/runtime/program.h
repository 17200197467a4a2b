// What the executor runs: a program of ordered nodes, each a callable with
// the params it uses declared (worker/README.md, "Runtime rules"). The built-in
// models (worker/models) produce programs; a TorchScript front end will later.
// The executor is blind to where a program comes from: it sees names,
// shapes, declared params and callables.
#ifndef TANDEM_WORKER_RUNTIME_PROGRAM_H_
#define TANDEM_WORKER_RUNTIME_PROGRAM_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/ir/graph.h"

namespace tandem {

struct ProgramParam {
  // Module path, e.g. "layers.0.attn.wq.weight".
  std::string name;
  std::vector<int64_t> shape;
  // Wrapping unit, e.g. "layers.0".
  std::string unit;
  // Writes the full initial value (numel fp32 elements). Must give the same
  // values on every rank and at every world size.
  std::function<void(float* data, int64_t numel)> init;
};

// One micro-batch of this rank: token ids and next-token targets, int64
// [micro_batch, seq_len].
struct MicroBatch {
  at::Tensor inputs;
  at::Tensor targets;
};

struct ProgramNode {
  // Forward node name, e.g. "layers.0.attn".
  std::string name;
  // Indices into Program::params, in the order `forward` receives them.
  std::vector<int32_t> param_ids;
  // Computes the node. `in` is the previous node's output (the first node
  // gets the token ids); `params` are the full tensors of param_ids. The last
  // node returns the scalar loss, the mean over this rank's tokens.
  std::function<at::Tensor(const at::Tensor& in,
                           absl::Span<const at::Tensor> params,
                           const MicroBatch& batch)>
      forward;
};

struct Program {
  std::string name;
  std::vector<ProgramParam> params;
  // The forward nodes of one micro-batch, in execution order.
  std::vector<ProgramNode> nodes;
};

// The iteration graph `program` runs with `micro_batches` gradient-
// accumulation passes: params in program order (ids 0..), then per
// micro-batch the forward nodes and their backward twins "<name>.bwd" in
// reverse (names prefixed "mb<k>." when micro_batches > 1), then one
// "optimizer" node. Times and sizes are left 0: see AnnotateEstimates.
// Fails when names repeat or a node names an unknown param.
absl::StatusOr<Graph> DeriveGraph(const Program& program, int32_t world_size,
                                  int32_t micro_batches,
                                  int64_t tokens_per_micro_batch);

// Copies flops, times and byte estimates from `estimates` (e.g. the graph
// builder's) onto `graph`, node by node; fails unless both have the same
// structural hash.
absl::Status AnnotateEstimates(const Graph& estimates, Graph& graph);

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_PROGRAM_H_
