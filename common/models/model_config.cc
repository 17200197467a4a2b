#include "common/models/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/did_you_mean.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

// Bounds that keep every count the graph builder derives (param numel, byte
// counts, FLOPs) well inside int64 and the graph itself a size a planner can
// handle.
constexpr double kMaxBytes = 1e18;
constexpr int64_t kMaxGraphNodes = 1'000'000;
constexpr int64_t kMinInt32 = std::numeric_limits<int32_t>::min();

ModelConfig Llama3_8B() {
  ModelConfig c;
  c.name = "llama3-8b";
  c.arch = ModelArch::kLlama;
  c.layers = 32;
  c.d_model = 4096;
  c.heads = 32;
  c.kv_heads = 8;
  c.ffn = 14336;
  c.vocab = 128256;
  c.seq_len = 4096;
  c.micro_batch = 1;
  c.dtype = DType::kBF16;
  return c;
}

ModelConfig Llama3_70B() {
  ModelConfig c = Llama3_8B();
  c.name = "llama3-70b";
  c.layers = 80;
  c.d_model = 8192;
  c.heads = 64;
  c.kv_heads = 8;
  c.ffn = 28672;
  return c;
}

ModelConfig Mixtral8x7B() {
  ModelConfig c;
  c.name = "mixtral-8x7b";
  c.arch = ModelArch::kMoe;
  c.layers = 32;
  c.d_model = 4096;
  c.heads = 32;
  c.kv_heads = 8;
  c.ffn = 14336;
  c.vocab = 32000;
  c.experts = 8;
  c.top_k = 2;
  c.seq_len = 4096;
  c.micro_batch = 1;
  c.dtype = DType::kBF16;
  return c;
}

// 5,310,720 fp32 params (21.2 MB): small enough to train on CPU in tests.
// ffn 704 is Llama's rule, 8/3 * d_model rounded up to a multiple of 64.
ModelConfig TinyLlama() {
  ModelConfig c;
  c.name = "tiny-llama";
  c.arch = ModelArch::kLlama;
  c.layers = 4;
  c.d_model = 256;
  c.heads = 8;
  c.kv_heads = 8;
  c.ffn = 704;
  c.vocab = 4096;
  c.seq_len = 128;
  c.micro_batch = 4;
  c.dtype = DType::kF32;
  return c;
}

// 1,410,688 fp32 params; grouped-query attention and top-2 of 4 experts.
ModelConfig TinyMoe() {
  ModelConfig c;
  c.name = "tiny-moe";
  c.arch = ModelArch::kMoe;
  c.layers = 2;
  c.d_model = 128;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 256;
  c.vocab = 2048;
  c.experts = 4;
  c.top_k = 2;
  c.seq_len = 128;
  c.micro_batch = 4;
  c.dtype = DType::kF32;
  return c;
}

struct PresetEntry {
  absl::string_view name;
  ModelConfig (*make)();
};

constexpr PresetEntry kPresets[] = {
    {"llama3-8b", &Llama3_8B},      {"llama3-70b", &Llama3_70B},
    {"mixtral-8x7b", &Mixtral8x7B}, {"tiny-llama", &TinyLlama},
    {"tiny-moe", &TinyMoe},
};

constexpr absl::string_view kKeys[] = {
    "preset",     "arch",         "layers",
    "d_model",    "heads",        "kv_heads",
    "ffn",        "vocab",        "experts",
    "top_k",      "seq_len",      "micro_batch",
    "grad_accum", "dtype",        "checkpointing",
    "world",      "device_flops", "device_bytes_per_s",
    "name",       "reduce_dtype",
};

absl::Status UnknownKey(absl::string_view key) {
  const std::string nearest = NearestOption(key, kKeys);
  const std::string hint =
      nearest.empty() ? "" : absl::StrCat(" Did you mean '", nearest, "'?");
  return absl::InvalidArgumentError(
      absl::StrCat("unknown key '", key, "' (expected one of ",
                   absl::StrJoin(kKeys, ", "), ").", hint));
}

absl::Status ParseInt32(absl::string_view key, absl::string_view value,
                        int32_t* out) {
  if (absl::SimpleAtoi(value, out)) return absl::OkStatus();
  absl::string_view digits = value;
  if (!digits.empty() && (digits[0] == '-' || digits[0] == '+')) {
    digits.remove_prefix(1);
  }
  if (!digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) {
        return absl::ascii_isdigit(static_cast<unsigned char>(c));
      })) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": '", value, "' is out of range (", kMinInt32,
                     " to ", std::numeric_limits<int32_t>::max(), ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(key, ": '", value, "' is not an integer"));
}

