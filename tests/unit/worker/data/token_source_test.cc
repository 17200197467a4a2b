#include "worker/data/token_source.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(TokenSourceTest, Synthetic_DeterministicInVocabAndSeedDependent) {
  auto a = MakeSyntheticTokens(3, 50, 16);
  auto b = MakeSyntheticTokens(3, 50, 16);
  auto c = MakeSyntheticTokens(4, 50, 16);
  std::vector<int64_t> x(17), y(17), z(17);
  ASSERT_TRUE(a->Read(12, x.data()).ok());
  ASSERT_TRUE(b->Read(12, y.data()).ok());
  ASSERT_TRUE(c->Read(12, z.data()).ok());
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
  for (int64_t t : x) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 50);
  }
}

TEST(TokenSourceTest, RankSlices_TileTheGlobalBatch) {
  // World 3, 2 per rank == world 1 with 6 per rank.
  std::vector<int64_t> all;
  for (int r = 0; r < 3; ++r) {
    for (int64_t i : RankSequenceIndices(5, 0, 1, r, 3, 2)) all.push_back(i);
  }
  EXPECT_EQ(all, RankSequenceIndices(5, 0, 1, 0, 1, 6));
  EXPECT_EQ(all.front(), 30);
  // Grad accumulation: micro-batch 1 of step 2 with 2 micro-batches.
  EXPECT_EQ(RankSequenceIndices(2, 1, 2, 1, 2, 3),
            (std::vector<int64_t>{33, 34, 35}));
}

std::string WriteTokens(const std::vector<uint32_t>& tokens, int bytes) {
  char path[] = "/tmp/tandem_tokens_XXXXXX";
  const int fd = mkstemp(path);
  std::string data;
  for (uint32_t t : tokens) {
    for (int b = 0; b < bytes; ++b)
      data.push_back(static_cast<char>(t >> (8 * b)));
  }
  EXPECT_EQ(write(fd, data.data(), data.size()),
            static_cast<ssize_t>(data.size()));
  close(fd);
  return path;
}

TEST(TokenSourceTest, TokenFile_Uint16AndUint32_WindowsWrap) {
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 10; ++i) tokens.push_back(i * 3);
  for (int bytes : {2, 4}) {
    const std::string path = WriteTokens(tokens, bytes);
    auto source = OpenTokenFile(path, bytes, 100, 4);
    ASSERT_TRUE(source.ok()) << source.status();
    std::vector<int64_t> seq(5);
    ASSERT_TRUE((*source)->Read(1, seq.data()).ok());
    EXPECT_EQ(seq, (std::vector<int64_t>{12, 15, 18, 21, 24}));
    // Two windows of 4 fit in 10 tokens: sequence 2 wraps to window 0.
    ASSERT_TRUE((*source)->Read(2, seq.data()).ok());
    EXPECT_EQ(seq.front(), 0);
    std::remove(path.c_str());
  }
}

TEST(TokenSourceTest, TokenFile_BadInputs_ErrorsNameTheField) {
  EXPECT_EQ(OpenTokenFile("/nonexistent/tokens.bin", 2, 10, 4).status().code(),
            absl::StatusCode::kNotFound);
  const std::string path = WriteTokens({1, 2, 300, 4, 5, 6}, 2);
  EXPECT_NE(
      OpenTokenFile(path, 3, 10, 4).status().message().find("token_bytes"),
      std::string::npos);
  EXPECT_FALSE(OpenTokenFile(path, 2, 1000, 8).ok());  // too short
  auto source = OpenTokenFile(path, 2, 10, 4);
  ASSERT_TRUE(source.ok());
  std::vector<int64_t> seq(5);
  absl::Status s = (*source)->Read(0, seq.data());
  EXPECT_NE(s.message().find("vocab"), std::string::npos) << s;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tandem
