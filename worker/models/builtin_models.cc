#include "worker/models/builtin_models.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/models/hf_names.h"
#include "common/random_bits.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

constexpr double kNormEps = 1e-5;
constexpr double kInitStd = 0.02;
constexpr double kRopeBase = 10000.0;

// The next value of the SplitMix64 stream at `state`, advancing it.
uint64_t NextBits(uint64_t& state) {
  const uint64_t out = SplitMix64(state);
  state += kGoldenGamma;
  return out;
}

// Normal(0, std) values from a counter-based stream keyed by the seed and the
// param name: independent of thread count, world size and param order.
std::function<void(float*, int64_t)> NormalInit(uint64_t seed,
                                                const std::string& name,
                                                double std) {
  const uint64_t key = seed ^ Fnv1a64(name);
  return [key, std](float* data, int64_t numel) {
    uint64_t state = key;
    constexpr double kTwoPi = 6.283185307179586;
    for (int64_t i = 0; i < numel; i += 2) {
      // Box-Muller on two uniforms in (0, 1].
      const double u1 =
          (static_cast<double>(NextBits(state) >> 11) + 1.0) * 0x1.0p-53;
      const double u2 = static_cast<double>(NextBits(state) >> 11) * 0x1.0p-53;
      const double r = std::sqrt(-2.0 * std::log(u1));
      data[i] = static_cast<float>(std * r * std::cos(kTwoPi * u2));
      if (i + 1 < numel) {
        data[i + 1] = static_cast<float>(std * r * std::sin(kTwoPi * u2));
      }
    }
  };
}

std::function<void(float*, int64_t)> OnesInit() {
  return [](float* data, int64_t numel) {
    for (int64_t i = 0; i < numel; ++i) data[i] = 1.0f;
  };
}

// Mixed precision follows Hugging Face's Llama and Mixtral: activations and
// params in the program's dtype, with RMSNorm's statistics, the attention
// softmax, the router's probabilities and the loss computed in f32. At f32
// every cast below is a no-op.

// In f32, then cast back before the weight (as LlamaRMSNorm).
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight) {
  const at::Tensor xf = x.to(at::kFloat);
  return (xf * at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + kNormEps))
             .to(x.scalar_type()) *
         weight;
}

