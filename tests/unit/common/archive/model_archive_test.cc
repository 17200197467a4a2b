// The archive reader against archives written here byte by byte: a zip
// writer with zlib's CRC-32 (not the reader's), safetensors headers written
// by hand.
#include "common/archive/model_archive.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job/job_spec.h"
#include "common/sha256.h"
#include "google/protobuf/util/json_util.h"
#include "tests/unit/common/test_safetensors.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

struct Entry {
  std::string name;
  std::string data;
  uint16_t method = 0;  // 0 stored, 8 deflated (only the header says so)
};

void Put16(std::string& s, uint32_t v) {
  s.push_back(static_cast<char>(v & 0xff));
  s.push_back(static_cast<char>((v >> 8) & 0xff));
}
void Put32(std::string& s, uint32_t v) {
  Put16(s, v & 0xffff);
  Put16(s, v >> 16);
}

std::string ZipBytes(const std::vector<Entry>& entries) {
  std::string out;
  std::string directory;
  for (const Entry& e : entries) {
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(e.data.data()),
              static_cast<uInt>(e.data.size())));
    const uint32_t offset = static_cast<uint32_t>(out.size());
    Put32(out, 0x04034b50);
    Put16(out, 20);
    Put16(out, 0);
    Put16(out, e.method);
    Put16(out, 0);
    Put16(out, 0);
    Put32(out, crc);
    Put32(out, static_cast<uint32_t>(e.data.size()));
    Put32(out, static_cast<uint32_t>(e.data.size()));
    Put16(out, static_cast<uint32_t>(e.name.size()));
    Put16(out, 0);
    out += e.name;
    out += e.data;
    Put32(directory, 0x02014b50);
    Put16(directory, 20);
    Put16(directory, 20);
    Put16(directory, 0);
    Put16(directory, e.method);
    Put16(directory, 0);
    Put16(directory, 0);
    Put32(directory, crc);
    Put32(directory, static_cast<uint32_t>(e.data.size()));
    Put32(directory, static_cast<uint32_t>(e.data.size()));
    Put16(directory, static_cast<uint32_t>(e.name.size()));
    Put16(directory, 0);
    Put16(directory, 0);
    Put16(directory, 0);
    Put16(directory, 0);
    Put32(directory, 0);
    Put32(directory, offset);
    directory += e.name;
  }
  const uint32_t directory_offset = static_cast<uint32_t>(out.size());
  out += directory;
  Put32(out, 0x06054b50);
  Put16(out, 0);
  Put16(out, 0);
  Put16(out, static_cast<uint32_t>(entries.size()));
  Put16(out, static_cast<uint32_t>(entries.size()));
  Put32(out, static_cast<uint32_t>(directory.size()));
  Put32(out, directory_offset);
  Put16(out, 0);
  return out;
}

// Two units: embed (tokens -> h) and head (h, targets -> loss), the
// embedding tied between them, a buffer in the head.
v1::ArchiveManifest GoodManifest() {
  v1::ArchiveManifest m;
  m.set_format_version(1);
  m.set_name("Tiny");
  m.set_loss("loss");
  for (const char* name : {"tokens", "targets"}) {
    v1::ArchiveInput* in = m.add_inputs();
    in->set_name(name);
    in->set_dtype("int64");
    in->add_shape(2);
    in->add_shape(4);
    in->add_dynamic_dims(1);
    in->set_role(name);
  }
  v1::ArchiveParam* embed = m.add_params();
  embed->set_name("embed.weight");
  embed->set_dtype("float32");
  embed->add_shape(8);
  embed->add_shape(4);
  embed->set_requires_grad(true);
  embed->add_units("embed");
  embed->add_units("head");
  v1::ArchiveParam* bias = m.add_params();
  bias->set_name("head.bias");
  bias->set_dtype("float32");
  bias->add_shape(8);
  bias->set_requires_grad(true);
  bias->add_units("head");
  v1::ArchiveBuffer* mask = m.add_buffers();
  mask->set_name("head.mask");
  mask->set_dtype("bool");
  mask->add_shape(4);
  mask->add_units("head");
  v1::ArchiveUnit* u0 = m.add_units();
  u0->set_name("embed");
  u0->set_file("units/000.pt");
  u0->add_inputs("tokens");
  u0->add_outputs("h");
  u0->add_params("embed.weight");
  v1::ArchiveUnit* u1 = m.add_units();
  u1->set_name("head");
  u1->set_file("units/001.pt");
  u1->add_inputs("h");
  u1->add_inputs("targets");
  u1->add_outputs("loss");
  u1->add_params("embed.weight");
  u1->add_params("head.bias");
  u1->add_buffers("head.mask");
  return m;
}

