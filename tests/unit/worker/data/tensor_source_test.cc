// The tensors data source (worker/data/tensor_source.h) against safetensors
// files written here byte by byte: which samples each rank reads, the cut to
// a micro-batch's longest sample and its padding, the loss weights, and bad
// files.
#include "worker/data/tensor_source.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/unit/worker/test_archive_inputs.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Array {
  std::string name;
  std::string dtype;  // safetensors' names: I64, F32
  std::vector<int64_t> shape;
  std::string data;
};

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(T));
}

std::string SafetensorsFile(const std::vector<Array>& arrays) {
  std::string header = "{";
  std::string data;
  for (const Array& a : arrays) {
    absl::StrAppend(&header, header.size() > 1 ? "," : "", "\"", a.name,
                    "\":{\"dtype\":\"", a.dtype, "\",\"shape\":[",
                    absl::StrJoin(a.shape, ","), "],\"data_offsets\":[",
                    data.size(), ",", data.size() + a.data.size(), "]}");
    data += a.data;
  }
  header += "}";
  std::string out;
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  }
  return out + header + data;
}

template <typename T>
std::vector<T> Values(const HostArray& a) {
  std::vector<T> out(a.bytes.size() / sizeof(T));
  std::memcpy(out.data(), a.bytes.data(), a.bytes.size());
  return out;
}

class TensorSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = absl::StrCat(
        ::testing::TempDir(), "/tensors_", getpid(), "_",
        ::testing::UnitTest::GetInstance()->current_test_info()->name(),
        ".safetensors");
  }
  void TearDown() override { std::remove(path_.c_str()); }
  void Write(const std::vector<Array>& arrays) {
    std::ofstream(path_, std::ios::binary) << SafetensorsFile(arrays);
  }
  std::string path_;
};

// 5 samples; sample i of "x" holds i.
TEST_F(TensorSourceTest, ReadRank_RanksTakeContiguousSlices_WrapAtTheEnd) {
  Write({{"x", "I64", {5, 1}, Bytes<int64_t>({0, 1, 2, 3, 4})}});
  auto source = TensorSource::Open(path_, {Input("x", "int64", {2, 1}, {0})});
  ASSERT_TRUE(source.ok()) << source.status();
  auto samples = [&](int64_t step, int32_t accum, int32_t rank, int32_t world,
                     int32_t m) {
    std::vector<std::vector<int64_t>> out;
    auto batches = (*source)->ReadRank(step, accum, rank, world, m);
    EXPECT_TRUE(batches.ok()) << batches.status();
    for (const HostMicroBatch& b : *batches) {
      EXPECT_EQ(b.samples, Values<int64_t>(b.arrays.at("x")));
      EXPECT_THAT(b.arrays.at("x").shape, ElementsAre(m, 1));
      out.push_back(b.samples);
    }
    return out;
  };
  // World 2, micro_batch 2: step 0 is samples 0-3, step 1 is 4, 0, 1, 2.
  EXPECT_THAT(samples(0, 1, 0, 2, 2), ElementsAre(ElementsAre(0, 1)));
  EXPECT_THAT(samples(0, 1, 1, 2, 2), ElementsAre(ElementsAre(2, 3)));
  EXPECT_THAT(samples(1, 1, 0, 2, 2), ElementsAre(ElementsAre(4, 0)));
  EXPECT_THAT(samples(1, 1, 1, 2, 2), ElementsAre(ElementsAre(1, 2)));
  // Grad accumulation 2: micro-batch 1 of step 0 is global samples 4-7.
  EXPECT_THAT(samples(0, 2, 1, 2, 2),
              ElementsAre(ElementsAre(2, 3), ElementsAre(1, 2)));
  // World 1 with micro_batch 4 reads what the two ranks read together.
  EXPECT_THAT(samples(1, 1, 0, 1, 4), ElementsAre(ElementsAre(4, 0, 1, 2)));
}

// Three inputs of dynamic dim 1 (ids, labels of role targets, feat with an
// inner dim), one fixed (mask); lengths 3, 5, 2, 4.
class VariableLengthTest : public TensorSourceTest {
 protected:
  void SetUp() override {
    TensorSourceTest::SetUp();
    std::vector<int64_t> ids, labels;
    std::vector<float> feat;
    for (int64_t i = 0; i < 4; ++i) {
      for (int64_t t = 0; t < 6; ++t) {
        ids.push_back(100 * i + t + 1);
        // Sample 1 ignores its position 0 itself.
        labels.push_back(i == 1 && t == 0 ? -100 : 10 * i + t);
        feat.push_back(static_cast<float>(i) + 0.5f);
        feat.push_back(-static_cast<float>(t) - 1.0f);
      }
    }
    Write({{"ids", "I64", {4, 6}, Bytes(ids)},
           {"labels", "I64", {4, 6}, Bytes(labels)},
           {"feat", "F32", {4, 6, 2}, Bytes(feat)},
           {"mask", "I64", {4, 3}, Bytes<int64_t>(std::vector<int64_t>(12, 7))},
           {"lengths", "I64", {4}, Bytes<int64_t>({3, 5, 2, 4})}});
  }
  std::vector<v1::ArchiveInput> Inputs() {
    return {Input("ids", "int64", {2, 6}, {0, 1}, "tokens"),
            Input("labels", "int64", {2, 6}, {0, 1}, "targets"),
            Input("feat", "float32", {2, 6, 2}, {0, 1}),
            Input("mask", "int64", {2, 3}, {0})};
  }
};