// Rotary embedding over [b, heads, s, hd] with the halves convention.
at::Tensor Rope(const at::Tensor& x) {
  const int64_t s = x.size(2);
  const int64_t half = x.size(3) / 2;
  // On x's device: a CPU table would not mix with CUDA activations.
  const at::TensorOptions f32 = x.options().dtype(at::kFloat);
  at::Tensor inv_freq =
      at::pow(kRopeBase, at::arange(0, half, f32) * (-2.0 / (2 * half)));
  at::Tensor angles = at::outer(at::arange(0, s, f32), inv_freq);  // [s, half]
  at::Tensor cos = angles.cos().to(x.scalar_type());
  at::Tensor sin = angles.sin().to(x.scalar_type());
  at::Tensor x1 = x.narrow(-1, 0, half);
  at::Tensor x2 = x.narrow(-1, half, half);
  return at::cat({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1);
}

struct Dims {
  int64_t heads;
  int64_t kv_heads;
  int64_t head_dim;
  int64_t top_k;
};

// params: attn_norm, wq, wk, wv, wo.
at::Tensor Attention(const at::Tensor& x, absl::Span<const at::Tensor> p,
                     const Dims& dims) {
  const int64_t b = x.size(0);
  const int64_t s = x.size(1);
  const at::Tensor h = RmsNorm(x, p[0]);
  at::Tensor q = at::linear(h, p[1])
                     .view({b, s, dims.heads, dims.head_dim})
                     .transpose(1, 2);
  at::Tensor k = at::linear(h, p[2])
                     .view({b, s, dims.kv_heads, dims.head_dim})
                     .transpose(1, 2);
  at::Tensor v = at::linear(h, p[3])
                     .view({b, s, dims.kv_heads, dims.head_dim})
                     .transpose(1, 2);
  q = Rope(q);
  k = Rope(k);
  if (dims.kv_heads != dims.heads) {
    const int64_t repeat = dims.heads / dims.kv_heads;
    k = k.repeat_interleave(repeat, 1);
    v = v.repeat_interleave(repeat, 1);
  }
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) /
                      std::sqrt(static_cast<double>(dims.head_dim));
  const at::Tensor future =
      at::ones({s, s}, scores.options().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  const at::Tensor probs =
      at::softmax(scores, -1, at::kFloat).to(v.scalar_type());
  const at::Tensor out = at::matmul(probs, v).transpose(1, 2).reshape(
      {b, s, dims.heads * dims.head_dim});
  return x + at::linear(out, p[4]);
}

at::Tensor SwiGlu(const at::Tensor& x, const at::Tensor& w_gate,
                  const at::Tensor& w_up, const at::Tensor& w_down) {
  return at::linear(at::silu(at::linear(x, w_gate)) * at::linear(x, w_up),
                    w_down);
}

// params: mlp_norm, w_gate, w_up, w_down.
at::Tensor Mlp(const at::Tensor& x, absl::Span<const at::Tensor> p) {
  return x + SwiGlu(RmsNorm(x, p[0]), p[1], p[2], p[3]);
}

// params: mlp_norm, router, w_gate, w_up, w_down ([experts, ...]). Each token
// goes to its top_k experts, weighted by their renormalized router
// probabilities.
at::Tensor Moe(const at::Tensor& x, absl::Span<const at::Tensor> p,
               const Dims& dims) {
  const int64_t d = x.size(-1);
  const at::Tensor h = RmsNorm(x, p[0]).reshape({-1, d});
  const at::Tensor probs = at::softmax(at::linear(h, p[1]), -1, at::kFloat);
  auto [top_p, top_i] = at::topk(probs, dims.top_k, -1);
  const at::Tensor weights =
      (top_p / top_p.sum({-1}, true)).reshape({-1}).to(h.scalar_type());
  at::Tensor out = at::zeros_like(h);
  const int64_t experts = p[1].size(0);
  for (int64_t e = 0; e < experts; ++e) {
    const at::Tensor hits = at::nonzero(top_i == e);  // [n, 2]: token, slot
    if (hits.size(0) == 0) continue;
    const at::Tensor tokens = hits.select(1, 0);
    const at::Tensor slots = hits.select(1, 1);
    const at::Tensor w = weights.index_select(0, tokens * dims.top_k + slots);
    const at::Tensor y = SwiGlu(h.index_select(0, tokens), p[2].select(0, e),
                                p[3].select(0, e), p[4].select(0, e));
    out = out.index_add(0, tokens, y * w.unsqueeze(1));
  }
  return x + out.view(x.sizes());
}

}  // namespace