std::string GoodWeights() {
  return SafetensorsBytes({{"embed.weight", "F32", {8, 4}, 128},
                           {"head.bias", "F32", {8}, 32},
                           {"head.mask", "BOOL", {4}, 4}});
}

class ModelArchiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = absl::StrCat(
        ::testing::TempDir(), "/archive_", getpid(), "_",
        ::testing::UnitTest::GetInstance()->current_test_info()->name(),
        ".tandem");
  }
  void TearDown() override { std::remove(path_.c_str()); }

  // Writes an archive; `edit` changes the entries after the checksums were
  // computed (to corrupt them), `manifest_edit` the manifest before.
  void Write(
      const std::function<void(v1::ArchiveManifest&)>& manifest_edit = nullptr,
      const std::function<void(std::vector<Entry>&)>& edit = nullptr,
      std::string weights = GoodWeights()) {
    v1::ArchiveManifest m = GoodManifest();
    std::vector<Entry> entries = {{"model/units/000.pt", "unit zero"},
                                  {"model/units/001.pt", "unit one"},
                                  {"model/weights.safetensors", weights}};
    for (const Entry& e : entries) {
      (*m.mutable_sha256())[e.name.substr(6)] = Sha256Hex(e.data);
    }
    if (manifest_edit) manifest_edit(m);
    std::string json;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(m, &json).ok());
    entries.insert(entries.begin(), {"model/manifest.json", json});
    if (edit) edit(entries);
    bytes_ = ZipBytes(entries);
    std::ofstream(path_, std::ios::binary) << bytes_;
  }

  absl::Status OpenStatus() { return OpenModelArchive(path_).status(); }

  std::string path_;
  std::string bytes_;
};

TEST_F(ModelArchiveTest, Open_GoodArchive_ReadsManifestAndWeights) {
  Write();
  absl::StatusOr<ModelArchive> archive = OpenModelArchive(path_);
  ASSERT_TRUE(archive.ok()) << archive.status();
  EXPECT_EQ(archive->manifest.name(), "Tiny");
  EXPECT_EQ(archive->manifest.units_size(), 2);
  EXPECT_EQ(archive->manifest.params(0).units_size(), 2);
  ASSERT_EQ(archive->weights.tensors.size(), 3u);
  const SafetensorsTensor* bias = archive->weights.Find("head.bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->dtype, "float32");
  EXPECT_EQ(bias->shape, std::vector<int64_t>{8});
  EXPECT_EQ(bias->end - bias->begin, 32u);
  absl::StatusOr<std::string> unit = archive->zip.Read("model/units/001.pt");
  ASSERT_TRUE(unit.ok()) << unit.status();
  EXPECT_EQ(*unit, "unit one");
  absl::StatusOr<v1::ArchiveManifest> m = ReadArchiveManifest(path_);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->loss(), "loss");
}

TEST_F(ModelArchiveTest, Open_MissingFile_NotFound) {
  const absl::Status s = OpenStatus();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(path_));
}

TEST_F(ModelArchiveTest, Open_TruncatedFile_SaysTruncated) {
  Write();
  for (size_t keep : {bytes_.size() - 10, bytes_.size() / 2, size_t{12}}) {
    std::ofstream(path_, std::ios::binary | std::ios::trunc)
        << bytes_.substr(0, keep);
    const absl::Status s = OpenStatus();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << keep;
    EXPECT_THAT(s.message(), HasSubstr("truncated")) << keep << ": " << s;
  }
}

TEST_F(ModelArchiveTest, Open_CompressedEntry_SaysEntriesMustBeStored) {
  Write(nullptr, [](std::vector<Entry>& e) { e[1].method = 8; });
  EXPECT_THAT(OpenStatus().message(),
              HasSubstr("re-export: entries must be stored"));
}

TEST_F(ModelArchiveTest, Open_MissingUnitEntry_NamesIt) {
  Write(nullptr, [](std::vector<Entry>& e) { e.erase(e.begin() + 2); });
  const absl::Status s = OpenStatus();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("no entry 'model/units/001.pt'"));
}

