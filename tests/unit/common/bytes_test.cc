#include "common/bytes.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(FormatBytesTest, TheUnitThatReadsBest_ExactBytesBeside) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.00 KiB (1024 B)");
  EXPECT_EQ(FormatBytes(2457224), "2.34 MiB (2457224 B)");
  EXPECT_EQ(FormatBytes(145740808), "139 MiB (145740808 B)");
  EXPECT_EQ(FormatBytes(int64_t{80} << 30), "80.0 GiB (85899345920 B)");
  EXPECT_EQ(FormatBytes(int64_t{3} << 40), "3.00 TiB (3298534883328 B)");
  EXPECT_EQ(FormatBytes(-(int64_t{5} << 20)), "-5.00 MiB (-5242880 B)");
}

TEST(FormatBytesTest, ParsesBackFromTheExactPart) {
  for (int64_t n :
       {int64_t{1}, int64_t{4096}, int64_t{123456789}, int64_t{70} << 30}) {
    const std::string text = FormatBytes(n);
    const size_t open = text.find('(');
    const std::string exact =
        open == std::string::npos
            ? text.substr(0, text.size() - 2)
            : text.substr(open + 1, text.size() - open - 4);
    absl::StatusOr<int64_t> parsed = ParseByteCount(exact, "test");
    ASSERT_TRUE(parsed.ok()) << text;
    EXPECT_EQ(*parsed, n) << text;
  }
}

}  // namespace
}  // namespace tandem
