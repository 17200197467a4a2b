// What the executor runs: a program of ordered nodes, each a callable with
// the params it uses declared, reading and writing named values
// (worker/README.md, "Runtime rules"). The built-in models (worker/models)
// and exported archives (worker/models/archive_program.h) produce programs.
// The executor is blind to where a program comes from: it sees names,
// shapes, declared params, value names and callables.
//
// Values: a batch input (Program::inputs) or a node output, each defined
// once, readable by any later node, not only the next (residual streams,
// masks). The loss is an output of the last node.
#ifndef TANDEM_WORKER_RUNTIME_PROGRAM_H_
#define TANDEM_WORKER_RUNTIME_PROGRAM_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/ir/graph.h"
#include "tandem/v1/archive.pb.h"

namespace tandem {

struct ProgramParam {
  // Module path, e.g. "layers.0.attn.wq.weight".
  std::string name;
  std::vector<int64_t> shape;
  // Wrapping unit, e.g. "layers.0" (for a param several nodes use: the
  // first's).
  std::string unit;
  // Writes the full initial value (numel fp32 elements). Must give the same
  // values on every rank and at every world size.
  std::function<void(float* data, int64_t numel)> init;
  // False for a frozen param (requires_grad=False): gathered for its uses
  // like any other, but no gradient, no reduce-scatter, no optimizer state,
  // never updated (Param::trainable in the graph).
  bool trainable = true;
  // Its name in weight files (common/archive/weights_file.h): Hugging Face's
  // for the built-in models, `name` for exported ones.
  std::string export_name;
};

// A batch input the program reads.
struct ProgramInput {
  std::string name;
  // What the token data sources (worker/data) feed it: "tokens" (the
  // sequence), "targets" (the sequence shifted by one), or "" (nothing: only
  // the tensors source, which feeds every input by name, can). The tensors
  // source pads "targets" with -100 and counts its other entries.
  std::string role;
  // An archive's input (empty for the builtin models): the archive's dtype
  // name, the example batch's shape, and the dims that may differ from it
  // (dim 0 always). The tensors data source checks its arrays against them
  // and cuts the inputs whose dim 1 is dynamic (worker/data/tensor_source.h).
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<int32_t> dynamic_dims;
  // What data.kind synthetic draws for it (worker/data/synthetic_inputs.h),
  // when the archive says.
  std::optional<v1::ArchiveSynthetic> synthetic;
};

// One micro-batch of this rank: a tensor for every program input, by name.
struct MicroBatch {
  std::map<std::string, at::Tensor> tensors;
  // The micro-batch's share of the global batch's loss: its counted items
  // over the global batch's (every rank, every micro-batch); the executor
  // weights its mean loss by it. 0: every micro-batch counts alike, a share
  // of 1 / (world * micro-batches). Every micro-batch of a step sets it, or
  // none does.
  double loss_weight = 0;
};

struct ProgramNode {
  // Forward node name, e.g. "layers.0.attn".
  std::string name;
  // Indices into Program::params, in the order `forward` receives them. A
  // param may appear in several nodes (tied weights).
  std::vector<int32_t> param_ids;
  // Value names it reads, in the order `forward` receives them, and the
  // value names of the tensors it returns, in order.
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  // Computes the node: one tensor per output. `params` are the full tensors
  // of param_ids.
  std::function<std::vector<at::Tensor>(absl::Span<const at::Tensor> inputs,
                                        absl::Span<const at::Tensor> params)>
      forward;
  // Activation checkpointing: the executor runs `forward` without keeping
  // its intermediate activations (only its inputs) and runs it again in
  // backward, on the params gathered then, to back-propagate through it.
  // `forward` must then compute the same values from the same inputs and
  // params every time (no randomness of its own). The graph's backward twin
  // is marked Node::recompute.
  bool recompute = false;
};

// Glue (worker/README.md, "Glue"): the code of a container whose forward
// cannot be captured as a sequence of nodes (it branches on data, reads a
// length with .item(), assigns through a mask), run as one callable that
// calls its child nodes itself, in order, through the op
// tandem::call_unit(int unit, Tensor?[] inputs) -> Tensor[] (glue_op.h).
// The glue covers the nodes [first, first + count); it reads the values
// `inputs` and defines `outputs`. The nodes it covers take what it passes
// them and give back what it receives: their own `inputs` and `outputs`
// name glue-local values (their outputs' count is what they return), which
// no other node reads. Every call must be the next node of its span, and
// the glue must call each exactly once per micro-batch: the schedule's
// actions run before and after each call, as for any node, and backward
// boundaries sit on each call's outputs.
struct ProgramGlue {
  std::string name;
  int32_t first = 0;
  int32_t count = 0;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::function<std::vector<at::Tensor>(absl::Span<const at::Tensor> inputs)>
      forward;
};

struct Program {
  std::string name;
  std::vector<ProgramParam> params;
  std::vector<ProgramInput> inputs;
  // The forward nodes of one micro-batch, in execution order.
  std::vector<ProgramNode> nodes;
  // Glues over runs of `nodes`, in node order, disjoint.
  std::vector<ProgramGlue> glues;
  // The value holding the scalar loss (the mean over this rank's tokens or
  // samples of the micro-batch): an output of the last node.
  std::string loss;
  // Mixed precision (worker/README.md, "Mixed precision"): params are
  // gathered and computed in `dtype` (the nodes' forwards receive them so);
  // a non-f32 param's shard keeps an f32 master copy, and gradients are
  // reduce-scattered in `reduce_dtype` (f32 or `dtype`).
  DType dtype = DType::kF32;
  DType reduce_dtype = DType::kF32;
};

// Whether `program` takes an input of no role, which only a source of named
// inputs (tensors, or synthetic ones) can feed.
bool HasNamedInputs(const Program& program);

// The values of a program, numbered: inputs first, then node (and glue)
// outputs in order.
struct ProgramFlow {
  std::vector<std::string> values;
  // Per node, the value ids it reads and writes (none for a node a glue
  // covers: its values are the glue's own).
  std::vector<std::vector<int32_t>> node_inputs;
  std::vector<std::vector<int32_t>> node_outputs;
  // Per value, the last node that reads it (-1: none); a glue's inputs are
  // read until its last node.
  std::vector<int32_t> last_reader;
  int32_t loss = -1;
  // Per node, the glue covering it (-1: none); per glue, the value ids it
  // reads and defines (defined at its last node).
  std::vector<int32_t> glue_of;
  std::vector<std::vector<int32_t>> glue_inputs;
  std::vector<std::vector<int32_t>> glue_outputs;
};

// Numbers the program's values and checks the flow: every node (or glue)
// input is a batch input or an output of an earlier node or glue, nothing is
// defined twice, glues cover disjoint runs of nodes in order, the loss is an
// output of the last node (or of the glue covering it). Errors name the
// node, glue and value.
absl::StatusOr<ProgramFlow> AnalyzeProgramFlow(const Program& program);

// The iteration graph `program` runs with `micro_batches` gradient-
// accumulation passes: params in program order (ids 0..), then per
// micro-batch the forward nodes and their backward twins "<name>.bwd" in
// reverse (names prefixed "mb<k>." when micro_batches > 1; a twin is marked
// recompute when its node is), then one "optimizer" node. Times and sizes are
// left 0: see AnnotateEstimates.
// Fails when names repeat, a node names an unknown param, or the value flow
// is broken (AnalyzeProgramFlow).
absl::StatusOr<Graph> DeriveGraph(const Program& program, int32_t world_size,
                                  int32_t micro_batches,
                                  int64_t tokens_per_micro_batch);

// Copies flops, times and byte estimates from `estimates` (e.g. the graph
// builder's) onto `graph`, node by node; fails unless both have the same
// structural hash.
absl::Status AnnotateEstimates(const Graph& estimates, Graph& graph);

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_PROGRAM_H_
