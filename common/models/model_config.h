// Configuration of the built-in model family (a Llama-style decoder and its
// Mixtral-style MoE variant), shared by the graph builder and, later, the
// worker's libtorch models, so both name and shape params identically.
#ifndef TANDEM_COMMON_MODELS_MODEL_CONFIG_H_
#define TANDEM_COMMON_MODELS_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/ir/graph.h"

namespace tandem {

enum class ModelArch { kLlama, kMoe };

struct ModelConfig {
  std::string name = "custom";
  ModelArch arch = ModelArch::kLlama;
  int32_t layers = 2;
  int32_t d_model = 64;
  int32_t heads = 4;
  // Grouped-query attention: key/value heads; divides heads.
  int32_t kv_heads = 4;
  // SwiGLU hidden size (per expert for kMoe).
  int32_t ffn = 172;
  int32_t vocab = 256;
  // kMoe only.
  int32_t experts = 0;
  int32_t top_k = 0;
  int32_t seq_len = 128;
  // Sequences per rank per micro-batch.
  int32_t micro_batch = 1;
  // Gradient-accumulation micro-batches per step.
  int32_t grad_accum = 1;
  // Params are gathered and computed in `dtype`; a non-f32 param keeps an
  // f32 master copy with its Adam moments (common/README.md, "Mixed
  // precision").
  DType dtype = DType::kF32;
  // Gradients are reduce-scattered in this dtype: f32, or `dtype` (the
  // default when unset).
  std::optional<DType> reduce_dtype;
  bool activation_checkpointing = false;
  int32_t world_size = 1;

  // Time estimates for graphs built without a profile: effective FLOP/s and
  // memory bandwidth of one device.
  double device_flops = 4.0e14;
  double device_bytes_per_s = 2.0e12;

  int32_t head_dim() const { return d_model / heads; }
};

// Named configurations: "llama3-8b", "llama3-70b", "mixtral-8x7b" (bf16,
// published shapes, seq_len 4096, micro_batch 1), "tiny-llama" (4 layers,
// d_model 256, 5.3M fp32 params) and "tiny-moe" (2 layers, d_model 128, top-2
// of 4 experts, 1.4M fp32 params), both seq_len 128, micro_batch 4. All have
// world 1 and grad_accum 1. Unknown names give NotFound.
absl::StatusOr<ModelConfig> ModelPreset(absl::string_view name);
std::vector<std::string> ModelPresetNames();

// Applies `key=value` overrides (space- or comma-separated), e.g.
// "preset=llama3-70b micro_batch=2 seq_len=1024 checkpointing=true world=32".
// Keys: preset (applied first), arch (llama|moe), layers, d_model, heads,
// kv_heads, ffn, vocab, experts, top_k, seq_len, micro_batch, grad_accum,
// dtype (f32|bf16|f16), reduce_dtype (f32|bf16|f16), checkpointing, world,
// device_flops, device_bytes_per_s, name. Each key at most once; checkpointing
// takes true|false (or 1|0, yes|no, on|off). Keys not given keep ModelConfig's
// defaults. Errors name the key and say what to write instead, e.g. "unknown
// key 'layer' (expected one of ...)". Parsing checks syntax only: run
// ValidateModelConfig on the result.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view text);
// The same, starting from `base` instead of the defaults; a preset key
// replaces `base`.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view text,
                                             const ModelConfig& base);

// Field-level checks, e.g. "heads (6) must divide d_model (64)": counts are
// >= 1, heads divide d_model, kv_heads divide heads, experts/top_k are set
// (1 <= top_k <= experts) for arch=moe and zero for arch=llama, device rates
// are finite and positive, the name is one printable token, and the derived
// sizes (bytes, graph nodes) stay far from int64 overflow, and reduce_dtype
// is f32 or dtype. Returns
// InvalidArgument naming the first offending field.
absl::Status ValidateModelConfig(const ModelConfig& config);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODELS_MODEL_CONFIG_H_
