#include "worker/data/synthetic_inputs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "common/random_bits.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/test_archive_inputs.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

v1::ArchiveInput Floats(const std::string& name, std::vector<int64_t> shape,
                        double mean, double std) {
  v1::ArchiveInput in = Input(name, "float32", std::move(shape), {0});
  in.mutable_synthetic()->set_mean(mean);
  in.mutable_synthetic()->set_std(std);
  return in;
}

v1::ArchiveInput Ints(const std::string& name, const std::string& dtype,
                      std::vector<int64_t> shape, int64_t low, int64_t high) {
  v1::ArchiveInput in = Input(name, dtype, std::move(shape), {0});
  in.mutable_synthetic()->set_low(low);
  in.mutable_synthetic()->set_high(high);
  return in;
}

template <typename T>
std::vector<T> Values(const HostArray& a) {
  std::vector<T> out(a.bytes.size() / sizeof(T));
  std::memcpy(out.data(), a.bytes.data(), a.bytes.size());
  return out;
}

// The values client/python/tandem/synthetic.py computes (its mix and
// fnv1a64 in Python integers): the two languages agree bit for bit.
TEST(SyntheticInputsTest, Bits_MatchThePythonReproduction) {
  EXPECT_EQ(Fnv1a64("images"), 0xbbaa66fa4373e3ebULL);
  EXPECT_EQ(SyntheticBits(3, "images", 5, 7), 0xbf6eb51b564a00b7ULL);
  std::vector<int64_t> row(5);
  ASSERT_TRUE(MakeSyntheticTokens(3, 50, 4)->Read(12, row.data()).ok());
  EXPECT_EQ(row, (std::vector<int64_t>{47, 3, 1, 15, 21}));
}

TEST(SyntheticInputsTest, ImagesAndLabels_ShapesRangesAndMoments) {
  auto source = SyntheticInputs::Make({Floats("images", {4, 3, 8, 8}, 0.5, 2.0),
                                       Ints("labels", "int64", {4}, 0, 9)},
                                      /*seed=*/3, /*vocab=*/0, /*seq_len=*/0);
  ASSERT_TRUE(source.ok()) << source.status();
  const std::vector<HostMicroBatch> batches =
      (*source)->ReadRank(/*step=*/0, /*grad_accum=*/1, /*rank=*/0,
                          /*world=*/1, /*per_rank=*/64);
  ASSERT_EQ(batches.size(), 1u);
  const HostArray& images = batches[0].arrays.at("images");
  EXPECT_EQ(images.dtype, "float32");
  EXPECT_EQ(images.shape, (std::vector<int64_t>{64, 3, 8, 8}));
  const std::vector<float> x = Values<float>(images);
  double sum = 0, sq = 0;
  const double half_width = 2.0 * std::sqrt(3.0);
  for (float v : x) {
    EXPECT_GE(v, 0.5 - half_width - 1e-5);
    EXPECT_LE(v, 0.5 + half_width + 1e-5);
    sum += v;
    sq += v * v;
  }
  const double mean = sum / x.size();
  EXPECT_NEAR(mean, 0.5, 0.05);
  EXPECT_NEAR(std::sqrt(sq / x.size() - mean * mean), 2.0, 0.05);

  const HostArray& labels = batches[0].arrays.at("labels");
  EXPECT_EQ(labels.dtype, "int64");
  EXPECT_EQ(labels.shape, (std::vector<int64_t>{64}));
  std::set<int64_t> seen;
  for (int64_t v : Values<int64_t>(labels)) seen.insert(v);
  EXPECT_EQ(seen.size(), 10u);  // 64 draws of 10 values hit every one
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 9);
  EXPECT_EQ(batches[0].loss_weight(), 1.0);
}

TEST(SyntheticInputsTest, NarrowIntegersAndBools_StayInRange) {
  auto source = SyntheticInputs::Make({Ints("offsets", "int8", {2, 16}, -3, 2),
                                       Ints("pixels", "uint8", {2, 16}, 0, 255),
                                       Ints("mask", "bool", {2, 16}, 0, 1)},
                                      5, 0, 0);
  ASSERT_TRUE(source.ok()) << source.status();
  const HostMicroBatch b = (*source)->ReadRank(1, 1, 0, 1, 8)[0];
  std::set<int> offsets, masks;
  for (int8_t v : Values<int8_t>(b.arrays.at("offsets"))) offsets.insert(v);
  for (uint8_t v : Values<uint8_t>(b.arrays.at("mask"))) masks.insert(v);
  EXPECT_EQ(offsets, (std::set<int>{-3, -2, -1, 0, 1, 2}));
  EXPECT_EQ(masks, (std::set<int>{0, 1}));
  EXPECT_EQ(b.arrays.at("pixels").bytes.size(), 8u * 16u);
}

