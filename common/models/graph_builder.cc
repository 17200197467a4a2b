#include "common/models/graph_builder.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/ir/graph.h"
#include "common/models/model_config.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

// Elementwise FLOPs per element: RMSNorm (square, sum, scale, weight), the
// residual add, SwiGLU's silu and product, and AdamW's update of one element.
constexpr double kNormFlops = 4;
constexpr double kResidualFlops = 1;
constexpr double kSwiGluFlops = 4;
constexpr double kLossFlopsPerLogit = 4;
constexpr double kOptimizerFlops = 10;

enum class BlockKind { kEmbed, kAttn, kMlp, kMoe, kNorm, kLmHead, kLoss };

// One forward node of a micro-batch, before ids are assigned.
struct Block {
  std::string name;
  BlockKind kind;
  std::vector<int32_t> param_ids;
};

// Analytic cost of one forward block.
struct BlockCost {
  double flops = 0;
  // Memory traffic: params read once; inputs, outputs and saved activations
  // touched once.
  double bytes = 0;
  // Activations saved for backward without checkpointing.
  int64_t saved_bytes = 0;
  // attn/mlp/moe: recomputed in backward under activation checkpointing.
  bool checkpointable = false;
  // Temporaries of the backward node alone.
  int64_t backward_workspace_bytes = 0;
};

class ModelGraphBuilder {
 public:
  explicit ModelGraphBuilder(const ModelConfig& config)
      : c_(config),
        dt_(DTypeBytes(config.dtype)),
        b_(config.micro_batch),
        s_(config.seq_len),
        t_(int64_t{config.micro_batch} * config.seq_len),
        d_(config.d_model),
        hd_(config.head_dim()),
        q_dim_(int64_t{config.heads} * config.head_dim()) {}

  Graph Build() {
    graph_.name = c_.name;
    graph_.world_size = c_.world_size;
    graph_.micro_batches = c_.grad_accum;
    graph_.tokens_per_micro_batch = t_;
    // Set only when it changes what gradients are reduced in.
    if (c_.reduce_dtype.has_value() && *c_.reduce_dtype != c_.dtype) {
      graph_.reduce_dtype = c_.reduce_dtype;
    }
    std::vector<Block> blocks = AddParamsAndBlocks();
    const bool prefixed = c_.grad_accum > 1;
    for (int32_t k = 0; k < c_.grad_accum; ++k) {
      const std::string prefix = prefixed ? absl::StrCat("mb", k, ".") : "";
      std::vector<int32_t> forward_ids;
      forward_ids.reserve(blocks.size());
      for (const Block& block : blocks) {
        forward_ids.push_back(AddForward(prefix, k, block));
      }
      for (size_t i = blocks.size(); i-- > 0;) {
        AddBackward(prefix, k, blocks[i], forward_ids[i]);
      }
    }
    AddOptimizer();
    return std::move(graph_);
  }

 private:
  int32_t AddParam(std::string name, std::vector<int64_t> shape,
                   std::string unit) {
    Param p;
    p.id = static_cast<int32_t>(graph_.params.size());
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.dtype = c_.dtype;
    p.unit = std::move(unit);
    graph_.params.push_back(std::move(p));
    return graph_.params.back().id;
  }

