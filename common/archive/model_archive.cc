#include "common/archive/model_archive.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace tandem {
namespace {

constexpr size_t kMaxListedProblems = 8;

class Problems {
 public:
  void Add(std::string problem) { problems_.push_back(std::move(problem)); }
  absl::Status ToStatus(absl::string_view what) const {
    if (problems_.empty()) return absl::OkStatus();
    std::vector<std::string> shown(
        problems_.begin(),
        problems_.begin() + std::min(problems_.size(), kMaxListedProblems));
    std::string more;
    if (problems_.size() > kMaxListedProblems) {
      more = absl::StrCat("; and ", problems_.size() - kMaxListedProblems,
                          " more");
    }
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", absl::StrJoin(shown, "; "), more,
                     "; export the model again (tandem export)"));
  }

 private:
  std::vector<std::string> problems_;
};

template <typename Shape>
void CheckShape(const Shape& shape, const std::string& field,
                Problems& problems) {
  for (int i = 0; i < shape.size(); ++i) {
    if (shape[i] <= 0) {
      problems.Add(absl::StrCat(field, ".shape[", i, "] is ", shape[i],
                                "; dimensions must be positive"));
    }
  }
}

void CheckDType(const std::string& dtype, const std::string& field,
                Problems& problems) {
  if (DTypeElementBytes(dtype) == 0) {
    problems.Add(absl::StrCat(field, ".dtype '", dtype,
                              "' is not a dtype Tandem knows (float32, "
                              "float64, float16, bfloat16, int64, int32, "
                              "int16, int8, uint8, bool)"));
  }
}

// The units listed by a param or buffer must be exactly those whose
// params/buffers name it, in execution order.
void CheckUsers(const google::protobuf::RepeatedPtrField<std::string>& listed,
                const std::vector<int>& actual, const v1::ArchiveManifest& m,
                const std::string& field, Problems& problems) {
  std::vector<std::string> want;
  for (int u : actual) want.push_back(m.units(u).name());
  const std::vector<std::string> have(listed.begin(), listed.end());
  if (have != want) {
    problems.Add(absl::StrCat(field, ".units is [", absl::StrJoin(have, ", "),
                              "], but the units using it are [",
                              absl::StrJoin(want, ", "), "]"));
  }
}

}  // namespace

