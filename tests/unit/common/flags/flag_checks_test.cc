#include "common/flags/flag_checks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

TEST(FlagChecksTest, CheckAtLeast_BelowMin_NamesFlagBoundAndValue) {
  EXPECT_TRUE(CheckAtLeast("--threads", 0, 0).ok());
  EXPECT_TRUE(CheckAtLeast<int64_t>("--steps", 7, 1).ok());
  const absl::Status s = CheckAtLeast("--threads", -1, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--threads must be >= 0, got -1");
}

TEST(FlagChecksTest, CheckPositive_ZeroOrBelow_IsRejected) {
  EXPECT_TRUE(CheckPositive("--timeout", 0.5).ok());
  EXPECT_EQ(CheckPositive("--timeout", 0.0).message(),
            "--timeout must be > 0, got 0");
  EXPECT_EQ(CheckPositive("--window", -2).message(),
            "--window must be > 0, got -2");
}

TEST(FlagChecksTest, CheckOneOf_OtherWord_ListsChoices) {
  EXPECT_TRUE(CheckOneOf("--device", "cpu", {"auto", "cpu", "cuda"}).ok());
  EXPECT_EQ(CheckOneOf("--device", "gpu", {"auto", "cpu", "cuda"}).message(),
            "--device: expected one of auto, cpu, cuda, got 'gpu'");
}

TEST(FlagChecksTest, CheckHostPort_Valid_Accepted) {
  for (const char* ok : {"127.0.0.1:50051", "tandem-coordinator:50051",
                         "[::1]:9100", "0.0.0.0:65535", "host:1"}) {
    EXPECT_TRUE(CheckHostPort("--listen", ok, PortZero::kRejected).ok()) << ok;
  }
  EXPECT_TRUE(
      CheckHostPort("--listen", "127.0.0.1:0", PortZero::kAllowed).ok());
}

TEST(FlagChecksTest, CheckHostPort_Malformed_SaysWhatToWrite) {
  for (const char* bad : {"127.0.0.1", ":80", "host:", "host:http",
                          "host:70000", "host:-1", "host: 80", "host:+80"}) {
    const absl::Status s = CheckHostPort("--listen", bad, PortZero::kAllowed);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("--listen: expected HOST:PORT")) << bad;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("'", bad, "'")));
  }
  const absl::Status zero =
      CheckHostPort("--rendezvous", "127.0.0.1:0", PortZero::kRejected);
  EXPECT_THAT(zero.message(), HasSubstr("a port in 1..65535"));
}

}  // namespace
}  // namespace tandem
