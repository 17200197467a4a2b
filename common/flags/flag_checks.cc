#include "common/flags/flag_checks.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"

namespace tandem {

absl::Status CheckOneOf(absl::string_view flag, absl::string_view value,
                        absl::Span<const absl::string_view> choices) {
  if (std::find(choices.begin(), choices.end(), value) != choices.end()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(flag, ": expected one of ",
                                                 absl::StrJoin(choices, ", "),
                                                 ", got '", value, "'"));
}

absl::Status CheckHostPort(absl::string_view flag, absl::string_view value,
                           PortZero port_zero) {
  const size_t colon = value.rfind(':');
  const int min_port = port_zero == PortZero::kAllowed ? 0 : 1;
  int port = -1;
  const bool ok = colon != absl::string_view::npos && colon > 0 &&
                  std::all_of(value.begin() + colon + 1, value.end(),
                              [](char c) { return absl::ascii_isdigit(c); }) &&
                  absl::SimpleAtoi(value.substr(colon + 1), &port) &&
                  port >= min_port && port <= 65535;
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      flag, ": expected HOST:PORT with a port in ", min_port, "..65535, got '",
      value,
      "' (e.g. 127.0.0.1:", port_zero == PortZero::kAllowed ? "0" : "50051",
      port_zero == PortZero::kAllowed ? "; port 0 picks a free one)" : ")"));
}

}  // namespace tandem
