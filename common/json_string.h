// A string as a JSON string literal: quotes, backslashes and control bytes
// escaped, everything else (UTF-8 included) as is. For the few places that
// write JSON by hand (the iteration timeline's Chrome trace, bench/load's
// results).
#ifndef TANDEM_COMMON_JSON_STRING_H_
#define TANDEM_COMMON_JSON_STRING_H_

#include <string>

#include "absl/strings/string_view.h"

namespace tandem {

// "\"a\\\"b\"" for a"b.
std::string JsonString(absl::string_view s);

// "NaN", "inf" or "-inf" for a value that is not finite (JSON has none of
// them): how step lines, events and reports name a diverged loss.
std::string NonFiniteName(double v);

}  // namespace tandem

#endif  // TANDEM_COMMON_JSON_STRING_H_
