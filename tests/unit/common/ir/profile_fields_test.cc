// The profile field tables (common/ir/profile_fields.h) against the proto
// and against every walker: each measured field converts, prints, parses,
// compares and validates through its table line alone, and every proto
// field is either in a table or named here as the record's identity.
#include "common/ir/profile_fields.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <variant>

#include "common/ir/proto_convert.h"
#include "common/ir/text_format.h"
#include "common/ir/validate.h"
#include "google/protobuf/descriptor.h"
#include "tests/unit/common/test_graphs.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using testing::TwoLayerGraph;
using testing::TwoLayerProfile;

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

template <typename Record>
FieldDescriptor::CppType MemberCppType(const ProfileField<Record>& f) {
  return std::visit(
      [](auto member) {
        using T =
            std::remove_reference_t<decltype(std::declval<Record&>().*member)>;
        if constexpr (std::is_same_v<T, int32_t>) {
          return FieldDescriptor::CPPTYPE_INT32;
        } else if constexpr (std::is_same_v<T, int64_t>) {
          return FieldDescriptor::CPPTYPE_INT64;
        } else {
          return FieldDescriptor::CPPTYPE_DOUBLE;
        }
      },
      f.member);
}

// Every field of `type` is in `fields` or in `identity` (what the record's
// own code handles: ids, kinds, nested and repeated fields); every table
// line names a singular proto field of its member's type; keys are unique.
template <typename Record>
void ExpectTableCoversMessage(const Descriptor* type,
                              absl::Span<const ProfileField<Record>> fields,
                              const std::set<std::string>& identity) {
  std::set<std::string> in_table;
  std::set<std::string> keys;
  for (const ProfileField<Record>& f : fields) {
    const std::string name(f.proto_name);
    EXPECT_TRUE(in_table.insert(name).second)
        << type->name() << "." << name << " is in the table twice";
    EXPECT_TRUE(keys.insert(std::string(f.key)).second)
        << type->name() << ": text key '" << f.key << "' is used twice";
    EXPECT_FALSE(f.what.empty()) << type->name() << "." << name;
    const FieldDescriptor* d = type->FindFieldByName(name);
    ASSERT_NE(d, nullptr) << "the table names " << type->name() << "." << name
                          << ", which tandem.v1 lacks";
    EXPECT_FALSE(d->is_repeated()) << type->name() << "." << name;
    EXPECT_EQ(d->cpp_type(), MemberCppType(f))
        << type->name() << "." << name
        << ": the IR member and the proto field differ in type";
    EXPECT_EQ(identity.count(name), 0u) << type->name() << "." << name;
  }
  for (int i = 0; i < type->field_count(); ++i) {
    const std::string name = type->field(i)->name();
    EXPECT_TRUE(in_table.count(name) + identity.count(name) == 1)
        << type->name() << "." << name
        << " is in the proto but in no profile field table: add its line "
           "to the table in common/ir/profile.cc (or, when it is part of "
           "the record's identity, to this test's list)";
  }
}

TEST(ProfileFieldsTest, Tables_CoverEveryProtoField) {
  ExpectTableCoversMessage(
      v1::Profile::descriptor(), ProfileHeaderFields(),
      {"graph_hash", "rank", "schedule_version", "first_iteration",
       "last_iteration", "nodes", "collectives", "memory", "allgather_scratch",
       "reduce_scatter_scratch"});
  ExpectTableCoversMessage(v1::NodeTiming::descriptor(), NodeTimingFields(),
                           {"node_id"});
  ExpectTableCoversMessage(v1::CollectiveTiming::descriptor(),
                           CollectiveTimingFields(),
                           {"kind", "group_id", "param_ids", "node_id"});
  ExpectTableCoversMessage(v1::MemorySample::descriptor(), MemorySampleFields(),
                           {"node_id"});
}

// The record of TwoLayerProfile a table's field is set on.
Profile& Target(Profile& p, const ProfileField<Profile>*) { return p; }
NodeTiming& Target(Profile& p, const ProfileField<NodeTiming>*) {
  return p.nodes[1];
}
CollectiveTiming& Target(Profile& p, const ProfileField<CollectiveTiming>*) {
  return p.collectives[0];
}
MemorySample& Target(Profile& p, const ProfileField<MemorySample>*) {
  return p.memory[0];
}

