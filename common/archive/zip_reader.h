// A minimal reader of zip files whose entries are stored (uncompressed), as
// model archives are (archive.proto; common/README.md, "Model archives"):
// it parses the end-of-central-directory record (and its ZIP64 form) and the
// central directory, and reads an entry's bytes, checking its CRC-32.
// Compressed or encrypted entries, split archives and data descriptors of
// unknown size are refused with an error that says to re-export.
#ifndef TANDEM_COMMON_ARCHIVE_ZIP_READER_H_
#define TANDEM_COMMON_ARCHIVE_ZIP_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

struct ZipEntry {
  std::string name;
  // Offset of the entry's data in the file, and its size.
  uint64_t data_offset = 0;
  uint64_t size = 0;
  uint32_t crc32 = 0;
};

class ZipReader {
 public:
  // Reads the directory of the zip file at `path`. Errors: NotFound (no such
  // file), InvalidArgument naming the path (not a zip file, truncated, an
  // entry compressed or encrypted: "re-export: entries must be stored").
  static absl::StatusOr<ZipReader> Open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<ZipEntry>& entries() const { return entries_; }
  // nullptr when there is no entry `name`.
  const ZipEntry* Find(absl::string_view name) const;
  // The bytes of entry `name`, CRC-32 checked. Errors: NotFound naming the
  // entry; InvalidArgument when the file is truncated or the CRC differs.
  absl::StatusOr<std::string> Read(absl::string_view name) const;

 private:
  std::string path_;
  uint64_t file_size_ = 0;
  std::vector<ZipEntry> entries_;
};

// CRC-32 (ISO 3309, the zip format's), continuing from `crc` (0 to start).
uint32_t Crc32(absl::string_view data, uint32_t crc = 0);

}  // namespace tandem

#endif  // TANDEM_COMMON_ARCHIVE_ZIP_READER_H_
