#include "common/ir/graph.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem {

int64_t OptimizerStateBytesPerElement(DType param_dtype) {
  return param_dtype == DType::kF32 ? 8 : 12;
}

int DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
  }
  return 4;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
  }
  return "?";
}

std::optional<DType> ParseDType(absl::string_view name) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    if (DTypeName(d) == name) return d;
  }
  return std::nullopt;
}

absl::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return "fwd";
    case Phase::kBackward:
      return "bwd";
    case Phase::kOptimizer:
      return "opt";
  }
  return "?";
}

std::optional<Phase> ParsePhase(absl::string_view name) {
  for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kOptimizer}) {
    if (PhaseName(p) == name) return p;
  }
  return std::nullopt;
}

int64_t Param::numel() const {
  // Saturates instead of overflowing, so a malformed shape stays detectable
  // (validation rejects numel above Param::kMaxNumel).
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return INT64_MAX;
  }
  return n;
}

int64_t Param::shard_numel(int world_size) const {
  const int64_t w = std::max(world_size, 1);
  return (numel() + w - 1) / w;
}

bool Param::operator==(const Param& other) const {
  return id == other.id && name == other.name && shape == other.shape &&
         dtype == other.dtype && unit == other.unit &&
         trainable == other.trainable;
}

bool Node::operator==(const Node& other) const {
  return id == other.id && name == other.name && phase == other.phase &&
         micro_batch == other.micro_batch && forward_id == other.forward_id &&
         recompute == other.recompute && param_ids == other.param_ids &&
         flops == other.flops && time_s == other.time_s &&
         activation_bytes == other.activation_bytes &&
         workspace_bytes == other.workspace_bytes &&
         measured_extra_bytes == other.measured_extra_bytes &&
         measured_carry_bytes == other.measured_carry_bytes;
}

const Param* Graph::FindParam(int32_t id) const {
  for (const Param& p : params) {
    if (p.id == id) return &p;
  }
  return nullptr;
}

const Node* Graph::FindNode(int32_t id) const {
  for (const Node& n : nodes) {
    if (n.id == id) return &n;
  }
  return nullptr;
}

int64_t Graph::TotalParamNumel() const {
  int64_t total = 0;
  for (const Param& p : params) total += p.numel();
  return total;
}

int64_t Graph::GradShardBytes(const Param& param) const {
  return param.shard_numel(std::max(world_size, 1)) *
         DTypeBytes(GradReduceDType(param));
}

int64_t Graph::ReduceScatterBytes(const Param& param) const {
  return GradShardBytes(param) * std::max(world_size, 1);
}

namespace {

// FNV-1a, 64 bit: stable across platforms and releases, unlike std::hash.
class Fnv1a64 {
 public:
  void Bytes(const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) {
      state_ ^= p[i];
      state_ *= 1099511628211ull;
    }
  }
  // Length-prefixed so that ("ab","c") and ("a","bc") differ.
  void String(absl::string_view s) {
    Int(static_cast<int64_t>(s.size()));
    Bytes(s.data(), s.size());
  }
  void Int(int64_t v) {
    unsigned char le[8];
    for (int i = 0; i < 8; ++i)
      le[i] = static_cast<unsigned char>(v >> (8 * i));
    Bytes(le, sizeof(le));
  }
  uint64_t value() const { return state_; }

 private:
  uint64_t state_ = 14695981039346656037ull;
};

}  // namespace

std::string Graph::StructuralHash() const {
  Fnv1a64 h;
  h.String("tandem.graph.v1");
  h.Int(micro_batches);
  h.Int(static_cast<int64_t>(params.size()));
  for (const Param& p : params) {
    h.Int(p.id);
    h.String(p.name);
    h.String(DTypeName(p.dtype));
    h.Int(static_cast<int64_t>(p.shape.size()));
    for (int64_t d : p.shape) h.Int(d);
  }
  h.Int(static_cast<int64_t>(nodes.size()));
  for (const Node& n : nodes) {
    h.Int(n.id);
    h.String(n.name);
    h.String(PhaseName(n.phase));
    h.Int(n.micro_batch);
    h.Int(n.forward_id.value_or(-1));
    h.Int(n.recompute ? 1 : 0);
    h.Int(static_cast<int64_t>(n.param_ids.size()));
    for (int32_t id : n.param_ids) h.Int(id);
  }
  // Frozen params last, and only when there are any, so that the hash of a
  // graph whose params all train is unchanged. The fields above are
  // length-prefixed, so this suffix cannot be confused with them.
  int64_t frozen = 0;
  for (const Param& p : params) frozen += p.trainable ? 0 : 1;
  if (frozen > 0) {
    h.String("frozen");
    h.Int(frozen);
    for (const Param& p : params) {
      if (!p.trainable) h.Int(p.id);
    }
  }
  // Likewise a reduce dtype, only when it changes what some gradient is
  // reduced in.
  bool reduce_differs = false;
  for (const Param& p : params) {
    reduce_differs |= p.trainable && GradReduceDType(p) != p.dtype;
  }
  if (reduce_differs) {
    h.String("reduce");
    h.String(DTypeName(*reduce_dtype));
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(h.value()));
  return buf;
}

bool Graph::operator==(const Graph& other) const {
  return name == other.name && world_size == other.world_size &&
         micro_batches == other.micro_batches &&
         tokens_per_micro_batch == other.tokens_per_micro_batch &&
         reduce_dtype == other.reduce_dtype && params == other.params &&
         nodes == other.nodes;
}

void AppendIterationNodes(const std::vector<IterationUnit>& units,
                          Graph& graph) {
  auto add_node = [&graph](std::string name, Phase phase, int32_t mb) -> Node& {
    Node n;
    n.id = static_cast<int32_t>(graph.nodes.size());
    n.name = std::move(name);
    n.phase = phase;
    n.micro_batch = mb;
    graph.nodes.push_back(std::move(n));
    return graph.nodes.back();
  };
  const int32_t micro_batches = std::max(graph.micro_batches, 1);
  std::vector<int32_t> forward_ids(units.size());
  for (int32_t k = 0; k < micro_batches; ++k) {
    const std::string prefix =
        micro_batches > 1 ? absl::StrCat("mb", k, ".") : std::string();
    for (size_t i = 0; i < units.size(); ++i) {
      Node& n = add_node(prefix + units[i].name, Phase::kForward, k);
      n.param_ids = units[i].param_ids;
      n.activation_bytes = units[i].activation_bytes;
      forward_ids[i] = n.id;
    }
    for (size_t i = units.size(); i-- > 0;) {
      Node& n = add_node(absl::StrCat(prefix, units[i].name, ".bwd"),
                         Phase::kBackward, k);
      n.forward_id = forward_ids[i];
      n.recompute = units[i].recompute;
      n.param_ids = units[i].param_ids;
    }
  }
  add_node("optimizer", Phase::kOptimizer, 0);
}

GraphIndex::GraphIndex(const Graph& graph) {
  for (size_t i = 0; i < graph.params.size(); ++i) {
    param_pos_.emplace(graph.params[i].id, static_cast<int>(i));
  }
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    node_pos_.emplace(graph.nodes[i].id, static_cast<int>(i));
  }
}

int GraphIndex::ParamPos(int32_t id) const {
  auto it = param_pos_.find(id);
  return it == param_pos_.end() ? -1 : it->second;
}

int GraphIndex::NodePos(int32_t id) const {
  auto it = node_pos_.find(id);
  return it == node_pos_.end() ? -1 : it->second;
}

}  // namespace tandem