  // Params in the header's order; returns the forward blocks of one
  // micro-batch with the params each reads.
  std::vector<Block> AddParamsAndBlocks() {
    const int64_t d = d_;
    const int64_t q_dim = int64_t{c_.heads} * hd_;
    const int64_t kv_dim = int64_t{c_.kv_heads} * hd_;
    const int64_t ffn = c_.ffn;
    const int64_t vocab = c_.vocab;
    const int64_t experts = c_.experts;

    std::vector<Block> blocks;
    blocks.push_back({"embed",
                      BlockKind::kEmbed,
                      {AddParam("embed.weight", {vocab, d}, "embed")}});
    for (int32_t i = 0; i < c_.layers; ++i) {
      const std::string unit = absl::StrCat("layers.", i);
      const std::string attn = absl::StrCat(unit, ".attn");
      Block attn_block{attn, BlockKind::kAttn, {}};
      attn_block.param_ids = {
          AddParam(absl::StrCat(unit, ".attn_norm.weight"), {d}, unit),
          AddParam(absl::StrCat(attn, ".wq.weight"), {q_dim, d}, unit),
          AddParam(absl::StrCat(attn, ".wk.weight"), {kv_dim, d}, unit),
          AddParam(absl::StrCat(attn, ".wv.weight"), {kv_dim, d}, unit),
          AddParam(absl::StrCat(attn, ".wo.weight"), {d, q_dim}, unit),
      };
      blocks.push_back(std::move(attn_block));

      const int32_t mlp_norm =
          AddParam(absl::StrCat(unit, ".mlp_norm.weight"), {d}, unit);
      if (c_.arch == ModelArch::kLlama) {
        const std::string mlp = absl::StrCat(unit, ".mlp");
        blocks.push_back(
            {mlp,
             BlockKind::kMlp,
             {mlp_norm,
              AddParam(absl::StrCat(mlp, ".w_gate.weight"), {ffn, d}, unit),
              AddParam(absl::StrCat(mlp, ".w_up.weight"), {ffn, d}, unit),
              AddParam(absl::StrCat(mlp, ".w_down.weight"), {d, ffn}, unit)}});
      } else {
        const std::string moe = absl::StrCat(unit, ".moe");
        blocks.push_back(
            {moe,
             BlockKind::kMoe,
             {mlp_norm,
              AddParam(absl::StrCat(moe, ".router.weight"), {experts, d}, unit),
              AddParam(absl::StrCat(moe, ".w_gate"), {experts, ffn, d}, unit),
              AddParam(absl::StrCat(moe, ".w_up"), {experts, ffn, d}, unit),
              AddParam(absl::StrCat(moe, ".w_down"), {experts, d, ffn},
                       unit)}});
      }
    }
    blocks.push_back(
        {"norm", BlockKind::kNorm, {AddParam("norm.weight", {d}, "head")}});
    blocks.push_back({"lm_head",
                      BlockKind::kLmHead,
                      {AddParam("lm_head.weight", {vocab, d}, "head")}});
    blocks.push_back({"loss", BlockKind::kLoss, {}});
    return blocks;
  }

  double ParamBytes(const Block& block) const {
    double bytes = 0;
    for (int32_t id : block.param_ids) {
      bytes += static_cast<double>(graph_.params[id].bytes());
    }
    return bytes;
  }

