// Byte counts as people read and write them: "81.30 GiB (87294562304 B)" in
// messages, "70GiB" or "64GB" in flags and specs.
#ifndef TANDEM_COMMON_BYTES_H_
#define TANDEM_COMMON_BYTES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// In the unit that reads best, and exact for copying: "81.3 GiB
// (87294562304 B)", "2.34 MiB (2457224 B)", "512 B".
std::string FormatBytes(int64_t bytes);

// Short, for tables: "512B", "1.50MiB", "80.00GiB" (the largest power of
// 1024 that keeps the number at least 1; negative counts get a '-').
std::string FormatBytesShort(int64_t bytes);

// A positive byte count with an optional suffix: B, KiB, MiB, GiB, TiB
// (powers of 1024) or KB, MB, GB, TB (powers of 1000); fractions are allowed
// before a suffix ("1.5GiB"). InvalidArgument otherwise, naming `what` (the
// flag or field) and showing the accepted forms.
absl::StatusOr<int64_t> ParseByteCount(absl::string_view text,
                                       absl::string_view what);

}  // namespace tandem

#endif  // TANDEM_COMMON_BYTES_H_
