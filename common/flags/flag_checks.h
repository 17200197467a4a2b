// Checks of flag values after parsing, whose errors name the flag and say
// what to write instead: ranges, HOST:PORT addresses, one of a few words.
// Byte counts ("70GiB") are ParseByteCount's (common/bytes.h). Each returns
// OK or InvalidArgument; a binary hands them to ExitIfInvalid
// (command_line.h).
#ifndef TANDEM_COMMON_FLAGS_FLAG_CHECKS_H_
#define TANDEM_COMMON_FLAGS_FLAG_CHECKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tandem {

// `flag` >= `min`, e.g. "--threads must be >= 0, got -1".
template <typename T>
absl::Status CheckAtLeast(absl::string_view flag, T value, T min) {
  if (value >= min) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " must be >= ", min, ", got ", value));
}

// `flag` > 0, e.g. "--timeout must be > 0, got 0".
template <typename T>
absl::Status CheckPositive(absl::string_view flag, T value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " must be > 0, got ", value));
}

// `value` is one of `choices`; the error lists them.
absl::Status CheckOneOf(absl::string_view flag, absl::string_view value,
                        absl::Span<const absl::string_view> choices);

// Whether port 0 (the system picks a free port) is allowed: for an address
// to listen on, not for one to connect to.
enum class PortZero { kAllowed, kRejected };

// HOST:PORT, as the listeners and clients take it: a non-empty host (a name,
// an IPv4 address or a bracketed IPv6 one) before the last ':', a port in
// 0..65535 (1..65535 with PortZero::kRejected) after it.
absl::Status CheckHostPort(absl::string_view flag, absl::string_view value,
                           PortZero port_zero);

}  // namespace tandem

#endif  // TANDEM_COMMON_FLAGS_FLAG_CHECKS_H_
