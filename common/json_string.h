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

}  // namespace tandem

#endif  // TANDEM_COMMON_JSON_STRING_H_
