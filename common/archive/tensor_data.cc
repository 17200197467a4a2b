#include "common/archive/tensor_data.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

constexpr size_t kMaxNamesListed = 8;
constexpr char kHowToWrite[] =
    "write it with safetensors.torch.save_file({name: tensor, ...}, path), "
    "the sample as every array's dim 0";

std::string ShapeText(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The manifest's shape, its dynamic dims (dim 0, the sample, always) shown
// as '*'.
std::string InputShapeText(const v1::ArchiveInput& in) {
  std::vector<std::string> dims;
  for (int d = 0; d < in.shape_size(); ++d) {
    const bool dynamic =
        d == 0 || std::find(in.dynamic_dims().begin(), in.dynamic_dims().end(),
                            d) != in.dynamic_dims().end();
    dims.push_back(dynamic ? "*" : absl::StrCat(in.shape(d)));
  }
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

std::string NamesHeld(const TensorDataFile& file) {
  std::vector<std::string> names;
  for (const SafetensorsTensor& t : file.header.tensors) {
    if (names.size() == kMaxNamesListed) {
      names.push_back("...");
      break;
    }
    names.push_back(absl::StrCat("'", t.name, "'"));
  }
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

}  // namespace

absl::StatusOr<TensorDataFile> OpenTensorDataFile(const std::string& path) {
  ASSIGN_OR_RETURN(
      SafetensorsFile opened,
      OpenSafetensorsFile(path, "point it at the tensors file", kHowToWrite));
  const std::string what = absl::StrCat("'", path, "'");
  TensorDataFile file;
  file.path = path;
  file.header = std::move(opened.header);
  if (file.header.tensors.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds no arrays; ", kHowToWrite));
  }
  const SafetensorsTensor* first = nullptr;
  for (const SafetensorsTensor& t : file.header.tensors) {
    if (t.shape.empty() || t.shape[0] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": array '", t.name, "' has shape ", ShapeText(t.shape),
          "; every array needs dim 0 (the sample) of at least 1"));
    }
    if (first == nullptr) {
      first = &t;
    } else if (t.shape[0] != first->shape[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": array '", t.name, "' holds ", t.shape[0],
          " samples (dim 0) but '", first->name, "' holds ", first->shape[0],
          "; every array must hold the same samples"));
    }
  }
  file.samples = first->shape[0];
  if (const SafetensorsTensor* l = file.header.Find(kTensorDataLengths)) {
    if (l->dtype != "int64" || l->shape.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": array 'lengths' is ", l->dtype, " ", ShapeText(l->shape),
          "; it must be int64 [", file.samples,
          "]: each sample's valid length along dim 1"));
    }
    file.lengths.resize(static_cast<size_t>(file.samples));
    if (absl::Status s =
            ReadFileBytes(opened.fd.get(), path, l->begin, l->end - l->begin,
                          reinterpret_cast<char*>(file.lengths.data()));
        !s.ok()) {
      return s;
    }
    for (int64_t i = 0; i < file.samples; ++i) {
      if (file.lengths[i] < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": lengths[", i, "] is ", file.lengths[i],
                         "; every sample's length must be >= 1"));
      }
    }
  }
  return file;
}