TEST_F(VariableLengthTest, ReadRank_CutsToLongestSampleAndPads) {
  auto source = TensorSource::Open(path_, Inputs());
  ASSERT_TRUE(source.ok()) << source.status();
  // World 2, micro_batch 2: rank 0 reads samples 0 and 1 (lengths 3, 5),
  // rank 1 samples 2 and 3 (lengths 2, 4): different shapes in one step.
  auto r0 = (*source)->ReadRank(0, 1, 0, 2, 2);
  auto r1 = (*source)->ReadRank(0, 1, 1, 2, 2);
  ASSERT_TRUE(r0.ok() && r1.ok());
  const HostMicroBatch& a = (*r0)[0];
  EXPECT_THAT(a.arrays.at("ids").shape, ElementsAre(2, 5));
  EXPECT_THAT(Values<int64_t>(a.arrays.at("ids")),
              ElementsAre(1, 2, 3, 0, 0, 101, 102, 103, 104, 105));
  EXPECT_THAT(Values<int64_t>(a.arrays.at("labels")),
              ElementsAre(0, 1, 2, -100, -100, -100, 11, 12, 13, 14));
  EXPECT_THAT(a.arrays.at("feat").shape, ElementsAre(2, 5, 2));
  const std::vector<float> feat = Values<float>(a.arrays.at("feat"));
  EXPECT_THAT(std::vector<float>(feat.begin(), feat.begin() + 10),
              ElementsAre(0.5f, -1, 0.5f, -2, 0.5f, -3, 0, 0, 0, 0));
  EXPECT_EQ(feat[10], 1.5f);
  EXPECT_EQ(feat[19], -5.0f);
  // A fixed dim is never cut.
  EXPECT_THAT(a.arrays.at("mask").shape, ElementsAre(2, 3));
  EXPECT_THAT(Values<int64_t>(a.arrays.at("mask")), ::testing::Each(7));
  const HostMicroBatch& b = (*r1)[0];
  EXPECT_THAT(b.arrays.at("ids").shape, ElementsAre(2, 4));
  EXPECT_THAT(Values<int64_t>(b.arrays.at("labels")),
              ElementsAre(20, 21, -100, -100, 30, 31, 32, 33));
}

TEST_F(VariableLengthTest, ReadRank_WeightsAreSharesOfCountedTargets) {
  auto source = TensorSource::Open(path_, Inputs());
  ASSERT_TRUE(source.ok()) << source.status();
  // Counted targets: lengths, less sample 1's own -100.
  EXPECT_EQ((*source)->counted(0), 3);
  EXPECT_EQ((*source)->counted(1), 4);
  EXPECT_EQ((*source)->counted(2), 2);
  EXPECT_EQ((*source)->counted(3), 4);
  auto r0 = (*source)->ReadRank(0, 1, 0, 2, 2);
  auto r1 = (*source)->ReadRank(0, 1, 1, 2, 2);
  ASSERT_TRUE(r0.ok() && r1.ok());
  EXPECT_EQ((*r0)[0].counted, 7);
  EXPECT_EQ((*r1)[0].counted, 6);
  EXPECT_EQ((*r0)[0].global_counted, 13);
  EXPECT_DOUBLE_EQ((*r0)[0].loss_weight(), 7.0 / 13);
  EXPECT_DOUBLE_EQ((*r1)[0].loss_weight(), 6.0 / 13);
  // World 1, micro_batch 1, grad_accum 3 over samples 3, 0, 1 (step 1
  // wraps): weights 4/11, 3/11, 4/11.
  auto acc = (*source)->ReadRank(1, 3, 0, 1, 1);
  ASSERT_TRUE(acc.ok());
  double sum = 0;
  std::vector<int64_t> counted;
  for (const HostMicroBatch& mb : *acc) {
    sum += mb.loss_weight();
    counted.push_back(mb.counted);
    EXPECT_EQ(mb.global_counted, 11);
  }
  EXPECT_THAT(counted, ElementsAre(4, 3, 4));
  EXPECT_DOUBLE_EQ(sum, 1.0);
}