TEST_F(ModelArchiveTest, Open_MissingManifest_NamesIt) {
  Write(nullptr, [](std::vector<Entry>& e) { e.erase(e.begin()); });
  EXPECT_THAT(OpenStatus().message(), HasSubstr("model/manifest.json"));
}

TEST_F(ModelArchiveTest, Open_BadChecksum_NamesEntry) {
  Write(nullptr, [](std::vector<Entry>& e) { e[1].data = "unit 0ero"; });
  const absl::Status s = OpenStatus();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model/units/000.pt does not match its "
                                     "sha256"));
}

TEST_F(ModelArchiveTest, Open_ChecksumMissing_NamesEntry) {
  Write([](v1::ArchiveManifest& m) {
    m.mutable_sha256()->erase("units/001.pt");
  });
  EXPECT_THAT(OpenStatus().message(),
              HasSubstr("no checksum for 'units/001.pt'"));
}

TEST_F(ModelArchiveTest, Open_CorruptedBytes_FailsCrc) {
  Write();
  bytes_[bytes_.find("unit one")] = 'U';
  std::ofstream(path_, std::ios::binary | std::ios::trunc) << bytes_;
  EXPECT_THAT(OpenStatus().message(), HasSubstr("CRC-32"));
}

TEST_F(ModelArchiveTest, Open_UnknownVersion_Refused) {
  Write([](v1::ArchiveManifest& m) { m.set_format_version(2); });
  EXPECT_THAT(OpenStatus().message(),
              HasSubstr("format_version 2 is not one this Tandem reads"));
}

TEST_F(ModelArchiveTest, Open_UnknownManifestField_Refused) {
  Write(nullptr, [](std::vector<Entry>& e) {
    e[0].data.insert(1, "\"futureField\":1,");
  });
  EXPECT_THAT(OpenStatus().message(), HasSubstr("not a valid manifest"));
}

TEST_F(ModelArchiveTest, Open_WeightsMissingParam_NamesIt) {
  Write(nullptr, nullptr,
        SafetensorsBytes({{"embed.weight", "F32", {8, 4}, 128},
                          {"head.mask", "BOOL", {4}, 4}}));
  EXPECT_THAT(OpenStatus().message(),
              HasSubstr("param 'head.bias' has no initial value"));
}

TEST_F(ModelArchiveTest, Open_WeightsShapeDiffers_NamesBoth) {
  Write(nullptr, nullptr,
        SafetensorsBytes({{"embed.weight", "F32", {4, 8}, 128},
                          {"head.bias", "F32", {8}, 32},
                          {"head.mask", "BOOL", {4}, 4}}));
  EXPECT_THAT(OpenStatus().message(),
              HasSubstr("'embed.weight' is float32[8,4] in the manifest but "
                        "float32[4,8]"));
}

// Structural checks, field by field.
struct Malformed {
  const char* name;
  std::function<void(v1::ArchiveManifest&)> edit;
  const char* message;
};

TEST(ValidateArchiveManifestTest, Good_Passes) {
  EXPECT_TRUE(ValidateArchiveManifest(GoodManifest()).ok());
}

