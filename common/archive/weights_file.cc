#include "common/archive/weights_file.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem {
namespace {

std::string ShapeText(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

bool FloatDType(const std::string& dtype) {
  return dtype == "float32" || dtype == "bfloat16" || dtype == "float16";
}

}  // namespace

absl::StatusOr<std::vector<std::vector<WeightPiece>>> MatchWeights(
    const SafetensorsHeader& header, absl::Span<const WeightTensor> params,
    absl::string_view what) {
  absl::flat_hash_map<std::string, const SafetensorsTensor*> by_name;
  for (const SafetensorsTensor& t : header.tensors) by_name[t.name] = &t;
  absl::flat_hash_set<std::string> used;
  std::vector<std::vector<WeightPiece>> out;
  out.reserve(params.size());
  for (const WeightTensor& p : params) {
    const size_t star = p.export_name.find(kStackedIndex);
    const bool stacked = star != std::string::npos;
    if (stacked && p.shape.empty()) {
      return absl::InternalError(
          absl::StrCat("param '", p.param, "' is stacked but has no dim 0"));
    }
    const int64_t count = stacked ? p.shape[0] : 1;
    const std::vector<int64_t> shape =
        stacked ? std::vector<int64_t>(p.shape.begin() + 1, p.shape.end())
                : p.shape;
    std::vector<WeightPiece>& pieces = out.emplace_back();
    for (int64_t i = 0; i < count; ++i) {
      const std::string name =
          stacked ? absl::StrCat(p.export_name.substr(0, star), i,
                                 p.export_name.substr(star + 1))
                  : p.export_name;
      const auto it = by_name.find(name);
      if (it == by_name.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " has no tensor '", name, "' (the model's param '", p.param,
            "', ", ShapeText(shape),
            "); it must hold every param of the "
            "model under these names"));
      }
      const SafetensorsTensor& t = *it->second;
      if (t.shape != shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": tensor '", name, "' has shape ", ShapeText(t.shape),
            ", but the model's param '", p.param, "' needs ", ShapeText(shape),
            "; the file is of another model config"));
      }
      if (!FloatDType(t.dtype)) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": tensor '", name, "' is ", t.dtype,
                         "; weights must be float32, bfloat16 or float16"));
      }
      used.insert(name);
      pieces.push_back({t.begin, t.end, t.dtype});
    }
  }
  for (const SafetensorsTensor& t : header.tensors) {
    if (!used.contains(t.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " holds tensor '", t.name, "' ", ShapeText(t.shape),
          ", which is no param of this model (another model, or tied "
          "weights?); remove it from the file"));
    }
  }
  return out;
}

std::vector<WeightTensor> ArchiveWeightTensors(
    const v1::ArchiveManifest& manifest) {
  std::vector<WeightTensor> out;
  for (const v1::ArchiveParam& p : manifest.params()) {
    out.push_back({p.name(), {p.shape().begin(), p.shape().end()}, p.name()});
  }
  return out;
}

std::string CheckpointTensorsText(absl::Span<const WeightTensor> params) {
  std::string out;
  for (const WeightTensor& p : params) {
    absl::StrAppend(&out, p.param, "\tfloat32\t", absl::StrJoin(p.shape, ","),
                    "\t", p.export_name, "\n");
  }
  return out;
}

}  // namespace tandem
