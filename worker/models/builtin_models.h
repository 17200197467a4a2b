// The built-in models in libtorch: a Llama-style decoder (RMSNorm, rotary
// attention with grouped-query heads, SwiGLU) and its Mixtral-style MoE
// variant (top-k routed SwiGLU experts), built from the same ModelConfig as
// common/models/graph_builder.h. They reproduce the builder's naming contract
// exactly: param names, shapes and order, and node names, order and declared
// params, so DeriveGraph(program) has the builder's structural hash.
//
// Nodes (one micro-batch): embed, per layer layers.<i>.attn and
// layers.<i>.mlp (or layers.<i>.moe), norm, lm_head, loss. Inputs "tokens"
// and "targets" (int64 [b, s], roles tokens and targets). Each node writes
// one value named after itself, which the next node reads: the residual
// stream [b, s, d] through the layers, the logits [b, s, vocab] out of
// lm_head; loss reads lm_head and targets and writes the scalar mean
// cross-entropy "loss". With activation_checkpointing the attn and mlp/moe
// nodes are marked ProgramNode::recompute (the builder's recomputed blocks).
#ifndef TANDEM_WORKER_MODELS_BUILTIN_MODELS_H_
#define TANDEM_WORKER_MODELS_BUILTIN_MODELS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/models/model_config.h"
#include "worker/runtime/program.h"

namespace tandem {

// Builds the program of `config` with initial params drawn from `seed`
// (normal(0, 0.02) for matrices, output projections scaled by
// 1/sqrt(2 * layers), ones for norms). The same seed gives the same params at
// every world size. Errors: InvalidArgument for configs the worker cannot run
// (ValidateModelConfig, non-f32 dtypes, an odd head dimension).
absl::StatusOr<Program> BuildModelProgram(const ModelConfig& config,
                                          uint64_t seed);

}  // namespace tandem

#endif  // TANDEM_WORKER_MODELS_BUILTIN_MODELS_H_