TEST(ValidateArchiveManifestTest, EachMalformedCase_NamesTheField) {
  const std::vector<Malformed> cases = {
      {"value used before it is defined",
       [](v1::ArchiveManifest& m) { m.mutable_units(0)->set_inputs(0, "h"); },
       "units[0].inputs[0] 'h' (unit 'embed') is neither a batch input nor "
       "an output of an earlier unit"},
      {"output redefined",
       [](v1::ArchiveManifest& m) {
         m.mutable_units(1)->set_outputs(0, "h");
         m.set_loss("h");
       },
       "units[1].outputs[0] 'h' (unit 'head') redefines a value"},
      {"output shadows an input",
       [](v1::ArchiveManifest& m) {
         m.mutable_units(0)->set_outputs(0, "tokens");
       },
       "units[0].outputs[0] 'tokens'"},
      {"undeclared param",
       [](v1::ArchiveManifest& m) { m.mutable_units(1)->add_params("w"); },
       "units[1].params[2] 'w' is not declared in params"},
      {"undeclared buffer",
       [](v1::ArchiveManifest& m) { m.mutable_units(0)->add_buffers("b"); },
       "units[0].buffers[0] 'b' is not declared in buffers"},
      {"param units disagree",
       [](v1::ArchiveManifest& m) {
         m.mutable_params(0)->mutable_units()->RemoveLast();
       },
       "params[0] 'embed.weight'.units is [embed], but the units using it "
       "are [embed, head]"},
      {"param units out of order",
       [](v1::ArchiveManifest& m) {
         m.mutable_params(0)->set_units(0, "head");
         m.mutable_params(0)->set_units(1, "embed");
       },
       "units is [head, embed]"},
      {"buffer units disagree",
       [](v1::ArchiveManifest& m) {
         m.mutable_buffers(0)->set_units(0, "embed");
       },
       "buffers[0] 'head.mask'.units is [embed]"},
      {"loss not from the last unit",
       [](v1::ArchiveManifest& m) { m.set_loss("h"); },
       "loss 'h' is not an output of the last unit 'head'"},
      {"non-positive shape",
       [](v1::ArchiveManifest& m) { m.mutable_params(1)->set_shape(0, 0); },
       "params[1].shape[0] is 0; dimensions must be positive"},
      {"unknown dtype",
       [](v1::ArchiveManifest& m) { m.mutable_params(1)->set_dtype("float8"); },
       "params[1].dtype 'float8' is not a dtype Tandem knows"},
      {"dynamic dim out of range",
       [](v1::ArchiveManifest& m) { m.mutable_inputs(0)->add_dynamic_dims(2); },
       "inputs[0].dynamic_dims has 2"},
      {"unknown role",
       [](v1::ArchiveManifest& m) { m.mutable_inputs(1)->set_role("labels"); },
       "inputs[1].role 'labels'"},
      {"duplicate param",
       [](v1::ArchiveManifest& m) { *m.add_params() = m.params(1); },
       "params[2].name 'head.bias' is declared twice"},
      {"duplicate unit name",
       [](v1::ArchiveManifest& m) { m.mutable_units(1)->set_name("embed"); },
       "units[1].name 'embed' is used twice"},
      {"no units", [](v1::ArchiveManifest& m) { m.clear_units(); },
       "units is empty"},
  };
  for (const Malformed& c : cases) {
    v1::ArchiveManifest m = GoodManifest();
    c.edit(m);
    const absl::Status s = ValidateArchiveManifest(m);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.name << ": " << s;
  }
}

// GoodManifest with its embed unit run by a glue: the glue reads the tokens
// and defines h; the unit it covers takes and returns values of its own.
v1::ArchiveManifest GluedManifest() {
  v1::ArchiveManifest m = GoodManifest();
  v1::ArchiveGlue* g = m.add_glues();
  g->set_name("encoder");
  g->set_file("glue/000.pt");
  g->set_first_unit(0);
  g->set_unit_count(1);
  g->add_inputs("tokens");
  g->add_outputs("h");
  m.mutable_units(0)->set_inputs(0, "embed/in0");
  m.mutable_units(0)->set_outputs(0, "embed/out0");
  return m;
}

TEST(ValidateArchiveManifestTest, Glue_Passes) {
  EXPECT_TRUE(ValidateArchiveManifest(GluedManifest()).ok())
      << ValidateArchiveManifest(GluedManifest());
  // The loss may come from a glue covering the last unit.
  v1::ArchiveManifest last = GluedManifest();
  v1::ArchiveGlue* g = last.add_glues();
  g->set_name("top");
  g->set_file("glue/001.pt");
  g->set_first_unit(1);
  g->set_unit_count(1);
  g->add_inputs("h");
  g->add_inputs("targets");
  g->add_outputs("loss");
  last.mutable_units(1)->set_outputs(0, "head/out0");
  EXPECT_TRUE(ValidateArchiveManifest(last).ok())
      << ValidateArchiveManifest(last);
}

