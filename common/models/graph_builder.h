// Builds the iteration graph of a built-in model from its config, with exact
// param shapes and analytic FLOPs and activation bytes per node, so the
// planner works at paper scale without running the model. The worker's
// libtorch models reproduce the param names, shapes and order and the node
// names and order below exactly: the structural hashes must match.
//
// Params, ids 0.. in this order, all in the config's dtype (torch Linear
// weights are [out, in]; hd = d_model / heads):
//   embed.weight                        [vocab, d]         unit embed
//   per layer i, unit layers.<i>:
//   layers.<i>.attn_norm.weight         [d]
//   layers.<i>.attn.wq.weight           [heads*hd, d]
//   layers.<i>.attn.wk.weight           [kv_heads*hd, d]
//   layers.<i>.attn.wv.weight           [kv_heads*hd, d]
//   layers.<i>.attn.wo.weight           [d, heads*hd]
//   layers.<i>.mlp_norm.weight          [d]
//   llama:
//   layers.<i>.mlp.w_gate.weight        [ffn, d]
//   layers.<i>.mlp.w_up.weight          [ffn, d]
//   layers.<i>.mlp.w_down.weight        [d, ffn]
//   moe (expert weights are bare parameters, no ".weight"):
//   layers.<i>.moe.router.weight        [experts, d]
//   layers.<i>.moe.w_gate               [experts, ffn, d]
//   layers.<i>.moe.w_up                 [experts, ffn, d]
//   layers.<i>.moe.w_down               [experts, d, ffn]
//   norm.weight                         [d]                unit head
//   lm_head.weight                      [vocab, d]         unit head
//
// Nodes, ids 0.. in execution order. One micro-batch, forward: embed, then per
// layer layers.<i>.attn (attn_norm + q/k/v/o + causal attention + residual)
// and layers.<i>.mlp or layers.<i>.moe (mlp_norm + SwiGLU or routed experts +
// residual), then norm, lm_head, loss; backward mirrors them in reverse as
// "<name>.bwd" (loss.bwd first, embed.bwd last). Each node reads the params of
// its block: embed.weight; attn_norm and wq, wk, wv, wo; mlp_norm and the
// three SwiGLU weights (moe: mlp_norm, router, w_gate, w_up, w_down);
// norm.weight; lm_head.weight; loss none. Its backward twin reads the same.
// With grad_accum K > 1 the K passes run in order (fwd 0, bwd 0, fwd 1, ...)
// and every node name gets the prefix "mb<k>." (e.g. "mb1.layers.0.attn.bwd");
// with K = 1 there is no prefix. One optimizer node, "optimizer" (no params:
// it steps this rank's shards), ends the graph. With activation checkpointing
// each attn/mlp/moe forward keeps only its input and its backward recomputes
// it (recompute = true).
//
// Cost model (T = micro_batch * seq_len tokens per rank):
// - FLOPs: matmuls at 2 per multiply-add; causal attention core
//   2 * micro_batch * seq_len^2 * d; MoE runs top_k experts per token plus
//   the router; small elementwise terms (RMSNorm 4, residual 1, SwiGLU 4 per
//   element, loss 4 per logit). Backward is 2x forward, 3x with recompute.
//   The optimizer costs 10 FLOPs per shard element.
// - time_s = max(flops / device_flops, bytes / device_bytes_per_s), where
//   bytes are the params read plus activations read and written once
//   (backward: 2x, 3x with recompute); the optimizer reads and writes param,
//   grad, fp32 master (non-f32 dtypes) and two fp32 moments per shard element.
// - activation_bytes (forward only): what the worker's eager libtorch ops
//   save for backward (worker/models/builtin_models.cc), a block's input
//   counted and its output left to the block that reads it. RMSNorm keeps
//   R = 3d + 1 per token (input, its square, rsqrt, scaled input). embed
//   T*8 (token ids); attn T*(R + d + 4*heads*hd)*dtype + b*heads*s^2*dtype
//   (the softmax probabilities: the attention matrix is materialized, no
//   flash attention) + s^2 (causal mask) + 16*s*(hd/2) (the fp32 rotary
//   cos and sin tables of q and k); mlp T*(R + d + 4ffn)*dtype; moe
//   T*(R + d + experts + 1)*dtype + T*top_k*((3d + 4ffn + 2)*dtype + 32);
//   norm T*R*dtype; lm_head T*d*dtype; loss T*vocab*4. Under checkpointing
//   attn/mlp/moe keep T*d*dtype and their backward's workspace_bytes is the
//   full amount above; otherwise workspace is 0. Backward's own temporaries
//   (e.g. the gradient of the attention matrix) are not modeled.
#ifndef TANDEM_COMMON_MODELS_GRAPH_BUILDER_H_
#define TANDEM_COMMON_MODELS_GRAPH_BUILDER_H_

#include "absl/status/statusor.h"
#include "common/ir/graph.h"
#include "common/models/model_config.h"

namespace tandem {

// Validates `config` (ValidateModelConfig) and builds its graph, which passes
// ValidateGraph. Graph.name is config.name, micro_batches is grad_accum and
// tokens_per_micro_batch is micro_batch * seq_len.
absl::StatusOr<Graph> BuildModelGraph(const ModelConfig& config);

// Totals per phase, for summaries.
struct GraphSummary {
  int64_t params = 0;
  int64_t param_bytes = 0;
  double forward_flops = 0;
  double backward_flops = 0;
  double optimizer_flops = 0;
  // Activation bytes forward nodes leave alive (all micro-batches), and the
  // largest workspace of any node.
  int64_t forward_activation_bytes = 0;
  int64_t max_workspace_bytes = 0;
  double forward_time_s = 0;
  double backward_time_s = 0;
  double optimizer_time_s = 0;
  int nodes = 0;
};
GraphSummary SummarizeGraph(const Graph& graph);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODELS_GRAPH_BUILDER_H_
