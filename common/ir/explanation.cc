#include "common/ir/explanation.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/bytes.h"

namespace tandem {
namespace {

template <typename Enum, size_t N>
std::optional<Enum> ParseByName(absl::string_view name, const Enum (&all)[N],
                                absl::string_view (*name_of)(Enum)) {
  for (Enum e : all) {
    if (name_of(e) == name) return e;
  }
  return std::nullopt;
}

// "+1.5GiB" / "-2MiB" / "0".
std::string SignedBytes(int64_t bytes) {
  if (bytes == 0) return "0";
  return absl::StrCat(bytes > 0 ? "+" : "", FormatBytesShort(bytes));
}

std::string DescribeBinding(const Binding& b) {
  switch (b.kind) {
    case BindingKind::kNone:
      return "none";
    case BindingKind::kMemory:
      return absl::StrCat("memory at ",
                          b.node_id.has_value() ? absl::StrCat("n", *b.node_id)
                                                : std::string("?"),
                          " (", FormatBytesShort(b.bytes), " of ",
                          FormatBytesShort(b.limit_bytes), ")");
    case BindingKind::kLink:
      return "link";
    case BindingKind::kHostLink:
      return "host link";
  }
  return "?";
}

}  // namespace

absl::string_view DecisionKindName(DecisionKind kind) {
  switch (kind) {
    case DecisionKind::kPrefetch:
      return "prefetch";
    case DecisionKind::kFuse:
      return "fuse";
    case DecisionKind::kKeep:
      return "keep";
    case DecisionKind::kPersist:
      return "persist";
    case DecisionKind::kOffload:
      return "offload";
    case DecisionKind::kReturn:
      return "return";
    case DecisionKind::kZero1Buckets:
      return "zero1-buckets";
    case DecisionKind::kPass:
      return "pass";
    case DecisionKind::kPolicy:
      return "policy";
    case DecisionKind::kLeastMemory:
      return "least-memory";
  }
  return "?";
}

std::optional<DecisionKind> ParseDecisionKind(absl::string_view name) {
  static constexpr DecisionKind kAll[] = {
      DecisionKind::kPrefetch,     DecisionKind::kFuse,
      DecisionKind::kKeep,         DecisionKind::kPersist,
      DecisionKind::kOffload,      DecisionKind::kReturn,
      DecisionKind::kZero1Buckets, DecisionKind::kPass,
      DecisionKind::kPolicy,       DecisionKind::kLeastMemory};
  return ParseByName(name, kAll, &DecisionKindName);
}

absl::string_view BindingKindName(BindingKind kind) {
  switch (kind) {
    case BindingKind::kNone:
      return "none";
    case BindingKind::kMemory:
      return "memory";
    case BindingKind::kLink:
      return "link";
    case BindingKind::kHostLink:
      return "host-link";
  }
  return "?";
}

std::optional<BindingKind> ParseBindingKind(absl::string_view name) {
  static constexpr BindingKind kAll[] = {
      BindingKind::kNone, BindingKind::kMemory, BindingKind::kLink,
      BindingKind::kHostLink};
  return ParseByName(name, kAll, &BindingKindName);
}

bool Binding::operator==(const Binding& other) const {
  return kind == other.kind && node_id == other.node_id &&
         bytes == other.bytes && limit_bytes == other.limit_bytes;
}

bool Decision::operator==(const Decision& other) const {
  return kind == other.kind && pass == other.pass && what == other.what &&
         group_ids == other.group_ids && param_ids == other.param_ids &&
         offload_ids == other.offload_ids && node_id == other.node_id &&
         gain_s == other.gain_s && exposed_gain_s == other.exposed_gain_s &&
         held_bytes == other.held_bytes &&
         peak_delta_bytes == other.peak_delta_bytes && binding == other.binding;
}

double Explanation::TotalGain() const {
  double total = 0;
  for (const Decision& d : decisions) total += d.gain_s;
  return total;
}

double Explanation::TotalExposedGain() const {
  double total = 0;
  for (const Decision& d : decisions) total += d.exposed_gain_s;
  return total;
}

bool Explanation::operator==(const Explanation& other) const {
  return baseline_iteration_s == other.baseline_iteration_s &&
         baseline_exposed_comm_s == other.baseline_exposed_comm_s &&
         baseline_peak_bytes == other.baseline_peak_bytes &&
         decisions == other.decisions;
}

std::string FormatExplanation(const Explanation& explanation,
                              double plan_iteration_s,
                              double plan_exposed_comm_s) {
  std::string out;
  if (explanation.empty()) {
    return "# no explanation stored with this schedule (it was not planned "
           "from a baseline, e.g. the starting schedule itself)\n";
  }
  absl::StrAppendFormat(
      &out,
      "# baseline: iteration %.6f s, exposed communication %.6f s, peak %s\n",
      explanation.baseline_iteration_s, explanation.baseline_exposed_comm_s,
      FormatBytesShort(explanation.baseline_peak_bytes));
  absl::StrAppendFormat(&out,
                        "# gains: simulated time before each decision less "
                        "after it, in the order applied\n");
  absl::StrAppendFormat(&out, "%-4s %-13s %-15s %11s %11s %10s %10s  %-s\n",
                        "#", "decision", "pass", "gain_s", "exposed_s", "held",
                        "peak", "binding / what");
  int i = 0;
  for (const Decision& d : explanation.decisions) {
    absl::StrAppendFormat(
        &out, "%-4d %-13s %-15s %11.6f %11.6f %10s %10s  %s\n", ++i,
        DecisionKindName(d.kind), d.pass, d.gain_s, d.exposed_gain_s,
        d.held_bytes == 0 ? "0" : FormatBytesShort(d.held_bytes),
        SignedBytes(d.peak_delta_bytes), DescribeBinding(d.binding));
    absl::StrAppend(&out, "     ", d.what, "\n");
  }
  const double predicted = explanation.baseline_iteration_s - plan_iteration_s;
  const double total = explanation.TotalGain();
  absl::StrAppendFormat(
      &out,
      "# total gain %.6f s (exposed communication %.6f s); predicted "
      "baseline - plan %.6f s (exposed %.6f s)\n",
      total, explanation.TotalExposedGain(), predicted,
      explanation.baseline_exposed_comm_s - plan_exposed_comm_s);
  return out;
}

}  // namespace tandem