TEST(ValidateArchiveManifestTest, MalformedGlue_NamesTheField) {
  const std::vector<Malformed> cases = {
      {"range beyond the units",
       [](v1::ArchiveManifest& m) { m.mutable_glues(0)->set_unit_count(3); },
       "glues[0] (glue 'encoder') covers units [0, 3), which are not among "
       "the 2 units"},
      {"empty range",
       [](v1::ArchiveManifest& m) { m.mutable_glues(0)->set_unit_count(0); },
       "glues[0] (glue 'encoder') covers units [0, 0)"},
      {"overlapping glues",
       [](v1::ArchiveManifest& m) { *m.add_glues() = m.glues(0); },
       "glues[1] (glue 'encoder') covers unit 0, which glues[0] covers "
       "already"},
      {"input not defined",
       [](v1::ArchiveManifest& m) { m.mutable_glues(0)->set_inputs(0, "x"); },
       "glues[0].inputs[0] 'x' (glue 'encoder') is neither a batch input"},
      {"output redefines a value",
       [](v1::ArchiveManifest& m) {
         m.mutable_glues(0)->set_outputs(0, "tokens");
       },
       "glues[0].outputs[0] 'tokens' (glue 'encoder') redefines a value"},
      {"no file",
       [](v1::ArchiveManifest& m) { m.mutable_glues(0)->clear_file(); },
       "glues[0].file is empty"},
      {"no outputs",
       [](v1::ArchiveManifest& m) { m.mutable_glues(0)->clear_outputs(); },
       "glues[0] (glue 'encoder') has no outputs"},
      {"a unit outside reads a value local to the glue",
       [](v1::ArchiveManifest& m) {
         m.mutable_units(1)->set_inputs(0, "embed/out0");
       },
       "units[1].inputs[0] 'embed/out0' (unit 'head') is neither a batch "
       "input nor an output of an earlier unit"},
  };
  for (const Malformed& c : cases) {
    v1::ArchiveManifest m = GluedManifest();
    c.edit(m);
    const absl::Status s = ValidateArchiveManifest(m);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.name << ": " << s;
  }
}

TEST(SafetensorsTest, Parse_GoodHeader_AbsoluteOffsets) {
  const std::string bytes = GoodWeights();
  absl::StatusOr<SafetensorsHeader> h =
      ParseSafetensorsHeader(bytes, bytes.size(), "w");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->tensors.size(), 3u);
  EXPECT_EQ(h->tensors[0].name, "embed.weight");
  EXPECT_EQ(h->tensors[2].dtype, "bool");
  EXPECT_EQ(h->tensors[2].end, bytes.size());
  EXPECT_EQ(h->tensors[1].begin, h->tensors[0].end);
}