// A value inside the field's bounds, not 0, and one no walker could
// confuse with TwoLayerProfile's (times are below its collectives' 2 ms so
// that exposed and computing stay within issue-to-done).
template <typename Record>
double InBounds(const ProfileField<Record>& f) {
  if (f.bounds.lo > 0) return (f.bounds.lo + f.bounds.hi) / 2;
  return MemberCppType(f) == FieldDescriptor::CPPTYPE_DOUBLE ? 0.00123 : 12345;
}

template <typename Record>
void ExpectEveryFieldWalks(absl::Span<const ProfileField<Record>> fields) {
  const Graph g = TwoLayerGraph();
  for (const ProfileField<Record>& f : fields) {
    SCOPED_TRACE(std::string(f.proto_name));
    const Profile base = TwoLayerProfile(g);
    Profile changed = base;
    SetFieldValue(f, InBounds(f), &Target(changed, &f));
    // Equality sees it.
    EXPECT_NE(changed, base);
    // The proto carries it, on the wire too.
    const v1::Profile proto = ToProto(changed);
    std::string wire;
    ASSERT_TRUE(proto.SerializeToString(&wire));
    v1::Profile parsed_proto;
    ASSERT_TRUE(parsed_proto.ParseFromString(wire));
    absl::StatusOr<Profile> from_proto = FromProto(parsed_proto);
    ASSERT_TRUE(from_proto.ok()) << from_proto.status();
    EXPECT_EQ(*from_proto, changed);
    // The text form prints and reads it.
    const std::string text = PrintProfile(changed);
    if (!f.positional) {
      EXPECT_THAT(text, HasSubstr(absl::StrCat(" ", f.key, "=")));
    }
    absl::StatusOr<Profile> from_text = ParseProfile(text);
    ASSERT_TRUE(from_text.ok()) << from_text.status() << "\n" << text;
    EXPECT_EQ(*from_text, changed) << text;
    // Validation admits it, and refuses it out of bounds, naming the key.
    const absl::Status valid = ValidateProfile(changed, g);
    EXPECT_TRUE(valid.ok()) << valid;
    if (MemberCppType(f) != FieldDescriptor::CPPTYPE_DOUBLE &&
        !std::isfinite(f.bounds.lo)) {
      continue;  // an integer with no lower bound has no bad value
    }
    Profile bad = base;
    SetFieldValue(f,
                  f.bounds.lo > 0 ? f.bounds.lo / 2
                  : std::isfinite(f.bounds.lo)
                      ? f.bounds.lo - 1
                      : std::numeric_limits<double>::quiet_NaN(),
                  &Target(bad, &f));
    const absl::Status refused = ValidateProfile(bad, g);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat(f.key, " is ")));
  }
}

TEST(ProfileFieldsTest, EveryHeaderField_ConvertsPrintsComparesValidates) {
  ExpectEveryFieldWalks(ProfileHeaderFields());
}
TEST(ProfileFieldsTest, EveryNodeField_ConvertsPrintsComparesValidates) {
  ExpectEveryFieldWalks(NodeTimingFields());
}
TEST(ProfileFieldsTest, EveryCollectiveField_ConvertsPrintsComparesValidates) {
  ExpectEveryFieldWalks(CollectiveTimingFields());
}
TEST(ProfileFieldsTest, EveryMemoryField_ConvertsPrintsComparesValidates) {
  ExpectEveryFieldWalks(MemorySampleFields());
}

TEST(ProfileFieldsTest, Bounds_AdmitZeroOnlyWhenNotMeasuredIsAllowed) {
  constexpr FieldBounds stretch{1, 4, true, "1 to 4 (0: not measured)"};
  EXPECT_TRUE(stretch.Admits(0));
  EXPECT_TRUE(stretch.Admits(1));
  EXPECT_TRUE(stretch.Admits(4));
  EXPECT_FALSE(stretch.Admits(0.5));
  EXPECT_FALSE(stretch.Admits(4.5));
  EXPECT_FALSE(stretch.Admits(std::nan("")));
  EXPECT_FALSE(kNonNegative.Admits(-1e-300));
  EXPECT_FALSE(kNonNegative.Admits(std::numeric_limits<double>::infinity()));
  EXPECT_TRUE(kAnyFinite.Admits(-5));
}

}  // namespace
}  // namespace tandem
