// SHA-256 (FIPS 180-4), written from the standard: the model archive's
// checksums (archive/model_archive.h) and anything else that needs one
// without a crypto library. Not constant-time; not for secrets.
#ifndef TANDEM_COMMON_SHA256_H_
#define TANDEM_COMMON_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace tandem {

class Sha256 {
 public:
  Sha256();
  // Appends `data` to the message.
  void Update(const void* data, size_t size);
  void Update(absl::string_view data) { Update(data.data(), data.size()); }
  // The digest of everything appended; the object must not be used after.
  std::array<uint8_t, 32> Finish();

 private:
  void Compress(const uint8_t block[64]);

  std::array<uint32_t, 8> h_;
  uint8_t block_[64];
  size_t block_size_ = 0;
  uint64_t total_bytes_ = 0;
};

// Lowercase hex digest of `data`.
std::string Sha256Hex(absl::string_view data);
std::string DigestHex(const std::array<uint8_t, 32>& digest);

}  // namespace tandem

#endif  // TANDEM_COMMON_SHA256_H_
