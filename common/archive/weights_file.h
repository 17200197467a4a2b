// Weight files: safetensors files of a model's full, unsharded params under
// their export names (`model.init_from` reads one, `tandem export-weights`
// writes one; common/README.md, "Weight files"). This matches a file's
// header against the params a model has and says, for each param, where its
// values lie in the file. No libtorch.
#ifndef TANDEM_COMMON_ARCHIVE_WEIGHTS_FILE_H_
#define TANDEM_COMMON_ARCHIVE_WEIGHTS_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/archive/safetensors.h"
#include "tandem/v1/archive.pb.h"

namespace tandem {

// In an export name: where a stacked param's index along dim 0 goes. Such a
// param ([n, ...]) is n tensors of shape [...] in the file.
inline constexpr char kStackedIndex = '*';

// A param as weight files hold it.
struct WeightTensor {
  // The model's own name for it (the checkpoint's, the program's).
  std::string param;
  std::vector<int64_t> shape;
  // Its name in the file (may hold kStackedIndex).
  std::string export_name;
};

// A stretch of the file holding consecutive values of a param, in the
// file's dtype ("float32", "bfloat16" or "float16").
struct WeightPiece {
  uint64_t begin = 0;
  uint64_t end = 0;
  std::string dtype;
};

// Where each of `params`' values lie in the file whose header is `header`:
// one piece per param (n for a stacked one, in index order), in `params`'
// order. The file must hold exactly these tensors (names and shapes), each
// float32, bfloat16 or float16. Errors: InvalidArgument naming the first
// tensor at fault (missing, shaped or typed otherwise, or not one of the
// model's) and what the model has; messages start with `what`.
absl::StatusOr<std::vector<std::vector<WeightPiece>>> MatchWeights(
    const SafetensorsHeader& header, absl::Span<const WeightTensor> params,
    absl::string_view what);

// An exported model's params under their own names (the archive's).
std::vector<WeightTensor> ArchiveWeightTensors(
    const v1::ArchiveManifest& manifest);

// The checkpoint blob that lists a checkpoint's params
// (worker/checkpoint/checkpoint_files.h): one line per param,
// "<param>\t<dtype>\t<d0>,<d1>,...\t<export name>\n".
inline constexpr char kCheckpointTensorsBlob[] = "tensors";
std::string CheckpointTensorsText(absl::Span<const WeightTensor> params);

}  // namespace tandem

#endif  // TANDEM_COMMON_ARCHIVE_WEIGHTS_FILE_H_