absl::StatusOr<Program> BuildModelProgram(const ModelConfig& c, uint64_t seed) {
  RETURN_IF_ERROR(ValidateModelConfig(c));
  if (c.head_dim() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "d_model / heads (", c.head_dim(),
        ") must be even for rotary embeddings; change d_model or heads"));
  }
  const Dims dims{c.heads, c.kv_heads, c.head_dim(), c.top_k};
  const int64_t d = c.d_model;
  const int64_t q_dim = int64_t{c.heads} * c.head_dim();
  const int64_t kv_dim = int64_t{c.kv_heads} * c.head_dim();
  const int64_t ffn = c.ffn;
  const int64_t vocab = c.vocab;
  const int64_t experts = c.experts;
  const double out_std = kInitStd / std::sqrt(2.0 * c.layers);

  Program program;
  program.name = c.name;
  program.dtype = c.dtype;
  program.reduce_dtype = c.reduce_dtype.value_or(c.dtype);
  auto add = [&](std::string name, std::vector<int64_t> shape, std::string unit,
                 bool norm, double std = kInitStd) {
    ProgramParam p;
    p.init = norm ? OnesInit() : NormalInit(seed, name, std);
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.unit = std::move(unit);
    program.params.push_back(std::move(p));
    return static_cast<int32_t>(program.params.size() - 1);
  };

  program.inputs = {{"tokens", "tokens"}, {"targets", "targets"}};
  program.loss = "loss";
  // Each node reads the previous node's output, named after that node (the
  // loss also reads the targets).
  auto add_node = [&](std::string name, std::vector<int32_t> param_ids,
                      std::function<at::Tensor(const at::Tensor&,
                                               absl::Span<const at::Tensor>)>
                          forward) {
    ProgramNode node;
    node.inputs = {program.nodes.empty() ? std::string("tokens")
                                         : program.nodes.back().outputs[0]};
    node.outputs = {name};
    node.name = std::move(name);
    node.param_ids = std::move(param_ids);
    node.forward = [forward = std::move(forward)](
                       absl::Span<const at::Tensor> in,
                       absl::Span<const at::Tensor> p) {
      return std::vector<at::Tensor>{forward(in[0], p)};
    };
    program.nodes.push_back(std::move(node));
  };

  add_node("embed", {add("embed.weight", {vocab, d}, "embed", false)},
           [](const at::Tensor& tokens, absl::Span<const at::Tensor> p) {
             return at::embedding(p[0], tokens);
           });
  for (int32_t i = 0; i < c.layers; ++i) {
    const std::string unit = absl::StrCat("layers.", i);
    const std::string attn = unit + ".attn";
    add_node(attn,
             {
                 add(unit + ".attn_norm.weight", {d}, unit, true),
                 add(attn + ".wq.weight", {q_dim, d}, unit, false),
                 add(attn + ".wk.weight", {kv_dim, d}, unit, false),
                 add(attn + ".wv.weight", {kv_dim, d}, unit, false),
                 add(attn + ".wo.weight", {d, q_dim}, unit, false, out_std),
             },
             [dims](const at::Tensor& x, absl::Span<const at::Tensor> p) {
               return Attention(x, p, dims);
             });
    // Activation checkpointing recomputes the attn and mlp/moe blocks, as
    // the graph builder marks them (Node::recompute).
    program.nodes.back().recompute = c.activation_checkpointing;

    const int32_t mlp_norm = add(unit + ".mlp_norm.weight", {d}, unit, true);
    if (c.arch == ModelArch::kLlama) {
      const std::string mlp = unit + ".mlp";
      add_node(mlp,
               {mlp_norm, add(mlp + ".w_gate.weight", {ffn, d}, unit, false),
                add(mlp + ".w_up.weight", {ffn, d}, unit, false),
                add(mlp + ".w_down.weight", {d, ffn}, unit, false, out_std)},
               [](const at::Tensor& x, absl::Span<const at::Tensor> p) {
                 return Mlp(x, p);
               });
    } else {
      const std::string moe = unit + ".moe";
      add_node(
          moe,
          {mlp_norm, add(moe + ".router.weight", {experts, d}, unit, false),
           add(moe + ".w_gate", {experts, ffn, d}, unit, false),
           add(moe + ".w_up", {experts, ffn, d}, unit, false),
           add(moe + ".w_down", {experts, d, ffn}, unit, false, out_std)},
          [dims](const at::Tensor& x, absl::Span<const at::Tensor> p) {
            return Moe(x, p, dims);
          });
    }
    program.nodes.back().recompute = c.activation_checkpointing;
  }
  add_node("norm", {add("norm.weight", {d}, "head", true)},
           [](const at::Tensor& x, absl::Span<const at::Tensor> p) {
             return RmsNorm(x, p[0]);
           });
  add_node("lm_head", {add("lm_head.weight", {vocab, d}, "head", false)},
           [](const at::Tensor& x, absl::Span<const at::Tensor> p) {
             return at::linear(x, p[0]);
           });
  ProgramNode loss;
  loss.name = "loss";
  loss.inputs = {"lm_head", "targets"};
  loss.outputs = {"loss"};
  loss.forward = [vocab](absl::Span<const at::Tensor> in,
                         absl::Span<const at::Tensor>) {
    return std::vector<at::Tensor>{at::cross_entropy_loss(
        in[0].reshape({-1, vocab}).to(at::kFloat), in[1].reshape({-1}))};
  };
  program.nodes.push_back(std::move(loss));
  for (ProgramParam& p : program.params) {
    ASSIGN_OR_RETURN(p.export_name, HuggingFaceName(p.name));
  }
  return program;
}

}  // namespace tandem
