#include "worker/spec/job_spec_yaml.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job/job_spec.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "yaml-cpp/yaml.h"

namespace tandem {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

std::string Where(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.line < 0) return "";
  return absl::StrCat(" (line ", mark.line + 1, ")");
}

absl::Status FieldError(const std::string& path, const YAML::Node& node,
                        absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": ", problem, Where(node)));
}

absl::Status ExpectScalar(const std::string& path, const YAML::Node& node,
                          absl::string_view what) {
  if (node.IsScalar()) return absl::OkStatus();
  return FieldError(path, node,
                    absl::StrCat("expected ", what, ", got a ",
                                 node.IsMap()        ? "mapping"
                                 : node.IsSequence() ? "list"
                                                     : "null value"));
}

// Byte counts: an integer, optionally with a binary suffix.
bool ParseBytes(std::string text, int64_t* out) {
  static constexpr std::pair<const char*, int> kSuffixes[] = {
      {"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}};
  int shift = 0;
  for (const auto& [suffix, bits] : kSuffixes) {
    if (absl::EndsWith(text, suffix)) {
      text.resize(text.size() - std::string(suffix).size());
      shift = bits;
      break;
    }
  }
  absl::string_view number = absl::StripAsciiWhitespace(text);
  int64_t whole = 0;
  if (absl::SimpleAtoi(number, &whole)) {
    if (whole < 0 || whole > (std::numeric_limits<int64_t>::max() >> shift)) {
      return false;
    }
    *out = whole << shift;
    return true;
  }
  double fraction = 0;
  if (shift == 0 || !absl::SimpleAtod(number, &fraction) ||
      !std::isfinite(fraction) || fraction < 0) {
    return false;
  }
  const double value = std::ldexp(fraction, shift);
  if (value != std::floor(value) || value > 9.2e18) return false;
  *out = static_cast<int64_t>(value);
  return true;
}

absl::Status SetScalar(Message& msg, const FieldDescriptor* field,
                       const std::string& path, const YAML::Node& node,
                       bool repeated) {
  const Reflection* r = msg.GetReflection();
  RETURN_IF_ERROR(ExpectScalar(path, node, "a value"));
  const std::string text = node.Scalar();
  auto bad = [&](absl::string_view what) {
    return FieldError(path, node,
                      absl::StrCat("expected ", what, ", got '", text, "'"));
  };
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      repeated ? r->AddString(&msg, field, text)
               : r->SetString(&msg, field, text);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_INT32: {
      int32_t v = 0;
      if (!absl::SimpleAtoi(text, &v)) return bad("a 32-bit integer");
      repeated ? r->AddInt32(&msg, field, v) : r->SetInt32(&msg, field, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t v = 0;
      const bool bytes = absl::EndsWith(field->name(), "bytes");
      if (bytes ? !ParseBytes(text, &v) : !absl::SimpleAtoi(text, &v)) {
        return bad(bytes ? "a byte count (e.g. 1073741824 or 1GiB)"
                         : "an integer");
      }
      repeated ? r->AddInt64(&msg, field, v) : r->SetInt64(&msg, field, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t v = 0;
      if (!absl::SimpleAtoi(text, &v)) return bad("a non-negative integer");
      repeated ? r->AddUInt64(&msg, field, v) : r->SetUInt64(&msg, field, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      double v = 0;
      if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
        return bad("a finite number");
      }
      repeated ? r->AddDouble(&msg, field, v) : r->SetDouble(&msg, field, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      const std::string v = absl::AsciiStrToLower(text);
      bool b;
      if (v == "true" || v == "yes" || v == "on") {
        b = true;
      } else if (v == "false" || v == "no" || v == "off") {
        b = false;
      } else {
        return bad("true or false");
      }
      repeated ? r->AddBool(&msg, field, b) : r->SetBool(&msg, field, b);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      // DType: f32, bf16, f16 (or the proto names).
      const std::string upper = absl::AsciiStrToUpper(text);
      const auto* value = field->enum_type()->FindValueByName(upper);
      if (value == nullptr) {
        value =
            field->enum_type()->FindValueByName(absl::StrCat("DTYPE_", upper));
      }
      if (value == nullptr || value->number() == 0) {
        return bad("one of f32, bf16, f16");
      }
      repeated ? r->AddEnumValue(&msg, field, value->number())
               : r->SetEnumValue(&msg, field, value->number());
      return absl::OkStatus();
    }
    default:
      return FieldError(path, node, "unsupported field type");
  }
}

absl::Status FillMessage(Message& msg, const YAML::Node& node,
                         const std::string& path) {
  if (!node.IsMap()) {
    return FieldError(path.empty() ? "spec" : path, node,
                      "expected a mapping of keys to values");
  }
  const auto* descriptor = msg.GetDescriptor();
  for (const auto& item : node) {
    const std::string key = item.first.as<std::string>();
    const std::string field_path = path.empty() ? key : path + "." + key;
    const FieldDescriptor* field = descriptor->FindFieldByName(key);
    if (field == nullptr) {
      std::vector<std::string> names;
      for (int i = 0; i < descriptor->field_count(); ++i) {
        names.push_back(descriptor->field(i)->name());
      }
      return FieldError(field_path, item.first,
                        absl::StrCat("unknown key (expected one of ",
                                     absl::StrJoin(names, ", "), ")"));
    }
    const YAML::Node& value = item.second;
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      RETURN_IF_ERROR(
          FillMessage(*msg.GetReflection()->MutableMessage(&msg, field), value,
                      field_path));
    } else if (field->is_repeated()) {
      if (value.IsScalar()) {  // a single item
        RETURN_IF_ERROR(SetScalar(msg, field, field_path, value, true));
        continue;
      }
      if (!value.IsSequence()) {
        return FieldError(field_path, value, "expected a list");
      }
      for (size_t i = 0; i < value.size(); ++i) {
        RETURN_IF_ERROR(SetScalar(
            msg, field, absl::StrCat(field_path, "[", i, "]"), value[i], true));
      }
    } else if (!value.IsNull()) {
      RETURN_IF_ERROR(SetScalar(msg, field, field_path, value, false));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec is not valid YAML: ", e.what()));
  }
  v1::JobSpec spec;
  if (root.IsNull()) {
    return absl::InvalidArgumentError("job spec is empty");
  }
  try {
    RETURN_IF_ERROR(FillMessage(spec, root, ""));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: ", e.what()));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> LoadJobSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read job spec '", path, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(text.str());
  if (!spec.ok()) {
    return absl::Status(spec.status().code(),
                        absl::StrCat(path, ": ", spec.status().message()));
  }
  // Relative file paths are relative to the spec file, as the client
  // resolves them (client/README.md).
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "" : path.substr(0, slash + 1);
  auto resolve = [&](std::string* value) {
    if (!value->empty() && (*value)[0] != '/' && !dir.empty()) {
      *value = absl::StrCat(dir, *value);
    }
  };
  resolve(spec->mutable_model()->mutable_path());
  resolve(spec->mutable_model()->mutable_init_from());
  resolve(spec->mutable_data()->mutable_path());
  resolve(spec->mutable_checkpoint()->mutable_dir());
  ApplyJobSpecDefaults(*spec);
  absl::Status valid = ValidateJobSpec(*spec);
  if (!valid.ok()) {
    return absl::Status(valid.code(),
                        absl::StrCat(path, ": ", valid.message()));
  }
  return spec;
}

}  // namespace tandem