// World 3 with 2 samples each reads what world 1 with 6 reads, and every
// rank of a step computes the same global count.
TEST(SyntheticInputsTest, RankSlices_TileTheGlobalBatch) {
  auto source = SyntheticInputs::Make({Floats("x", {2, 5}, 0, 1)}, 9, 0, 0);
  ASSERT_TRUE(source.ok());
  const HostMicroBatch whole = (*source)->ReadRank(4, 1, 0, 1, 6)[0];
  std::string tiled;
  for (int r = 0; r < 3; ++r) {
    const HostMicroBatch part = (*source)->ReadRank(4, 1, r, 3, 2)[0];
    EXPECT_EQ(part.global_counted, 6);
    EXPECT_EQ(part.counted, 2);
    tiled += part.arrays.at("x").bytes;
  }
  EXPECT_EQ(tiled, whole.arrays.at("x").bytes);
  // Another seed, another batch; the same seed, the same one.
  auto other = SyntheticInputs::Make({Floats("x", {2, 5}, 0, 1)}, 10, 0, 0);
  EXPECT_NE((*other)->ReadRank(4, 1, 0, 1, 6)[0].arrays.at("x").bytes,
            whole.arrays.at("x").bytes);
  EXPECT_EQ((*source)->ReadRank(4, 1, 0, 1, 6)[0].arrays.at("x").bytes,
            whole.arrays.at("x").bytes);
}

// Tokens and targets come from the token stream; a mask along the
// sequence follows batch.seq_len, an input of another length keeps its own.
TEST(SyntheticInputsTest, TokenRolesAndSequenceMasks) {
  v1::ArchiveInput mask = Ints("attention_mask", "int64", {2, 8}, 0, 1);
  mask.add_dynamic_dims(1);
  v1::ArchiveInput extra = Ints("segments", "int64", {2, 3}, 0, 4);
  extra.add_dynamic_dims(1);
  auto source = SyntheticInputs::Make(
      {Input("input_ids", "int64", {2, 8}, {0, 1}, "tokens"),
       Input("labels", "int64", {2, 8}, {0, 1}, "targets"), mask, extra},
      7, 50, 12);
  ASSERT_TRUE(source.ok()) << source.status();
  const HostMicroBatch b = (*source)->ReadRank(2, 1, 1, 2, 3)[0];
  EXPECT_EQ(b.arrays.at("input_ids").shape, (std::vector<int64_t>{3, 12}));
  EXPECT_EQ(b.arrays.at("attention_mask").shape, (std::vector<int64_t>{3, 12}));
  EXPECT_EQ(b.arrays.at("segments").shape, (std::vector<int64_t>{3, 3}));
  const std::vector<int64_t> tokens = Values<int64_t>(b.arrays.at("input_ids"));
  const std::vector<int64_t> targets = Values<int64_t>(b.arrays.at("labels"));
  auto stream = MakeSyntheticTokens(7, 50, 12);
  for (int j = 0; j < 3; ++j) {
    std::vector<int64_t> row(13);
    ASSERT_TRUE(stream->Read(b.samples[j], row.data()).ok());
    EXPECT_TRUE(
        std::equal(row.begin(), row.begin() + 12, tokens.begin() + j * 12));
    EXPECT_TRUE(
        std::equal(row.begin() + 1, row.end(), targets.begin() + j * 12));
  }
  EXPECT_EQ(b.samples, (std::vector<int64_t>{15, 16, 17}));
}

TEST(SyntheticInputsTest, Problems_NameTheInputAndWhatToDo) {
  auto s =
      SyntheticInputs::Make({Input("images", "float32", {2, 3}, {0})}, 1, 0, 0);
  EXPECT_THAT(s.status().message(),
              HasSubstr("model.path: input 'images' has no synthetic "
                        "description (the archive predates them): export the "
                        "model again, or use data.kind tensors"));
  s = SyntheticInputs::Make({Ints("labels", "int64", {2}, 5, 1)}, 1, 0, 0);
  EXPECT_THAT(s.status().message(),
              HasSubstr("input 'labels': synthetic range [5, 1] must be "
                        "non-empty"));
  s = SyntheticInputs::Make({Input("ids", "int32", {2, 4}, {0, 1}, "tokens")},
                            1, 8, 4);
  EXPECT_THAT(s.status().message(),
              HasSubstr("input 'ids' (role tokens) must be int64 "
                        "[micro_batch, seq_len] for the token stream"));
}

}  // namespace
}  // namespace tandem