absl::Status ValidateArchiveManifest(const v1::ArchiveManifest& m) {
  if (m.format_version() != kArchiveFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "archive format_version ", m.format_version(),
        " is not one this Tandem reads (it reads ", kArchiveFormatVersion,
        "); export the model with the tandem client of this release"));
  }
  Problems problems;
  absl::flat_hash_set<std::string> values;  // defined so far
  for (int i = 0; i < m.inputs_size(); ++i) {
    const v1::ArchiveInput& in = m.inputs(i);
    const std::string field = absl::StrCat("inputs[", i, "]");
    if (in.name().empty()) problems.Add(field + ".name is empty");
    if (!values.insert(in.name()).second) {
      problems.Add(
          absl::StrCat(field, ".name '", in.name(), "' is declared twice"));
    }
    CheckDType(in.dtype(), field, problems);
    CheckShape(in.shape(), field, problems);
    for (int32_t d : in.dynamic_dims()) {
      if (d < 0 || d >= in.shape_size()) {
        problems.Add(absl::StrCat(field, ".dynamic_dims has ", d, ", but '",
                                  in.name(), "' has ", in.shape_size(),
                                  " dimensions"));
      }
    }
    if (!in.role().empty() && in.role() != "tokens" && in.role() != "targets") {
      problems.Add(absl::StrCat(field, ".role '", in.role(),
                                "' is not \"tokens\", \"targets\" or \"\""));
    }
  }
  absl::flat_hash_map<std::string, int> param_index;
  for (int i = 0; i < m.params_size(); ++i) {
    const v1::ArchiveParam& p = m.params(i);
    const std::string field = absl::StrCat("params[", i, "]");
    if (p.name().empty()) problems.Add(field + ".name is empty");
    if (!param_index.emplace(p.name(), i).second) {
      problems.Add(
          absl::StrCat(field, ".name '", p.name(), "' is declared twice"));
    }
    CheckDType(p.dtype(), field, problems);
    CheckShape(p.shape(), field, problems);
  }
  absl::flat_hash_map<std::string, int> buffer_index;
  for (int i = 0; i < m.buffers_size(); ++i) {
    const v1::ArchiveBuffer& b = m.buffers(i);
    const std::string field = absl::StrCat("buffers[", i, "]");
    if (b.name().empty()) problems.Add(field + ".name is empty");
    if (param_index.contains(b.name()) ||
        !buffer_index.emplace(b.name(), i).second) {
      problems.Add(
          absl::StrCat(field, ".name '", b.name(), "' is declared twice"));
    }
    CheckDType(b.dtype(), field, problems);
    CheckShape(b.shape(), field, problems);
  }
  if (m.units_size() == 0) problems.Add("units is empty");
  std::vector<std::vector<int>> param_users(m.params_size());
  std::vector<std::vector<int>> buffer_users(m.buffers_size());
  // Per unit, the glue covering it (-1: none). Glues cover disjoint runs of
  // units in order; a covered unit's values are the glue's own.
  std::vector<int> glue_of(m.units_size(), -1);
  for (int g = 0; g < m.glues_size(); ++g) {
    const v1::ArchiveGlue& glue = m.glues(g);
    const std::string field = absl::StrCat("glues[", g, "]");
    if (glue.name().empty()) problems.Add(field + ".name is empty");
    if (glue.file().empty()) problems.Add(field + ".file is empty");
    if (glue.outputs_size() == 0) {
      problems.Add(
          absl::StrCat(field, " (glue '", glue.name(), "') has no outputs"));
    }
    if (glue.unit_count() < 1 || glue.first_unit() < 0 ||
        glue.first_unit() + static_cast<int64_t>(glue.unit_count()) >
            m.units_size()) {
      problems.Add(absl::StrCat(
          field, " (glue '", glue.name(), "') covers units [",
          glue.first_unit(), ", ",
          static_cast<int64_t>(glue.first_unit()) + glue.unit_count(),
          "), which are not among the ", m.units_size(), " units"));
      continue;
    }
    for (int u = glue.first_unit(); u < glue.first_unit() + glue.unit_count();
         ++u) {
      if (glue_of[u] >= 0) {
        problems.Add(absl::StrCat(field, " (glue '", glue.name(),
                                  "') covers unit ", u, ", which glues[",
                                  glue_of[u], "] covers already"));
      } else {
        glue_of[u] = g;
      }
    }
    if (g > 0 && m.glues(g - 1).first_unit() >= glue.first_unit()) {
      problems.Add(absl::StrCat(field, " (glue '", glue.name(),
                                "') is listed before a glue over earlier "
                                "units; list glues in unit order"));
    }
  }
  absl::flat_hash_set<std::string> unit_names;
  absl::flat_hash_set<std::string> local_values;
  for (int u = 0; u < m.units_size(); ++u) {
    const v1::ArchiveUnit& unit = m.units(u);
    const std::string field = absl::StrCat("units[", u, "]");
    const int g = glue_of[u];
    if (g >= 0 && m.glues(g).first_unit() == u) {
      const v1::ArchiveGlue& glue = m.glues(g);
      local_values.clear();
      for (int i = 0; i < glue.inputs_size(); ++i) {
        if (!values.contains(glue.inputs(i))) {
          problems.Add(absl::StrCat(
              "glues[", g, "].inputs[", i, "] '", glue.inputs(i), "' (glue '",
              glue.name(),
              "') is neither a batch input nor an output of an earlier unit"));
        }
      }
    }
    if (unit.name().empty()) problems.Add(field + ".name is empty");
    if (!unit_names.insert(unit.name()).second) {
      problems.Add(
          absl::StrCat(field, ".name '", unit.name(), "' is used twice"));
    }
    if (unit.file().empty()) problems.Add(field + ".file is empty");
    for (int i = 0; i < unit.inputs_size(); ++i) {
      if (g < 0 && !values.contains(unit.inputs(i))) {
        problems.Add(absl::StrCat(
            field, ".inputs[", i, "] '", unit.inputs(i), "' (unit '",
            unit.name(),
            "') is neither a batch input nor an output of an earlier unit"));
      }
    }
    if (unit.outputs_size() == 0) {
      problems.Add(
          absl::StrCat(field, " (unit '", unit.name(), "') has no outputs"));
    }
    for (int i = 0; i < unit.outputs_size(); ++i) {
      if (unit.outputs(i).empty()) {
        problems.Add(absl::StrCat(field, ".outputs[", i, "] is empty"));
      } else if (!(g < 0 ? values : local_values)
                      .insert(unit.outputs(i))
                      .second) {
        problems.Add(absl::StrCat(field, ".outputs[", i, "] '", unit.outputs(i),
                                  "' (unit '", unit.name(),
                                  "') redefines a value defined earlier"));
      }
    }
    absl::flat_hash_set<std::string> seen;
    for (int i = 0; i < unit.params_size(); ++i) {
      auto it = param_index.find(unit.params(i));
      if (it == param_index.end()) {
        problems.Add(absl::StrCat(field, ".params[", i, "] '", unit.params(i),
                                  "' is not declared in params"));
      } else if (!seen.insert(unit.params(i)).second) {
        problems.Add(absl::StrCat(field, ".params[", i, "] '", unit.params(i),
                                  "' is listed twice"));
      } else {
        param_users[it->second].push_back(u);
      }
    }
    for (int i = 0; i < unit.buffers_size(); ++i) {
      auto it = buffer_index.find(unit.buffers(i));
      if (it == buffer_index.end()) {
        problems.Add(absl::StrCat(field, ".buffers[", i, "] '", unit.buffers(i),
                                  "' is not declared in buffers"));
      } else if (!seen.insert(unit.buffers(i)).second) {
        problems.Add(absl::StrCat(field, ".buffers[", i, "] '", unit.buffers(i),
                                  "' is listed twice"));
      } else {
        buffer_users[it->second].push_back(u);
      }
    }
    if (g >= 0 && m.glues(g).first_unit() + m.glues(g).unit_count() - 1 == u) {
      const v1::ArchiveGlue& glue = m.glues(g);
      for (int i = 0; i < glue.outputs_size(); ++i) {
        if (glue.outputs(i).empty()) {
          problems.Add(
              absl::StrCat("glues[", g, "].outputs[", i, "] is empty"));
        } else if (!values.insert(glue.outputs(i)).second) {
          problems.Add(absl::StrCat("glues[", g, "].outputs[", i, "] '",
                                    glue.outputs(i), "' (glue '", glue.name(),
                                    "') redefines a value defined earlier"));
        }
      }
    }
  }
  for (int i = 0; i < m.params_size(); ++i) {
    CheckUsers(m.params(i).units(), param_users[i], m,
               absl::StrCat("params[", i, "] '", m.params(i).name(), "'"),
               problems);
  }
  for (int i = 0; i < m.buffers_size(); ++i) {
    CheckUsers(m.buffers(i).units(), buffer_users[i], m,
               absl::StrCat("buffers[", i, "] '", m.buffers(i).name(), "'"),
               problems);
  }
  if (m.units_size() > 0) {
    const v1::ArchiveUnit& last = m.units(m.units_size() - 1);
    const int g = glue_of.back();
    const auto& outputs = g >= 0 ? m.glues(g).outputs() : last.outputs();
    if (std::find(outputs.begin(), outputs.end(), m.loss()) == outputs.end()) {
      problems.Add(absl::StrCat(
          "loss '", m.loss(), "' is not an output of the last unit '",
          last.name(), "'",
          g >= 0 ? absl::StrCat(" or of the glue '", m.glues(g).name(),
                                "' covering it")
                 : ""));
    }
  }
  return problems.ToStatus("the archive manifest is invalid");
}

