#include "common/status_macros.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

absl::StatusOr<int> Half(int v) {
  if (v % 2 != 0) return absl::InvalidArgumentError("odd");
  return v / 2;
}

absl::Status Check(int v) {
  if (v < 0) return absl::OutOfRangeError("negative");
  return absl::OkStatus();
}

absl::StatusOr<int> Quarter(int v) {
  RETURN_IF_ERROR(Check(v));
  ASSIGN_OR_RETURN(int half, Half(v));
  ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

TEST(StatusMacrosTest, AssignOrReturn_AllOk_YieldsValue) {
  auto q = Quarter(12);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, 3);
}

TEST(StatusMacrosTest, AssignOrReturn_InnerError_PropagatesIt) {
  auto q = Quarter(6);  // 6 -> 3 -> odd
  EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(q.status().message(), "odd");
}

TEST(StatusMacrosTest, ReturnIfError_Error_PropagatesIt) {
  EXPECT_EQ(Quarter(-4).status().code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace tandem
