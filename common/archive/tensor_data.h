// Data files of named tensors (job spec `data.kind: tensors`;
// common/README.md, "Tensor data files"): a safetensors file of named
// arrays, each with the sample as its first dimension and the same number
// of samples N. A model input is fed by the array of its name; an optional
// int64 array `lengths` [N] gives each sample's valid length along
// dimension 1 of the inputs whose dim 1 is dynamic. The coordinator checks
// a file against an archive's inputs at submit, the worker again before it
// reads one (worker/data/tensor_source.h). No libtorch.
#ifndef TANDEM_COMMON_ARCHIVE_TENSOR_DATA_H_
#define TANDEM_COMMON_ARCHIVE_TENSOR_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/archive/safetensors.h"
#include "tandem/v1/archive.pb.h"

namespace tandem {

// The array that holds the samples' lengths; never a model input.
inline constexpr char kTensorDataLengths[] = "lengths";
// What an input of role "targets" holds where nothing is to be counted
// (torch's cross_entropy ignore_index): positions past a sample's length.
inline constexpr int64_t kIgnoredTarget = -100;

struct TensorDataFile {
  std::string path;
  // Offsets are absolute in the file.
  SafetensorsHeader header;
  // N: dim 0 of every array.
  int64_t samples = 0;
  // The `lengths` array (each >= 1); empty when the file has none.
  std::vector<int64_t> lengths;
};

// Opens and checks `path`: a safetensors file whose arrays all have at
// least one dim and the same dim 0 N >= 1; `lengths`, when present, int64
// [N] with every value >= 1. Errors: NotFound (missing or unreadable),
// InvalidArgument naming the array and what to write instead. Messages do
// not name the spec field: callers prefix "data.path: ".
absl::StatusOr<TensorDataFile> OpenTensorDataFile(const std::string& path);

// Why `file` cannot feed a model with `inputs` (an archive manifest's), one
// message per problem, empty when it can: an input with no array of its
// name (listing the names the file holds), an array of another dtype, rank
// or non-dynamic dim (both shapes), an input named `lengths`, two inputs of
// role targets, a `lengths` array with no input whose dim 1 is dynamic, or
// a length beyond an input's dim 1.
std::vector<std::string> TensorDataProblems(
    const TensorDataFile& file, absl::Span<const v1::ArchiveInput> inputs);

// Why `data.kind: synthetic` cannot draw a model's `inputs` of no role
// (worker/data/synthetic_inputs.h), one message per problem, empty when it
// can: an input without a synthetic description (an archive written before
// there was one), a dtype it cannot draw (not floating, integer or bool), a
// range that is empty or outside the dtype's, or a std that is negative or
// not finite. Inputs of a role are the token stream's, not checked here.
std::vector<std::string> SyntheticDataProblems(
    absl::Span<const v1::ArchiveInput> inputs);

// Whether `in`'s dim 1 may vary from batch to batch (its dynamic_dims hold
// 1): a sequence dimension the data sources cut or set.
bool DynamicDim1(const v1::ArchiveInput& in);

// Whether `dtype` (an archive's name) is a floating dtype the synthetic
// source draws: float32, float64, float16, bfloat16.
bool SyntheticFloating(const std::string& dtype);

}  // namespace tandem

#endif  // TANDEM_COMMON_ARCHIVE_TENSOR_DATA_H_