absl::StatusOr<ModelArchive> OpenModelArchive(const std::string& path) {
  ModelArchive archive;
  ASSIGN_OR_RETURN(archive.zip, ZipReader::Open(path));
  const std::string root = kArchiveRoot;
  ASSIGN_OR_RETURN(std::string json, archive.zip.Read(root + "manifest.json"));
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      json, &archive.manifest, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "': model/manifest.json is not a valid manifest (",
        parsed.message().as_string(),
        "); export the model with the tandem client of this release"));
  }
  const v1::ArchiveManifest& m = archive.manifest;
  absl::Status valid = ValidateArchiveManifest(m);
  if (!valid.ok()) {
    return absl::Status(valid.code(),
                        absl::StrCat("'", path, "': ", valid.message()));
  }
  // Every entry the manifest names has a checksum, and every checksum
  // matches its entry.
  Problems problems;
  std::vector<std::string> needed = {kArchiveWeights};
  for (const v1::ArchiveUnit& u : m.units()) needed.push_back(u.file());
  for (const v1::ArchiveGlue& g : m.glues()) needed.push_back(g.file());
  for (const std::string& entry : needed) {
    if (!m.sha256().contains(entry)) {
      problems.Add(absl::StrCat("sha256 has no checksum for '", entry, "'"));
    }
  }
  RETURN_IF_ERROR(problems.ToStatus(absl::StrCat("'", path, "'")));
  std::string weights;
  for (const auto& [entry, digest] : m.sha256()) {
    absl::StatusOr<std::string> bytes = archive.zip.Read(root + entry);
    if (!bytes.ok()) return bytes.status();
    if (Sha256Hex(*bytes) != digest) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", path, "': entry model/", entry,
          " does not match its sha256 in the manifest (corrupted or edited "
          "after export); export the model again"));
    }
    if (entry == kArchiveWeights) weights = *std::move(bytes);
  }
  ASSIGN_OR_RETURN(archive.weights,
                   ParseSafetensorsHeader(
                       weights, weights.size(),
                       absl::StrCat("'", path, "': model/", kArchiveWeights)));
  auto check_tensor = [&](const std::string& kind, const std::string& name,
                          const auto& shape, const std::string& dtype) {
    const SafetensorsTensor* t = archive.weights.Find(name);
    if (t == nullptr) {
      problems.Add(absl::StrCat(kind, " '", name, "' has no initial value in ",
                                kArchiveWeights));
      return;
    }
    const std::vector<int64_t> want(shape.begin(), shape.end());
    if (t->shape != want || t->dtype != dtype) {
      problems.Add(absl::StrCat(
          kind, " '", name, "' is ", dtype, "[", absl::StrJoin(want, ","),
          "] in the manifest but ", t->dtype, "[", absl::StrJoin(t->shape, ","),
          "] in ", kArchiveWeights));
    }
  };
  for (const v1::ArchiveParam& p : m.params()) {
    check_tensor("param", p.name(), p.shape(), p.dtype());
  }
  for (const v1::ArchiveBuffer& b : m.buffers()) {
    check_tensor("buffer", b.name(), b.shape(), b.dtype());
  }
  RETURN_IF_ERROR(problems.ToStatus(absl::StrCat("'", path, "'")));
  return archive;
}

absl::StatusOr<v1::ArchiveManifest> ReadArchiveManifest(
    const std::string& path) {
  ASSIGN_OR_RETURN(ModelArchive archive, OpenModelArchive(path));
  return std::move(archive.manifest);
}

}  // namespace tandem
