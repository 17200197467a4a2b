// Model archives: what `tandem export` writes and the worker runs
// (proto/tandem/v1/archive.proto; common/README.md, "Model archives").
// Reading one checks everything that can be checked without libtorch: the
// zip directory (stored entries only), the manifest's format version, every
// entry's SHA-256, the manifest's structure (values defined before they are
// read, params and buffers declared and listed by the units that use them,
// the loss an output of the last unit, known dtypes, positive shapes) and
// the weights' safetensors header against the declared params and buffers.
// The coordinator uses it to refuse a bad archive at submit, the worker
// before it loads the units.
#ifndef TANDEM_COMMON_ARCHIVE_MODEL_ARCHIVE_H_
#define TANDEM_COMMON_ARCHIVE_MODEL_ARCHIVE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/archive/safetensors.h"
#include "common/archive/zip_reader.h"
#include "tandem/v1/archive.pb.h"

namespace tandem {

// The archive layout this reader knows (ArchiveManifest.format_version).
inline constexpr int kArchiveFormatVersion = 1;
// Every entry lives under this folder.
inline constexpr char kArchiveRoot[] = "model/";
inline constexpr char kArchiveWeights[] = "weights.safetensors";

struct ModelArchive {
  v1::ArchiveManifest manifest;
  ZipReader zip;
  // The header of model/weights.safetensors (offsets within that entry).
  SafetensorsHeader weights;
};

// Opens and fully checks the archive at `path` (above). Errors: NotFound for
// a missing file; InvalidArgument naming the entry or manifest field at
// fault and what to do (usually: export again).
absl::StatusOr<ModelArchive> OpenModelArchive(const std::string& path);

// OpenModelArchive's manifest.
absl::StatusOr<v1::ArchiveManifest> ReadArchiveManifest(
    const std::string& path);

// The structural checks alone, on a manifest already parsed: every problem,
// by field path ("units[2].inputs[0]"), the first few joined.
absl::Status ValidateArchiveManifest(const v1::ArchiveManifest& manifest);

}  // namespace tandem

#endif  // TANDEM_COMMON_ARCHIVE_MODEL_ARCHIVE_H_