absl::Status ParseDouble(absl::string_view key, absl::string_view value,
                         double* out) {
  if (!absl::SimpleAtod(value, out) || !std::isfinite(*out)) {
    return absl::InvalidArgumentError(absl::StrCat(
        key, ": '", value, "' is not a finite number (e.g. 3.5e14)"));
  }
  return absl::OkStatus();
}

absl::Status ParseBool(absl::string_view key, absl::string_view value,
                       bool* out) {
  const std::string v = absl::AsciiStrToLower(value);
  if (v == "true" || v == "1" || v == "yes" || v == "on") {
    *out = true;
  } else if (v == "false" || v == "0" || v == "no" || v == "off") {
    *out = false;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        key, ": '", value, "' is not a boolean (use true or false)"));
  }
  return absl::OkStatus();
}

absl::Status ApplyKey(absl::string_view key, absl::string_view value,
                      ModelConfig* c) {
  if (key == "arch") {
    if (value == "llama") {
      c->arch = ModelArch::kLlama;
    } else if (value == "moe") {
      c->arch = ModelArch::kMoe;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "arch: unknown architecture '", value, "' (expected llama or moe)"));
    }
    return absl::OkStatus();
  }
  if (key == "dtype" || key == "reduce_dtype") {
    std::optional<DType> d = ParseDType(value);
    if (!d.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          key, ": unknown dtype '", value, "' (expected f32, bf16 or f16)"));
    }
    if (key == "dtype") {
      c->dtype = *d;
    } else {
      c->reduce_dtype = *d;
    }
    return absl::OkStatus();
  }
  if (key == "name") {
    c->name = std::string(value);
    return absl::OkStatus();
  }
  if (key == "checkpointing") {
    return ParseBool(key, value, &c->activation_checkpointing);
  }
  if (key == "device_flops") return ParseDouble(key, value, &c->device_flops);
  if (key == "device_bytes_per_s") {
    return ParseDouble(key, value, &c->device_bytes_per_s);
  }
  const std::pair<absl::string_view, int32_t ModelConfig::*> int_fields[] = {
      {"layers", &ModelConfig::layers},
      {"d_model", &ModelConfig::d_model},
      {"heads", &ModelConfig::heads},
      {"kv_heads", &ModelConfig::kv_heads},
      {"ffn", &ModelConfig::ffn},
      {"vocab", &ModelConfig::vocab},
      {"experts", &ModelConfig::experts},
      {"top_k", &ModelConfig::top_k},
      {"seq_len", &ModelConfig::seq_len},
      {"micro_batch", &ModelConfig::micro_batch},
      {"grad_accum", &ModelConfig::grad_accum},
      {"world", &ModelConfig::world_size},
  };
  for (const auto& [name, field] : int_fields) {
    if (key == name) return ParseInt32(key, value, &(c->*field));
  }
  return UnknownKey(key);
}

absl::Status AtLeast(absl::string_view field, int64_t value, int64_t min) {
  if (value < min) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be >= ", min, ", got ", value));
  }
  return absl::OkStatus();
}

absl::Status PositiveFinite(absl::string_view field, double value) {
  if (!std::isfinite(value) || value <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be a finite number > 0, got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelPreset(absl::string_view name) {
  for (const PresetEntry& p : kPresets) {
    if (p.name == name) return p.make();
  }
  return absl::NotFoundError(
      absl::StrCat("unknown model preset '", name, "' (expected one of ",
                   absl::StrJoin(ModelPresetNames(), ", "), ")"));
}

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const PresetEntry& p : kPresets) names.emplace_back(p.name);
  return names;
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view text) {
  return ParseModelConfig(text, ModelConfig());
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view text,
                                             const ModelConfig& base) {
  std::vector<std::pair<absl::string_view, absl::string_view>> pairs;
  absl::flat_hash_set<absl::string_view> seen;
  for (absl::string_view token :
       absl::StrSplit(text, absl::ByAnyChar(" ,\t\n\r"), absl::SkipEmpty())) {
    const size_t eq = token.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected key=value, got '", token, "' (e.g. layers=4)"));
    }
    absl::string_view key = token.substr(0, eq);
    absl::string_view value = token.substr(eq + 1);
    if (value.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": empty value (write ", key, "=<value>)"));
    }
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", key, "' is given twice; keep one"));
    }
    pairs.emplace_back(key, value);
  }

  ModelConfig config = base;
  for (const auto& [key, value] : pairs) {
    if (key != "preset") continue;
    absl::StatusOr<ModelConfig> preset = ModelPreset(value);
    if (!preset.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("preset: ", preset.status().message()));
    }
    config = *std::move(preset);
  }
  for (const auto& [key, value] : pairs) {
    if (key == "preset") continue;
    RETURN_IF_ERROR(ApplyKey(key, value, &config));
  }
  return config;
}