TEST(SafetensorsTest, Parse_Malformed_SaysWhy) {
  const std::string good = GoodWeights();
  struct Case {
    std::string bytes;
    uint64_t size;
    const char* message;
  };
  std::string wrong_size = SafetensorsBytes({{"a", "F32", {3}, 8}});
  std::string past_end = SafetensorsBytes({{"a", "F32", {2}, 8}});
  past_end.resize(past_end.size() - 4);
  std::string bad_dtype = SafetensorsBytes({{"a", "F8", {2}, 2}});
  std::string not_json = good;
  not_json[9] = '[';
  const std::vector<Case> cases = {
      {wrong_size, wrong_size.size(),
       "holds 8 bytes, but its dtype and shape "
       "need 12"},
      {past_end, past_end.size(), "data ends at byte 8"},
      {bad_dtype, bad_dtype.size(), "dtype 'F8'"},
      {good.substr(0, 5), 5, "no header length"},
      {good.substr(0, 20), 20, "runs past the end"},
      {not_json, not_json.size(), "not a JSON object"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SafetensorsHeader> h =
        ParseSafetensorsHeader(c.bytes, c.size, "w");
    EXPECT_FALSE(h.ok()) << c.message;
    EXPECT_THAT(h.status().message(), HasSubstr(c.message)) << h.status();
  }
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// model.kind torchscript in the job spec (common/job/job_spec.h).
class JobSpecArchiveTest : public ModelArchiveTest {
 protected:
  v1::JobSpec Spec() {
    v1::JobSpec spec;
    spec.set_name("exported");
    spec.mutable_model()->set_kind("torchscript");
    spec.mutable_model()->set_path(path_);
    spec.mutable_model()->set_vocab(8);
    spec.mutable_batch()->set_micro_batch(2);
    spec.mutable_batch()->set_seq_len(16);
    spec.mutable_train()->set_steps(3);
    ApplyJobSpecDefaults(spec);
    return spec;
  }
};

TEST_F(JobSpecArchiveTest, Validate_GoodArchive_Passes) {
  Write();
  const v1::JobSpec spec = Spec();
  EXPECT_EQ(spec.model().preset(), "");  // no builtin defaults
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

// Exported models take activation checkpointing (every unit but the last
// recomputes; worker/README.md).
TEST_F(JobSpecArchiveTest, Validate_ActivationCheckpointing_Accepted) {
  Write();
  v1::JobSpec spec = Spec();
  spec.mutable_model()->set_activation_checkpointing(true);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

// `tandem status` and the report describe an exported model by its units,
// params and inputs, and count samples where it reads no token sequence.
TEST_F(JobSpecArchiveTest, Describe_ExportedModel_UnitsParamsInputs) {
  Write();
  v1::JobSpec spec = Spec();
  JobModelDescription d = DescribeJobModel(spec);
  EXPECT_EQ(d.text,
            "Tiny (exported): 2 units (embed, head), 2 params of 40 values; "
            "inputs tokens int64 [n, *], targets int64 [n, *]");
  // A token source feeds its tokens: 1 rank x 2 x 16.
  EXPECT_EQ(d.unit, "tokens");
  EXPECT_EQ(d.items_per_step, 32);
  // Fed by name from a tensors file: samples.
  spec.mutable_data()->set_kind("tensors");
  d = DescribeJobModel(spec);
  EXPECT_EQ(d.unit, "samples");
  EXPECT_EQ(d.items_per_step, 2);

  v1::JobSpec builtin;
  ApplyJobSpecDefaults(builtin);
  d = DescribeJobModel(builtin);
  EXPECT_THAT(d.text, HasSubstr("llama: "));
  EXPECT_THAT(d.text, HasSubstr(" layers, d_model "));
  EXPECT_EQ(d.unit, "tokens");
}

TEST_F(JobSpecArchiveTest, Validate_DefaultKind_IsBuiltin) {
  v1::JobSpec spec;
  ApplyJobSpecDefaults(spec);
  EXPECT_EQ(spec.model().kind(), "builtin");
  EXPECT_EQ(spec.model().preset(), "llama");
}

TEST_F(JobSpecArchiveTest, Validate_Problems_ByField) {
  Write();
  v1::JobSpec spec = Spec();
  spec.mutable_model()->set_layers(2);
  spec.mutable_model()->set_preset("llama");
  absl::Status s = ValidateJobSpec(spec);
  EXPECT_THAT(s.message(), HasSubstr("model.preset is a builtin model field"));
  EXPECT_THAT(s.message(), HasSubstr("model.layers is a builtin model field"));

  spec = Spec();
  spec.mutable_model()->clear_path();
  EXPECT_THAT(ValidateJobSpec(spec).message(),
              HasSubstr("model.path must name the archive"));

  spec = Spec();
  spec.mutable_model()->set_path(path_ + ".missing");
  EXPECT_THAT(ValidateJobSpec(spec).message(),
              HasSubstr("model.path: model archive"));

  spec = Spec();
  spec.mutable_model()->set_kind("onnx");
  EXPECT_THAT(ValidateJobSpec(spec).message(),
              HasSubstr("model.kind must be builtin or torchscript"));

  spec = Spec();
  spec.mutable_model()->set_vocab(0);
  EXPECT_THAT(ValidateJobSpec(spec).message(), HasSubstr("model.vocab"));
}

// model.dtype bf16 runs an exported model in bf16 when its exporter ran the
// units in bf16 (ArchiveManifest.precision_checks); f16 is refused for every
// model, and a bf16 reduce needs a bf16 model.
TEST_F(JobSpecArchiveTest, Validate_Bf16_NeedsThePassedExportCheck) {
  Write([](v1::ArchiveManifest& m) {
    m.add_precision_checks()->set_dtype("bfloat16");
  });
  v1::JobSpec spec = Spec();
  EXPECT_EQ(spec.train().reduce_dtype(), v1::DTYPE_F32);
  spec.mutable_model()->set_dtype(v1::DTYPE_BF16);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.mutable_train()->set_reduce_dtype(v1::DTYPE_BF16);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);

  // The check failed at export: its error, and what to do.
  Write([](v1::ArchiveManifest& m) {
    v1::ArchivePrecisionCheck* check = m.add_precision_checks();
    check->set_dtype("bfloat16");
    check->set_error("expected scalar type BFloat16 but found Float");
  });
  EXPECT_EQ(ValidateJobSpec(spec).message(),
            absl::StrCat("invalid job spec: model.dtype bf16: the model does "
                         "not run in bfloat16 ('",
                         path_,
                         "' was checked at export: expected scalar type "
                         "BFloat16 but found Float); make its forward follow "
                         "its params' dtype, or use f32"));
  // An archive from before the check.
  Write();
  EXPECT_EQ(ValidateJobSpec(spec).message(),
            absl::StrCat("invalid job spec: model.dtype bf16: '", path_,
                         "' was exported without a bfloat16 check (by an "
                         "earlier tandem export); export the model again, or "
                         "use f32"));

  spec = Spec();
  spec.mutable_model()->set_dtype(v1::DTYPE_F16);
  ApplyJobSpecDefaults(spec);
  EXPECT_THAT(ValidateJobSpec(spec).message(),
              HasSubstr("model.dtype f16 is for built-in models; an "
                        "exported model runs in f32 or bf16"));

  spec = Spec();
  spec.mutable_train()->set_reduce_dtype(v1::DTYPE_BF16);
  EXPECT_EQ(ValidateJobSpec(spec).message(),
            "invalid job spec: train.reduce_dtype bf16 would round the f32 "
            "gradients of model.dtype f32: use f32, or set model.dtype bf16");
}

TEST_F(JobSpecArchiveTest, Validate_BadArchive_NamesModelPath) {
  Write([](v1::ArchiveManifest& m) { m.set_format_version(3); });
  EXPECT_THAT(ValidateJobSpec(Spec()).message(), HasSubstr("model.path: '"));
  // An input of no role: data.kind synthetic draws it from the archive's
  // description, which an older archive lacks; a token file cannot feed it.
  Write([](v1::ArchiveManifest& m) { m.mutable_inputs(1)->set_role(""); });
  EXPECT_THAT(ValidateJobSpec(Spec()).message(),
              HasSubstr("model.path: input 'targets' has no synthetic "
                        "description (the archive predates them): export "
                        "the model again, or use data.kind tensors"));
  v1::JobSpec tokens = Spec();
  tokens.mutable_data()->set_kind("tokens");
  tokens.mutable_data()->set_path("/tmp/tokens.bin");
  EXPECT_THAT(ValidateJobSpec(tokens).message(),
              HasSubstr("takes input 'targets', which data.kind tokens "
                        "cannot feed (it feeds the roles tokens and "
                        "targets); use data.kind tensors or synthetic"));
  Write([](v1::ArchiveManifest& m) {
    m.mutable_inputs(0)->clear_dynamic_dims();
  });
  EXPECT_THAT(ValidateJobSpec(Spec()).message(),
              HasSubstr("batch.seq_len must be 4 for input 'tokens'"));
}

// data.kind synthetic draws the inputs of no role from their archive's
// description (worker/data/synthetic_inputs.h), checked at submit.
TEST_F(JobSpecArchiveTest, Validate_SyntheticInputs) {
  Write([](v1::ArchiveManifest& m) {
    v1::ArchiveInput* labels = m.mutable_inputs(1);
    labels->set_role("");
    labels->mutable_synthetic()->set_low(0);
    labels->mutable_synthetic()->set_high(7);
  });
  EXPECT_TRUE(ValidateJobSpec(Spec()).ok()) << ValidateJobSpec(Spec());

  Write([](v1::ArchiveManifest& m) {
    v1::ArchiveInput* labels = m.mutable_inputs(1);
    labels->set_role("");
    labels->set_dtype("int8");
    labels->mutable_synthetic()->set_low(-5);
    labels->mutable_synthetic()->set_high(300);
  });
  EXPECT_THAT(ValidateJobSpec(Spec()).message(),
              HasSubstr("model.path: input 'targets': synthetic range [-5, "
                        "300] must be non-empty and within int8's [-128, "
                        "127]"));

  Write([](v1::ArchiveManifest& m) {
    v1::ArchiveInput* x = m.mutable_inputs(1);
    x->set_role("");
    x->set_dtype("float32");
    x->mutable_synthetic()->set_std(-1);
  });
  EXPECT_THAT(ValidateJobSpec(Spec()).message(),
              HasSubstr("synthetic mean 0 and std -1 must be finite, std "
                        ">= 0"));
}

// data.kind tensors against the archive's inputs (tokens and targets, int64
// [2, 4], dim 1 dynamic).
class JobSpecTensorsTest : public JobSpecArchiveTest {
 protected:
  void TearDown() override {
    std::remove(data_path().c_str());
    JobSpecArchiveTest::TearDown();
  }
  std::string data_path() const { return path_ + ".safetensors"; }
  // Arrays of int64 zeros: {name, shape}.
  void WriteData(
      const std::vector<std::pair<std::string, std::vector<int64_t>>>& arrays,
      const std::vector<int64_t>& lengths = {}) {
    std::vector<Tensor> tensors;
    for (const auto& [name, shape] : arrays) {
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      tensors.push_back({name, "I64", shape, numel * 8});
    }
    std::string bytes = SafetensorsBytes(tensors);
    if (!lengths.empty()) {
      // SafetensorsBytes fills with 0x01 bytes; write real lengths last.
      tensors.push_back({"lengths",
                         "I64",
                         {static_cast<int64_t>(lengths.size())},
                         static_cast<int64_t>(lengths.size()) * 8});
      bytes = SafetensorsBytes(tensors);
      bytes.replace(bytes.size() - lengths.size() * 8, lengths.size() * 8,
                    reinterpret_cast<const char*>(lengths.data()),
                    lengths.size() * 8);
    }
    std::ofstream(data_path(), std::ios::binary | std::ios::trunc) << bytes;
  }
  v1::JobSpec TensorsSpec() {
    v1::JobSpec spec = Spec();
    spec.mutable_data()->set_kind("tensors");
    spec.mutable_data()->set_path(data_path());
    return spec;
  }
};

TEST_F(JobSpecTensorsTest, Validate_FileFeedingEveryInput_Passes) {
  Write();
  WriteData({{"tokens", {5, 6}}, {"targets", {5, 6}}}, {6, 1, 3, 2, 6});
  v1::JobSpec spec = TensorsSpec();
  // Token ids are not read: vocab and seq_len may be left out.
  spec.mutable_model()->set_vocab(0);
  spec.mutable_batch()->set_seq_len(0);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  // An input with no role is fed by name too.
  Write([](v1::ArchiveManifest& m) { m.mutable_inputs(1)->set_role(""); });
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST_F(JobSpecTensorsTest, Validate_Problems_ByField) {
  Write();
  WriteData({{"tokens", {5, 6}}, {"targets", {5, 6}}});
  v1::JobSpec spec = TensorsSpec();
  spec.mutable_data()->clear_path();
  EXPECT_THAT(ValidateJobSpec(spec).message(),
              HasSubstr("data.path must name the safetensors file"));

  spec = TensorsSpec();
  spec.mutable_data()->set_path(data_path() + ".missing");
  EXPECT_THAT(ValidateJobSpec(spec).message(),
              HasSubstr("data.path: '" + data_path() + ".missing': No such"));

  WriteData({{"tokens", {5, 6}}, {"features", {5, 6}}});
  EXPECT_THAT(ValidateJobSpec(TensorsSpec()).message(),
              HasSubstr("data.path: '" + data_path() +
                        "' has no array 'targets', which the model takes as "
                        "int64 [*, *]; it holds 'tokens', 'features'"));

  // A fixed dim of the archive differs (dim 1 made fixed at 4).
  Write([](v1::ArchiveManifest& m) {
    m.mutable_inputs(0)->clear_dynamic_dims();
  });
  WriteData({{"tokens", {5, 6}}, {"targets", {5, 6}}});
  EXPECT_THAT(ValidateJobSpec(TensorsSpec()).message(),
              HasSubstr("array 'tokens' is int64 [5, 6], but the model takes "
                        "it as int64 [*, 4]"));

  Write();
  WriteData({{"tokens", {5, 6}}, {"targets", {5, 6}}}, {6, 7, 1, 1, 1});
  EXPECT_THAT(ValidateJobSpec(TensorsSpec()).message(),
              HasSubstr("lengths[1] is 7, beyond dim 1 of array"));

  WriteData({{"tokens", {5, 6}}, {"targets", {4, 6}}});
  EXPECT_THAT(ValidateJobSpec(TensorsSpec()).message(),
              HasSubstr("every array must hold the same samples"));
}

TEST_F(JobSpecTensorsTest, Validate_BuiltinModel_Refused) {
  v1::JobSpec spec;
  spec.set_name("builtin");
  spec.mutable_data()->set_kind("tensors");
  spec.mutable_data()->set_path("/tmp/x.safetensors");
  spec.mutable_batch()->set_micro_batch(1);
  spec.mutable_batch()->set_seq_len(8);
  spec.mutable_train()->set_steps(1);
  ApplyJobSpecDefaults(spec);
  EXPECT_THAT(ValidateJobSpec(spec).message(),
              HasSubstr("data.kind tensors feeds the named inputs of an "
                        "exported model (model.kind torchscript); a builtin "
                        "model reads tokens: use data.kind synthetic or "
                        "tokens"));
}

}  // namespace
}  // namespace tandem
