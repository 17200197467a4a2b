// The header of a safetensors file (https://huggingface.co/docs/safetensors):
// an 8-byte little-endian header length N, N bytes of JSON mapping each
// tensor's name to its dtype ("F32", "I64", ...), shape and data_offsets
// [begin, end) relative to the byte after the header, then the data. The
// parser checks every field and that each tensor's bytes match its dtype and
// shape and lie inside the file. No libtorch.
#ifndef TANDEM_COMMON_ARCHIVE_SAFETENSORS_H_
#define TANDEM_COMMON_ARCHIVE_SAFETENSORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

struct SafetensorsTensor {
  std::string name;
  // The archive's dtype name ("float32", "int64", ...: archive.proto).
  std::string dtype;
  std::vector<int64_t> shape;
  // Absolute offsets of the tensor's bytes in the file.
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct SafetensorsHeader {
  // In file order of their data.
  std::vector<SafetensorsTensor> tensors;
  // nullptr when there is no tensor `name`.
  const SafetensorsTensor* Find(absl::string_view name) const;
};

// Parses the header at the start of `file` (at least the 8 + N header bytes;
// `file_size` is the whole file's). `what` names the file in errors, `fix`
// says what to do about one. Errors: InvalidArgument naming the tensor and
// field at fault.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    absl::string_view file, uint64_t file_size, absl::string_view what,
    absl::string_view fix = "export the model again");

// Bytes per element of an archive dtype name; 0 for names it does not know.
int64_t DTypeElementBytes(absl::string_view dtype);

// A file descriptor, closed on destruction.
class ScopedFd {
 public:
  explicit ScopedFd(int fd = -1) : fd_(fd) {}
  ~ScopedFd();
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// A safetensors file opened for reading: its header read (reading a
// tensor's bytes is the caller's, with ReadFileBytes).
struct SafetensorsFile {
  std::string path;
  ScopedFd fd;
  uint64_t size = 0;
  // Offsets are absolute in the file.
  SafetensorsHeader header;
};

// Opens `path` and parses its header (at most 100 MiB of it). Errors:
// NotFound (missing or unreadable: the message adds `not_found_fix`),
// InvalidArgument (not a regular file, or a bad header: the message adds
// `fix`). Messages name the file, never a spec field.
absl::StatusOr<SafetensorsFile> OpenSafetensorsFile(
    const std::string& path, absl::string_view not_found_fix,
    absl::string_view fix);

// Reads `size` bytes at `offset` of the open file `fd` into `out`. Errors:
// DataLoss naming `path` on a short read.
absl::Status ReadFileBytes(int fd, const std::string& path, uint64_t offset,
                           uint64_t size, char* out);

}  // namespace tandem

#endif  // TANDEM_COMMON_ARCHIVE_SAFETENSORS_H_