TEST_F(TensorSourceTest, ReadRank_NoTargets_EverySampleCountsOne) {
  Write({{"x", "F32", {3, 2}, Bytes<float>({1, 2, 3, 4, 5, 6})},
         {"y", "I64", {3}, Bytes<int64_t>({0, 1, 0})}});
  auto source = TensorSource::Open(path_, {Input("x", "float32", {4, 2}, {0}),
                                           Input("y", "int64", {4}, {0})});
  ASSERT_TRUE(source.ok()) << source.status();
  auto batches = (*source)->ReadRank(0, 2, 1, 3, 1);
  ASSERT_TRUE(batches.ok());
  for (const HostMicroBatch& b : *batches) {
    EXPECT_EQ(b.counted, 1);
    EXPECT_DOUBLE_EQ(b.loss_weight(), 1.0 / 6);
  }
  EXPECT_THAT(Values<float>((*batches)[1].arrays.at("x")), ElementsAre(3, 4));
  EXPECT_THAT((*batches)[1].arrays.at("y").shape, ElementsAre(1));
}

TEST_F(TensorSourceTest,
       ReadRank_MicroBatchWithNothingCounted_FailsOnEveryRank) {
  Write({{"y", "I64", {4}, Bytes<int64_t>({1, -100, -100, 2})}});
  auto source =
      TensorSource::Open(path_, {Input("y", "int64", {2}, {0}, "targets")});
  ASSERT_TRUE(source.ok()) << source.status();
  // Rank 1 of world 2 (micro_batch 1) reads sample 1 at step 0; rank 0
  // fails alike: each counts the whole step.
  for (int32_t rank : {0, 1}) {
    auto batches = (*source)->ReadRank(0, 1, rank, 2, 1);
    EXPECT_EQ(batches.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(batches.status().message(),
                HasSubstr("step 0, micro-batch 0 of rank 1 (samples 1 to 1"));
  }
  EXPECT_TRUE((*source)->ReadRank(0, 1, 0, 1, 2).ok());  // samples 0, 1
}

TEST_F(TensorSourceTest, Open_BadFiles_SayWhatToFix) {
  const std::vector<v1::ArchiveInput> inputs = {
      Input("x", "float32", {4, 2}, {0}),
      Input("y", "int64", {4, 3}, {0, 1}, "targets")};
  struct Case {
    const char* name;
    std::string bytes;
    const char* message;
  };
  const std::string x = Bytes<float>({1, 2, 3, 4});
  const std::string y = Bytes<int64_t>({1, 2, 3, 4, 5, 6});
  const std::vector<Case> cases = {
      {"missing input", SafetensorsFile({{"x", "F32", {2, 2}, x}}),
       "has no array 'y', which the model takes as int64 [*, *]; it holds "
       "'x'"},
      {"wrong dtype",
       SafetensorsFile(
           {{"x", "F64", {1, 2}, x}, {"y", "I64", {1, 3}, y.substr(0, 24)}}),
       "array 'x' is float64 [1, 2], but the model takes it as float32 [*, 2]"},
      {"wrong fixed dim",
       SafetensorsFile(
           {{"x", "F32", {1, 4}, x}, {"y", "I64", {1, 3}, y.substr(0, 24)}}),
       "array 'x' is float32 [1, 4], but the model takes it as float32 [*, 2]"},
      {"samples differ",
       SafetensorsFile(
           {{"x", "F32", {2, 2}, x}, {"y", "I64", {1, 3}, y.substr(0, 24)}}),
       "holds 1 samples (dim 0) but 'x' holds 2"},
      {"lengths not int64",
       SafetensorsFile({{"x", "F32", {2, 2}, x},
                        {"y", "I64", {2, 3}, y},
                        {"lengths", "F32", {2}, Bytes<float>({1, 2})}}),
       "array 'lengths' is float32 [2]; it must be int64 [2]"},
      {"length beyond dim 1",
       SafetensorsFile({{"x", "F32", {2, 2}, x},
                        {"y", "I64", {2, 3}, y},
                        {"lengths", "I64", {2}, Bytes<int64_t>({3, 4})}}),
       "lengths[1] is 4, beyond dim 1 of array 'y' (3)"},
      {"zero length",
       SafetensorsFile({{"x", "F32", {2, 2}, x},
                        {"y", "I64", {2, 3}, y},
                        {"lengths", "I64", {2}, Bytes<int64_t>({0, 1})}}),
       "lengths[0] is 0"},
      {"not safetensors", "not a safetensors file at all",
       "is not a valid safetensors file"},
  };
  for (const Case& c : cases) {
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << c.bytes;
    auto source = TensorSource::Open(path_, inputs);
    EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument)
        << c.name;
    EXPECT_THAT(source.status().message(), HasSubstr("data.path: ")) << c.name;
    EXPECT_THAT(source.status().message(), HasSubstr(c.message))
        << c.name << ": " << source.status();
  }
  std::remove(path_.c_str());
  EXPECT_EQ(TensorSource::Open(path_, inputs).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem
