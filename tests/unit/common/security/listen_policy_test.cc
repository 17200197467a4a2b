#include "common/security/listen_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem {
namespace {

using ::testing::HasSubstr;

TEST(ListenPolicyTest, LoopbackIsOnlyLiteralLoopback) {
  for (const char* a : {"127.0.0.1:50051", "127.1.2.3:0", "localhost:1",
                        "LOCALHOST:1", "[::1]:50051", "unix:/tmp/sock"}) {
    EXPECT_TRUE(IsLoopbackListen(a)) << a;
  }
  for (const char* a :
       {"0.0.0.0:50051", "[::]:50051", "10.0.0.1:1", "128.0.0.1:1",
        "myhost:50051", "127.0.0:1", "127.0.0.256:1", "[::1:1", ":50051"}) {
    EXPECT_FALSE(IsLoopbackListen(a)) << a;
  }
}

TEST(ListenPolicyTest, PublicAddressNeedsTlsAndTokensOrInsecure) {
  EXPECT_TRUE(CheckListen("--listen", "127.0.0.1:1", {}).ok());
  EXPECT_TRUE(CheckListen("--listen", "0.0.0.0:1", {true, true, false}).ok());
  EXPECT_TRUE(CheckListen("--listen", "0.0.0.0:1", {false, false, true}).ok());

  absl::Status none = CheckListen("--listen", "0.0.0.0:50051", {});
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(none.message()),
              HasSubstr("--listen 0.0.0.0:50051 is not a loopback address"));
  EXPECT_THAT(std::string(none.message()),
              HasSubstr("Add --tls-cert and --tls-key and --auth-tokens"));
  EXPECT_THAT(std::string(none.message()), HasSubstr("--insecure"));

  absl::Status tls_only =
      CheckListen("--metrics-listen", "10.0.0.1:9090", {true, false, false});
  EXPECT_THAT(std::string(tls_only.message()), HasSubstr("Add --auth-tokens,"));
  absl::Status tokens_only =
      CheckListen("--listen", "10.0.0.1:9090", {false, true, false});
  EXPECT_THAT(std::string(tokens_only.message()),
              HasSubstr("Add --tls-cert and --tls-key,"));
}

}  // namespace
}  // namespace tandem