absl::Status ValidateModelConfig(const ModelConfig& c) {
  if (c.name.empty()) {
    return absl::InvalidArgumentError("name must not be empty");
  }
  for (char ch : c.name) {
    if (!absl::ascii_isgraph(static_cast<unsigned char>(ch)) || ch == ',' ||
        ch == '#' || ch == '=') {
      return absl::InvalidArgumentError(absl::StrCat(
          "name '", c.name,
          "' may not contain spaces, control characters, ',', '#' or '='"));
    }
  }
  RETURN_IF_ERROR(AtLeast("layers", c.layers, 1));
  RETURN_IF_ERROR(AtLeast("d_model", c.d_model, 1));
  RETURN_IF_ERROR(AtLeast("heads", c.heads, 1));
  RETURN_IF_ERROR(AtLeast("kv_heads", c.kv_heads, 1));
  RETURN_IF_ERROR(AtLeast("ffn", c.ffn, 1));
  RETURN_IF_ERROR(AtLeast("vocab", c.vocab, 1));
  RETURN_IF_ERROR(AtLeast("seq_len", c.seq_len, 1));
  RETURN_IF_ERROR(AtLeast("micro_batch", c.micro_batch, 1));
  RETURN_IF_ERROR(AtLeast("grad_accum", c.grad_accum, 1));
  RETURN_IF_ERROR(AtLeast("world", c.world_size, 1));
  if (c.reduce_dtype.has_value() && *c.reduce_dtype != DType::kF32 &&
      *c.reduce_dtype != c.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce_dtype (", DTypeName(*c.reduce_dtype),
        ") must be f32 or dtype (", DTypeName(c.dtype),
        "): reducing in another dtype would round the ", "gradients"));
  }
  if (c.d_model % c.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heads (", c.heads, ") must divide d_model (", c.d_model, ")"));
  }
  if (c.heads % c.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_heads (", c.kv_heads, ") must divide heads (", c.heads, ")"));
  }
  switch (c.arch) {
    case ModelArch::kLlama:
      if (c.experts != 0 || c.top_k != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "experts (", c.experts, ") and top_k (", c.top_k,
            ") apply only to arch=moe; set arch=moe or experts=0 top_k=0"));
      }
      break;
    case ModelArch::kMoe:
      RETURN_IF_ERROR(AtLeast("experts (arch=moe)", c.experts, 1));
      if (c.top_k < 1 || c.top_k > c.experts) {
        return absl::InvalidArgumentError(absl::StrCat(
            "top_k (", c.top_k, ") must be in [1, experts=", c.experts, "]"));
      }
      break;
  }
  RETURN_IF_ERROR(PositiveFinite("device_flops", c.device_flops));
  RETURN_IF_ERROR(PositiveFinite("device_bytes_per_s", c.device_bytes_per_s));

  // Sizes, in doubles so the check itself cannot overflow.
  const double d = c.d_model;
  const double experts = c.arch == ModelArch::kMoe ? c.experts : 1;
  const double embed_numel = static_cast<double>(c.vocab) * d;
  const double ffn_numel = experts * c.ffn * d;
  constexpr double kMaxNumel = static_cast<double>(Param::kMaxNumel);
  if (embed_numel > kMaxNumel || ffn_numel > kMaxNumel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model too large: a param would have ",
        std::max(embed_numel, ffn_numel), " elements (limit ", Param::kMaxNumel,
        "); reduce d_model, vocab, ffn or experts"));
  }
  const double layer_params =
      2 * d * d + 2 * d * (static_cast<double>(c.kv_heads) * c.head_dim()) +
      experts * 3 * d * c.ffn + experts * d + 2 * d;
  const double param_bytes =
      (c.layers * layer_params + 2 * static_cast<double>(c.vocab) * d + d) *
      DTypeBytes(c.dtype);
  if (param_bytes > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model too large: ", param_bytes,
        " parameter bytes (limit 1e18); reduce layers, d_model, ffn, vocab "
        "or experts"));
  }
  const double tokens = static_cast<double>(c.micro_batch) * c.seq_len;
  const double widest = std::max(
      {d, static_cast<double>(c.ffn) * experts, static_cast<double>(c.vocab)});
  const double activation_bytes =
      tokens * widest * 16 * c.layers * c.grad_accum;
  if (activation_bytes > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch too large: about ", activation_bytes,
        " activation bytes (limit 1e18); reduce micro_batch, seq_len or "
        "grad_accum"));
  }
  const int64_t nodes =
      static_cast<int64_t>(c.grad_accum) * 2 * (2 * int64_t{c.layers} + 4) + 1;
  if (nodes > kMaxGraphNodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("graph too large: layers (", c.layers,
                     ") and grad_accum (", c.grad_accum, ") give ", nodes,
                     " nodes (limit ", kMaxGraphNodes, "); reduce them"));
  }
  return absl::OkStatus();
}

}  // namespace tandem