  // bytes is left 0 by blocks that read and write the residual stream (attn,
  // mlp, moe, norm) and filled in after the switch.
  BlockCost Cost(const Block& block) const {
    const double t = static_cast<double>(t_);
    const double d = d_;
    const double q_dim = static_cast<double>(c_.heads) * hd_;
    const double kv_dim = static_cast<double>(c_.kv_heads) * hd_;
    const double ffn = c_.ffn;
    const double vocab = c_.vocab;
    const double experts = c_.experts;
    const double top_k = c_.top_k;
    const double dt = dt_;
    const double residual_io = 2 * t * d * dt;
    const double elementwise = (kNormFlops + kResidualFlops) * t * d;

    BlockCost cost;
    switch (block.kind) {
      case BlockKind::kEmbed:
        cost.saved_bytes = t_ * 8;  // int64 token ids
        cost.bytes = t * 8 + residual_io;
        // Below fp32, the embedding's gradient is accumulated in an fp32
        // [vocab, d] buffer, then cast.
        if (dt_ != 4) {
          cost.backward_workspace_bytes = int64_t{c_.vocab} * d_ * 4;
        }
        break;
      case BlockKind::kAttn: {
        const double projections =
            2 * t * d * q_dim + 2 * 2 * t * d * kv_dim + 2 * t * q_dim * d;
        // QK^T and AV, 2 * b * s^2 * q_dim FLOPs each, halved by the causal
        // mask.
        const double core = 2.0 * b_ * static_cast<double>(s_) * s_ * q_dim;
        cost.flops = projections + core + elementwise;
        // What the worker's eager ops save (worker/models/builtin_models.cc,
        // as its memory profile measures them): the input and RMSNorm's
        // (below), the normed input, q after rotary, the k^T copy the batched
        // matmul makes, v and the attention output (q_dim wide each), the
        // softmax probabilities (b * heads * s^2: the attention matrix is
        // materialized, no flash attention; computed in fp32, plus their
        // cast below fp32), the causal mask (s^2 bools) and the rotary
        // tables of q and k (cos and sin, s * hd / 2 each).
        const int64_t probs = dt_ == 4 ? 4 : 4 + dt_;
        cost.saved_bytes = t_ * (RmsNormBytes() + (d_ + 4 * q_dim_) * dt_) +
                           b_ * int64_t{c_.heads} * s_ * s_ * probs + s_ * s_ +
                           4 * s_ * (hd_ / 2) * dt_;
        cost.checkpointable = true;
        break;
      }
      case BlockKind::kMlp:
        cost.flops = 2 * t * 3 * d * ffn + kSwiGluFlops * t * ffn + elementwise;
        // The input and RMSNorm's, the normed input, gate, silu(gate), up and
        // their product.
        cost.saved_bytes =
            t_ * (RmsNormBytes() + (d_ + 4 * int64_t{c_.ffn}) * dt_);
        cost.checkpointable = true;
        break;
      case BlockKind::kMoe: {
        cost.flops = 2 * t * d * experts +
                     top_k * (2 * t * 3 * d * ffn + kSwiGluFlops * t * ffn) +
                     elementwise;
        // The input and RMSNorm's, the normed input, the router
        // probabilities and the top-k weights' sum (fp32); per routed token
        // its input copy, the expert's gate, silu(gate), up, product and
        // output, the weighted output, its weight, its top-k probability
        // (fp32), and 32 bytes of int64 indices (top-k, the expert's token
        // and slot positions, the weight index).
        const int64_t per_token =
            RmsNormBytes() + d_ * dt_ + (int64_t{c_.experts} + 1) * 4;
        const int64_t per_routed = (3 * d_ + 4 * int64_t{c_.ffn} + 1) * dt_ + 4;
        cost.saved_bytes =
            t_ * per_token + t_ * int64_t{c_.top_k} * (per_routed + 32);
        cost.checkpointable = true;
        break;
      }
      case BlockKind::kNorm:
        cost.flops = kNormFlops * t * d;
        // The input and RMSNorm's; the output is lm_head's.
        cost.saved_bytes = t_ * RmsNormBytes();
        break;
      case BlockKind::kLmHead:
        cost.flops = 2 * t * d * vocab;
        cost.saved_bytes = t_ * d_ * dt_;
        cost.bytes = t * d * dt + t * vocab * dt;
        break;
      case BlockKind::kLoss:
        cost.flops = kLossFlopsPerLogit * t * vocab;
        // fp32 softmax of the logits.
        cost.saved_bytes = t_ * int64_t{c_.vocab} * 4;
        cost.bytes = t * vocab * (dt + 4);
        // Its backward holds two fp32 logit-sized tensors at once (the
        // softmax's gradient and the logits' gradient before its cast):
        // measured, the least-memory schedule of bench/e2e's tiny-llama
        // (2 ranks, 4 x 128 tokens, vocab 4096) peaked 16.78 MB above the
        // model without them, exactly these two.
        cost.backward_workspace_bytes = 2 * t_ * int64_t{c_.vocab} * 4;
        break;
    }
    if (cost.bytes == 0) {
      // Residual-stream blocks: read the input, write the output, save.
      cost.bytes = residual_io + static_cast<double>(cost.saved_bytes);
    }
    cost.bytes += ParamBytes(block);
    return cost;
  }

  // Bytes per token a block's RMSNorm keeps for backward, its input
  // included: the input and its square (the mean's input) in fp32, the fp32
  // rsqrt, and the scaled input in the model's dtype (the normed output is
  // counted by whoever reads it).
  int64_t RmsNormBytes() const { return 8 * d_ + 4 + d_ * dt_; }

  // Roofline: a node takes as long as its FLOPs or its memory traffic needs,
  // whichever is longer.
  double Time(double flops, double bytes) const {
    return std::max(flops / c_.device_flops, bytes / c_.device_bytes_per_s);
  }

