#include "common/models/hf_names.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/models/graph_builder.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

// A layer param's name after "layers.<i>.", and its Hugging Face name after
// "model.layers.<i>.".
struct LayerName {
  const char* tandem;
  const char* hf;
};
constexpr LayerName kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn.wq.weight", "self_attn.q_proj.weight"},
    {"attn.wk.weight", "self_attn.k_proj.weight"},
    {"attn.wv.weight", "self_attn.v_proj.weight"},
    {"attn.wo.weight", "self_attn.o_proj.weight"},
    {"mlp_norm.weight", "post_attention_layernorm.weight"},
    {"mlp.w_gate.weight", "mlp.gate_proj.weight"},
    {"mlp.w_up.weight", "mlp.up_proj.weight"},
    {"mlp.w_down.weight", "mlp.down_proj.weight"},
    // Mixtral: the router, and the experts' w1 (gate), w3 (up), w2 (down).
    {"moe.router.weight", "block_sparse_moe.gate.weight"},
    {"moe.w_gate", "block_sparse_moe.experts.*.w1.weight"},
    {"moe.w_up", "block_sparse_moe.experts.*.w3.weight"},
    {"moe.w_down", "block_sparse_moe.experts.*.w2.weight"},
};

}  // namespace

absl::StatusOr<std::string> HuggingFaceName(absl::string_view param_name) {
  if (param_name == "embed.weight")
    return std::string("model.embed_tokens.weight");
  if (param_name == "norm.weight") return std::string("model.norm.weight");
  if (param_name == "lm_head.weight") return std::string("lm_head.weight");
  if (absl::ConsumePrefix(&param_name, "layers.")) {
    const size_t dot = param_name.find('.');
    uint32_t layer = 0;
    if (dot != absl::string_view::npos &&
        absl::SimpleAtoi(param_name.substr(0, dot), &layer) &&
        absl::ascii_isdigit(param_name[0])) {
      const absl::string_view rest = param_name.substr(dot + 1);
      for (const LayerName& n : kLayerNames) {
        if (rest == n.tandem) {
          return absl::StrCat("model.layers.", layer, ".", n.hf);
        }
      }
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", param_name, "' is no param of a built-in model"));
}

absl::StatusOr<std::vector<WeightTensor>> BuiltinWeightTensors(
    const ModelConfig& config) {
  ASSIGN_OR_RETURN(const Graph graph, BuildModelGraph(config));
  std::vector<WeightTensor> out;
  out.reserve(graph.params.size());
  for (const Param& p : graph.params) {
    ASSIGN_OR_RETURN(std::string hf, HuggingFaceName(p.name));
    out.push_back({p.name, p.shape, std::move(hf)});
  }
  return out;
}

}  // namespace tandem
