// "Did you mean" hints for names typed wrong: flags, model-config keys, a
// job spec's enumerated values (model.preset, optimize.policy, data.kind).
// Header-only, so that every library that names things can use it (the
// flags library links nothing of common's).
#ifndef TANDEM_COMMON_DID_YOU_MEAN_H_
#define TANDEM_COMMON_DID_YOU_MEAN_H_

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tandem {

// Levenshtein distance: insertions, deletions and substitutions.
inline size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The option nearest `typed`, when it is a near miss: fewer than
// `below` edits away (ties: the first listed). Empty when none is.
template <typename Options>
std::string NearestOption(absl::string_view typed, const Options& options,
                          size_t below = 3) {
  std::string nearest;
  size_t best = below;
  for (const auto& option : options) {
    const size_t d = EditDistance(typed, option);
    if (d < best) {
      best = d;
      nearest = std::string(option);
    }
  }
  return nearest;
}

// " (did you mean 'x'?)" for a near miss among `options`, else "": to
// append to an error that names what was typed.
template <typename Options>
std::string DidYouMean(absl::string_view typed, const Options& options) {
  const std::string nearest = NearestOption(typed, options);
  return nearest.empty() ? "" : " (did you mean '" + nearest + "'?)";
}

}  // namespace tandem

#endif  // TANDEM_COMMON_DID_YOU_MEAN_H_
