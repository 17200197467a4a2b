// The profile's measured fields, described once. Each entry of a table
// below names one scalar field of a profile record (the window's header,
// a node's time, a collective, a memory sample): its proto name, its text
// attribute, its unit, the values it may take and how ranks combine. The
// proto conversion (proto_convert.cc), the text form (text_format.cc),
// validation (validate.cc), equality (profile.cc) and the aggregation over
// ranks (coordinator/service/profile_aggregator.cc) all walk these tables,
// so a new measured field is a member in profile.h, a line in its table
// (profile.cc) and a field in proto/tandem/v1/profile.proto; the profiler
// sets it and its one reader reads it (common/README.md, "The profile
// path").
//
// What is not a measured scalar stays with the code that knows its shape:
// the profile's identity (graph hash, rank, schedule version, window), a
// record's identity (node id, collective kind, group and params) and the
// communicator's scratch rules (a nested message with a joint rule).
#ifndef TANDEM_COMMON_IR_PROFILE_FIELDS_H_
#define TANDEM_COMMON_IR_PROFILE_FIELDS_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <variant>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/ir/profile.h"

namespace tandem {

// How a field's value reads and prints in the text form: kCount an integer,
// kBytes an integer or a size with a unit (4MiB), kSeconds a number or a
// duration with a unit (1.5ms), kNumber a plain number.
enum class FieldUnit { kCount, kBytes, kSeconds, kNumber };

// How the aggregate over ranks (one window, every rank) takes a field:
//   kFirst        the first rank's;
//   kMax          the largest;
//   kMinPositive  the smallest positive (0: not measured, skipped);
//   kPace         the largest, and the rank that sets it also sets every
//                 kWithPace field of the record (a node's time and the
//                 bytes that moved alongside it on that rank stay paired);
//   kWithPace     see kPace;
//   kOwnRule      the aggregator's own rule, named at the field.
enum class Combine { kFirst, kMax, kMinPositive, kPace, kWithPace, kOwnRule };

// The values a field may take: finite, within [lo, hi], or exactly 0 when
// zero_ok ("not measured"). `text` says so in an error ("finite and >= 0").
struct FieldBounds {
  double lo = 0;
  double hi = std::numeric_limits<double>::infinity();
  bool zero_ok = false;
  absl::string_view text = "finite and >= 0";

  bool Admits(double v) const {
    if (zero_ok && v == 0) return true;
    return std::isfinite(v) && v >= lo && v <= hi;
  }
};
inline constexpr FieldBounds kNonNegative{};
inline constexpr FieldBounds kAnyFinite{
    -std::numeric_limits<double>::infinity(),
    std::numeric_limits<double>::infinity(), false, "finite"};

template <typename Record>
using FieldMember =
    std::variant<int32_t Record::*, int64_t Record::*, double Record::*>;

template <typename Record>
struct ProfileField {
  // The field's name in its tandem.v1 message (same type as the member).
  absl::string_view proto_name;
  // Its attribute in the text form. A positional field prints bare, in
  // table order, before the attributes.
  absl::string_view key;
  FieldMember<Record> member;
  FieldUnit unit = FieldUnit::kNumber;
  // False: printed only when not +0 ("not measured" keeps old lines short).
  bool always_printed = false;
  bool positional = false;
  FieldBounds bounds = kNonNegative;
  // What it is, for errors: "the iteration time".
  absl::string_view what;
  Combine combine = Combine::kMax;
};

// The tables, in print order (profile.cc).
absl::Span<const ProfileField<Profile>> ProfileHeaderFields();
absl::Span<const ProfileField<NodeTiming>> NodeTimingFields();
absl::Span<const ProfileField<CollectiveTiming>> CollectiveTimingFields();
absl::Span<const ProfileField<MemorySample>> MemorySampleFields();

// A field's value as a double (bounds, printing decisions).
template <typename Record>
double FieldValue(const Record& record, const ProfileField<Record>& field) {
  return std::visit(
      [&](auto member) { return static_cast<double>(record.*member); },
      field.member);
}

// Sets a field from a double, converted to the member's type.
template <typename Record>
void SetFieldValue(const ProfileField<Record>& field, double value,
                   Record* record) {
  std::visit(
      [&](auto member) {
        using T = std::remove_reference_t<decltype(record->*member)>;
        record->*member = static_cast<T>(value);
      },
      field.member);
}

// Copies one field from `from` into `to`.
template <typename Record>
void CopyField(const Record& from, const ProfileField<Record>& field,
               Record* to) {
  std::visit([&](auto member) { to->*member = from.*member; }, field.member);
}

// True when every field in `fields` is equal in both (doubles bit for bit
// but for NaN, which never equals).
template <typename Record>
bool FieldsEqual(const Record& a, const Record& b,
                 absl::Span<const ProfileField<Record>> fields) {
  for (const ProfileField<Record>& f : fields) {
    const bool equal = std::visit(
        [&](auto member) { return a.*member == b.*member; }, f.member);
    if (!equal) return false;
  }
  return true;
}

// The first field of `record` outside its bounds, or null.
template <typename Record>
const ProfileField<Record>* FirstOutOfBounds(
    const Record& record, absl::Span<const ProfileField<Record>> fields) {
  for (const ProfileField<Record>& f : fields) {
    if (!f.bounds.Admits(FieldValue(record, f))) return &f;
  }
  return nullptr;
}

// Folds `theirs` (another rank's record of the same window) into `mine`
// by each field's Combine; kOwnRule fields are left to the caller.
template <typename Record>
void CombineFields(const Record& theirs,
                   absl::Span<const ProfileField<Record>> fields,
                   Record* mine) {
  bool faster_pace = false;
  for (const ProfileField<Record>& f : fields) {
    if (f.combine == Combine::kPace) {
      faster_pace = faster_pace || FieldValue(theirs, f) > FieldValue(*mine, f);
    }
  }
  for (const ProfileField<Record>& f : fields) {
    const double t = FieldValue(theirs, f);
    const double m = FieldValue(*mine, f);
    switch (f.combine) {
      case Combine::kFirst:
      case Combine::kOwnRule:
        break;
      case Combine::kMax:
        if (t > m) CopyField(theirs, f, mine);
        break;
      case Combine::kMinPositive:
        if (t > 0 && (m <= 0 || t < m)) CopyField(theirs, f, mine);
        break;
      case Combine::kPace:
      case Combine::kWithPace:
        if (faster_pace) CopyField(theirs, f, mine);
        break;
    }
  }
}

}  // namespace tandem

#endif  // TANDEM_COMMON_IR_PROFILE_FIELDS_H_
