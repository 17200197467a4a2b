#include "common/bytes.h"

#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem {

namespace {

// |bytes| in the largest of KiB, MiB, GiB and TiB that keeps it >= 1: the
// value and the unit's index (-1: under 1 KiB, in bytes).
std::pair<double, int> InLargestUnit(int64_t bytes) {
  double value = std::abs(static_cast<double>(bytes));
  int unit = -1;
  while (value >= 1024 && unit + 1 < 4) {
    value /= 1024;
    ++unit;
  }
  return {value, unit};
}

constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};

}  // namespace

std::string FormatBytes(int64_t bytes) {
  const auto [value, unit] = InLargestUnit(bytes);
  if (unit < 0) return absl::StrCat(bytes, " B");
  // Three significant digits: 2.34, 45.6, 139.
  const int decimals = value < 10 ? 2 : value < 100 ? 1 : 0;
  return absl::StrFormat("%s%.*f %s (%d B)", bytes < 0 ? "-" : "", decimals,
                         value, kUnits[unit], bytes);
}

std::string FormatBytesShort(int64_t bytes) {
  const auto [value, unit] = InLargestUnit(bytes);
  if (unit < 0) return absl::StrCat(bytes, "B");
  return absl::StrFormat("%s%.2f%s", bytes < 0 ? "-" : "", value, kUnits[unit]);
}

absl::StatusOr<int64_t> ParseByteCount(absl::string_view text,
                                       absl::string_view what) {
  struct Suffix {
    absl::string_view name;
    double scale;
  };
  // Longest first, so "GiB" is not read as "B".
  static constexpr Suffix kSuffixes[] = {
      {"TiB", 1099511627776.0},
      {"GiB", 1073741824.0},
      {"MiB", 1048576.0},
      {"KiB", 1024.0},
      {"TB", 1e12},
      {"GB", 1e9},
      {"MB", 1e6},
      {"KB", 1e3},
      {"B", 1.0},
  };
  absl::string_view number = absl::StripAsciiWhitespace(text);
  double scale = 1;
  for (const Suffix& s : kSuffixes) {
    if (absl::EndsWith(number, s.name)) {
      number.remove_suffix(s.name.size());
      number = absl::StripTrailingAsciiWhitespace(number);
      scale = s.scale;
      break;
    }
  }
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(number, &value) ||
      !std::isfinite(value) || value <= 0 || value * scale > 9e18) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     ": expected a positive byte count such as 70GiB, 64GB or "
                     "75161927680, got '",
                     text, "'"));
  }
  return static_cast<int64_t>(std::llround(value * scale));
}

}  // namespace tandem
