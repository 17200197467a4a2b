#include "coordinator/service/kv_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

namespace tandem {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

TEST(KvStoreTest, Get_KeySetLater_WakesUp) {
  KvStore kv;
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    ASSERT_TRUE(kv.Set("job/a", "v").ok());
  });
  auto v = kv.Get("job/a", 5000ms);
  setter.join();
  ASSERT_TRUE(v.ok());
  ASSERT_TRUE(v->has_value());
  EXPECT_EQ(**v, "v");
}

TEST(KvStoreTest, Get_Timeout_ReturnsNothing) {
  KvStore kv;
  auto v = kv.Get("missing", 20ms);
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->has_value());
}

TEST(KvStoreTest, Add_CountsAndRejectsNonIntegers) {
  KvStore kv;
  EXPECT_EQ(*kv.Add("n", 2), 2);
  EXPECT_EQ(*kv.Add("n", 3), 5);
  ASSERT_TRUE(kv.Set("s", "abc").ok());
  EXPECT_EQ(kv.Add("s", 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(KvStoreTest, CompareSet_FollowsC10dSemantics) {
  KvStore kv;
  EXPECT_EQ(*kv.CompareSet("k", "", "first"), "first");  // absent + empty
  EXPECT_EQ(*kv.CompareSet("k", "wrong", "x"), "first");
  EXPECT_EQ(*kv.CompareSet("k", "first", "second"), "second");
  EXPECT_EQ(*kv.CompareSet("absent", "x", "y"), "x");
  EXPECT_FALSE(kv.Check({"absent"}));
}

TEST(KvStoreTest, CheckDeleteAndCount_ByPrefix) {
  KvStore kv;
  ASSERT_TRUE(kv.Set("j1/a", "1").ok());
  ASSERT_TRUE(kv.Set("j1/b", "1").ok());
  ASSERT_TRUE(kv.Set("j2/a", "1").ok());
  EXPECT_TRUE(kv.Check({"j1/a", "j1/b"}));
  EXPECT_EQ(kv.NumKeys("j1/"), 2);
  EXPECT_TRUE(kv.Delete("j1/a"));
  EXPECT_FALSE(kv.Delete("j1/a"));
  kv.DeletePrefix("j1/");
  EXPECT_EQ(kv.NumKeys("j1/"), 0);
  EXPECT_EQ(kv.NumKeys(""), 1);
}

TEST(KvStoreTest, Oversized_IsRejectedWithSizes) {
  KvStore kv;
  EXPECT_THAT(std::string(kv.Set("", "v").message()), HasSubstr("key must be"));
  const std::string big(KvStore::kMaxValueBytes + 1, 'x');
  const absl::Status s = kv.Set("k", big);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("at most 1048576"));
}

}  // namespace
}  // namespace tandem