  Node& NewNode(std::string name, Phase phase, int32_t micro_batch) {
    Node n;
    n.id = static_cast<int32_t>(graph_.nodes.size());
    n.name = std::move(name);
    n.phase = phase;
    n.micro_batch = micro_batch;
    graph_.nodes.push_back(std::move(n));
    return graph_.nodes.back();
  }

  bool Recomputes(const BlockCost& cost) const {
    return c_.activation_checkpointing && cost.checkpointable;
  }

  int32_t AddForward(const std::string& prefix, int32_t micro_batch,
                     const Block& block) {
    const BlockCost cost = Cost(block);
    Node& n = NewNode(prefix + block.name, Phase::kForward, micro_batch);
    n.param_ids = block.param_ids;
    n.flops = cost.flops;
    n.time_s = Time(cost.flops, cost.bytes);
    // Under checkpointing the block keeps only its input.
    n.activation_bytes = Recomputes(cost) ? t_ * d_ * dt_ : cost.saved_bytes;
    return n.id;
  }

  void AddBackward(const std::string& prefix, int32_t micro_batch,
                   const Block& block, int32_t forward_id) {
    const BlockCost cost = Cost(block);
    const bool recompute = Recomputes(cost);
    Node& n = NewNode(absl::StrCat(prefix, block.name, ".bwd"),
                      Phase::kBackward, micro_batch);
    n.forward_id = forward_id;
    n.recompute = recompute;
    n.param_ids = block.param_ids;
    // Gradients of inputs and of weights: twice the forward; a recomputing
    // node runs the forward once more first.
    const double passes = recompute ? 3 : 2;
    n.flops = passes * cost.flops;
    n.time_s = Time(n.flops, passes * cost.bytes);
    // The recomputed activations live only while this node runs.
    n.workspace_bytes =
        (recompute ? cost.saved_bytes : 0) + cost.backward_workspace_bytes;
  }

  // AdamW steps this rank's shards: reads and writes the param, gradient (in
  // the reduce dtype), fp32 master copy (for non-fp32 params) and two fp32
  // moments.
  void AddOptimizer() {
    double shard_elements = 0;
    for (const Param& p : graph_.params) {
      shard_elements += static_cast<double>(p.shard_numel(c_.world_size));
    }
    const double master = c_.dtype == DType::kF32 ? 0 : 4;
    const double grad = DTypeBytes(c_.reduce_dtype.value_or(c_.dtype));
    const double bytes_per_element = 2 * (dt_ + grad + master + 2 * 4);
    Node& n = NewNode("optimizer", Phase::kOptimizer, 0);
    n.flops = kOptimizerFlops * shard_elements;
    n.time_s = Time(n.flops, bytes_per_element * shard_elements);
  }

  const ModelConfig& c_;
  const int64_t dt_;
  const int64_t b_;
  const int64_t s_;
  // Tokens of one micro-batch on one rank.
  const int64_t t_;
  const int64_t d_;
  const int64_t hd_;
  const int64_t q_dim_;
  Graph graph_;
};

}  // namespace

absl::StatusOr<Graph> BuildModelGraph(const ModelConfig& config) {
  RETURN_IF_ERROR(ValidateModelConfig(config));
  return ModelGraphBuilder(config).Build();
}

GraphSummary SummarizeGraph(const Graph& graph) {
  GraphSummary s;
  for (const Param& p : graph.params) {
    s.params += p.numel();
    s.param_bytes += p.bytes();
  }
  s.nodes = static_cast<int>(graph.nodes.size());
  for (const Node& n : graph.nodes) {
    s.max_workspace_bytes = std::max(s.max_workspace_bytes, n.workspace_bytes);
    switch (n.phase) {
      case Phase::kForward:
        s.forward_flops += n.flops;
        s.forward_time_s += n.time_s;
        s.forward_activation_bytes += n.activation_bytes;
        break;
      case Phase::kBackward:
        s.backward_flops += n.flops;
        s.backward_time_s += n.time_s;
        break;
      case Phase::kOptimizer:
        s.optimizer_flops += n.flops;
        s.optimizer_time_s += n.time_s;
        break;
    }
  }
  return s;
}

}  // namespace tandem
