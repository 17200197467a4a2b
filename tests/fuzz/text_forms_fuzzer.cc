// The graph, schedule and profile text forms (common/ir/text_format.h):
// whatever the bytes, parsing returns a value or an error, never crashes;
// what parses prints, and the print parses back to the same print.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "common/ir/text_format.h"

namespace {

template <typename T, typename Parse, typename Print>
void RoundTrip(absl::string_view text, Parse parse, Print print) {
  absl::StatusOr<T> parsed = parse(text);
  if (!parsed.ok()) return;
  const std::string printed = print(*parsed);
  absl::StatusOr<T> again = parse(printed);
  if (!again.ok() || print(*again) != printed) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the form: every input exercises one parser.
  const absl::string_view text(reinterpret_cast<const char*>(data) + 1,
                               size - 1);
  switch (data[0] % 3) {
    case 0:
      RoundTrip<tandem::Graph>(text, tandem::ParseGraph, tandem::PrintGraph);
      break;
    case 1:
      // PrintSchedule is overloaded (with and without names): pick the
      // one-argument form explicitly.
      RoundTrip<tandem::Schedule>(
          text, tandem::ParseSchedule,
          [](const tandem::Schedule& s) { return tandem::PrintSchedule(s); });
      break;
    default:
      RoundTrip<tandem::Profile>(text, tandem::ParseProfile,
                                 tandem::PrintProfile);
      break;
  }
  return 0;
}