std::vector<std::string> TensorDataProblems(
    const TensorDataFile& file, absl::Span<const v1::ArchiveInput> inputs) {
  std::vector<std::string> problems;
  const std::string what = absl::StrCat("'", file.path, "'");
  std::string targets;
  bool any_dynamic_dim1 = false;
  for (const v1::ArchiveInput& in : inputs) {
    if (in.name() == kTensorDataLengths) {
      problems.push_back(absl::StrCat(
          "the model takes an input named 'lengths', the name data.kind "
          "tensors reserves for the samples' lengths; rename the model's "
          "argument and export again"));
      continue;
    }
    if (in.role() == "targets") {
      if (!targets.empty()) {
        problems.push_back(
            absl::StrCat("the model has two inputs of role targets, '", targets,
                         "' and '", in.name(),
                         "'; the loss counts the items of one: export with "
                         "roles= naming one"));
      }
      targets = in.name();
      if (in.dtype() != "int64") {
        problems.push_back(absl::StrCat("input '", in.name(),
                                        "' has role targets but dtype ",
                                        in.dtype(), "; targets are int64"));
      }
    }
    const SafetensorsTensor* t = file.header.Find(in.name());
    if (t == nullptr) {
      problems.push_back(absl::StrCat(
          what, " has no array '", in.name(), "', which the model takes as ",
          in.dtype(), " ", InputShapeText(in), "; it holds ", NamesHeld(file),
          ": add the array, named as the model's input"));
      continue;
    }
    bool fits = t->dtype == in.dtype() &&
                t->shape.size() == static_cast<size_t>(in.shape_size());
    for (int d = 1; fits && d < in.shape_size(); ++d) {
      const bool dynamic =
          std::find(in.dynamic_dims().begin(), in.dynamic_dims().end(), d) !=
          in.dynamic_dims().end();
      if (!dynamic && t->shape[d] != in.shape(d)) fits = false;
    }
    if (!fits) {
      problems.push_back(absl::StrCat(
          what, ": array '", in.name(), "' is ", t->dtype, " ",
          ShapeText(t->shape), ", but the model takes it as ", in.dtype(), " ",
          InputShapeText(in),
          " (dim 0 is the sample, '*' dims may vary); write it with the "
          "model's dtype and fixed dims"));
      continue;
    }
    if (DynamicDim1(in)) {
      any_dynamic_dim1 = true;
      if (!file.lengths.empty()) {
        const auto longest =
            std::max_element(file.lengths.begin(), file.lengths.end());
        if (*longest > t->shape[1]) {
          problems.push_back(absl::StrCat(
              what, ": lengths[", longest - file.lengths.begin(), "] is ",
              *longest, ", beyond dim 1 of array '", in.name(), "' (",
              t->shape[1], "); a length is at most the arrays' dim 1"));
        }
      }
    }
  }
  if (!file.lengths.empty() && !any_dynamic_dim1) {
    problems.push_back(absl::StrCat(
        what,
        " has an array 'lengths', but no model input has a dynamic "
        "dim 1 for it to cut; remove it, or export with dynamic_dims= "
        "naming dim 1"));
  }
  return problems;
}

namespace {

struct IntegerRange {
  const char* dtype;
  int64_t min, max;
};
constexpr IntegerRange kIntegerRanges[] = {
    {"int64", INT64_MIN, INT64_MAX}, {"int32", INT32_MIN, INT32_MAX},
    {"int16", INT16_MIN, INT16_MAX}, {"int8", INT8_MIN, INT8_MAX},
    {"uint8", 0, UINT8_MAX},         {"bool", 0, 1}};

}  // namespace

bool DynamicDim1(const v1::ArchiveInput& in) {
  return std::find(in.dynamic_dims().begin(), in.dynamic_dims().end(), 1) !=
         in.dynamic_dims().end();
}

bool SyntheticFloating(const std::string& dtype) {
  return dtype == "float32" || dtype == "float64" || dtype == "float16" ||
         dtype == "bfloat16";
}

std::vector<std::string> SyntheticDataProblems(
    absl::Span<const v1::ArchiveInput> inputs) {
  std::vector<std::string> problems;
  for (const v1::ArchiveInput& in : inputs) {
    if (!in.role().empty()) continue;
    const std::string where = absl::StrCat("input '", in.name(), "'");
    if (!in.has_synthetic()) {
      problems.push_back(absl::StrCat(
          where,
          " has no synthetic description (the archive predates them): export "
          "the model again, or use data.kind tensors"));
      continue;
    }
    const v1::ArchiveSynthetic& s = in.synthetic();
    if (SyntheticFloating(in.dtype())) {
      if (!std::isfinite(s.mean()) || !std::isfinite(s.std()) || s.std() < 0) {
        problems.push_back(absl::StrCat(where, ": synthetic mean ", s.mean(),
                                        " and std ", s.std(),
                                        " must be finite, std >= 0"));
      }
      continue;
    }
    const IntegerRange* range = nullptr;
    for (const IntegerRange& r : kIntegerRanges) {
      if (in.dtype() == r.dtype) range = &r;
    }
    if (range == nullptr) {
      problems.push_back(absl::StrCat(where, " has dtype ", in.dtype(),
                                      ", which data.kind synthetic cannot "
                                      "draw; use data.kind tensors"));
    } else if (s.low() > s.high() || s.low() < range->min ||
               s.high() > range->max) {
      problems.push_back(
          absl::StrCat(where, ": synthetic range [", s.low(), ", ", s.high(),
                       "] must be non-empty and within ", in.dtype(), "'s [",
                       range->min, ", ", range->max, "]"));
    }
  }
  return problems;
}

}  // namespace tandem
