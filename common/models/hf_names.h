// The names the built-in models' params take in safetensors weight files
// (`model.init_from`, `tandem export-weights`): Hugging Face Llama's for
// preset llama, Mixtral's for moe, so a file loads into transformers'
// LlamaForCausalLM / MixtralForCausalLM of the same config and back. The
// layouts already agree: linear weights are [out, in], rotary embeddings use
// the halves (rotate_half) convention, grouped-query heads share key/value
// heads as repeat_kv does (common/README.md, "Weight files"). No libtorch.
#ifndef TANDEM_COMMON_MODELS_HF_NAMES_H_
#define TANDEM_COMMON_MODELS_HF_NAMES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/archive/weights_file.h"
#include "common/models/model_config.h"

namespace tandem {

// The Hugging Face name of the built-in param `param_name`, e.g.
// "layers.3.attn.wq.weight" -> "model.layers.3.self_attn.q_proj.weight".
// A MoE expert stack ("layers.3.moe.w_gate", [experts, ffn, d]) is one
// tensor per expert in Mixtral: its name holds kStackedIndex where the
// expert's index goes ("model.layers.3.block_sparse_moe.experts.*.w1.weight").
// Errors: InvalidArgument for a name no built-in model has.
absl::StatusOr<std::string> HuggingFaceName(absl::string_view param_name);

// Every param of the built-in model `config`, in order, with its Hugging
// Face name.
absl::StatusOr<std::vector<WeightTensor>> BuiltinWeightTensors(
    const ModelConfig& config);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODELS_HF_NAMES_H_
