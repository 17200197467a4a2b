#include "common/security/token_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

constexpr char kAlice[] = "alice-token-0123456789";
constexpr char kRoot[] = "root-token-0123456789abcdef";

TEST(TokenTableTest, ParsesUsersAdminsCommentsAndBlankLines) {
  absl::StatusOr<TokenTable> table =
      TokenTable::Parse(absl::StrCat("# who may call\n\n", kAlice, " alice\n  ",
                                     kRoot, "\troot admin   # the operator\n"),
                        "tokens");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 2u);
  std::optional<Principal> alice = table->Find(kAlice);
  ASSERT_TRUE(alice.has_value());
  EXPECT_EQ(alice->user, "alice");
  EXPECT_FALSE(alice->admin);
  std::optional<Principal> root = table->Find(kRoot);
  ASSERT_TRUE(root.has_value());
  EXPECT_TRUE(root->admin);
  EXPECT_FALSE(table->Find("alice-token-012345678").has_value());
  EXPECT_FALSE(table->Find(absl::StrCat(kAlice, "x")).has_value());
  EXPECT_FALSE(table->Find("").has_value());
}

TEST(TokenTableTest, RefusesMalformedLinesNamingFileAndLine) {
  struct Case {
    std::string text;
    std::string message;
  };
  const Case cases[] = {
      {"short alice\n", "tokens:1: a token must be 16..512"},
      {absl::StrCat("\n", kAlice, "\n"), "tokens:2: expected 'TOKEN USER'"},
      {absl::StrCat(kAlice, " alice admin extra\n"), "got 4 fields"},
      {absl::StrCat(kAlice, " al/ice\n"), "user 'al/ice' must be"},
      {absl::StrCat(kAlice, " alice root\n"), "may only be 'admin'"},
      {absl::StrCat(kAlice, " alice\n", kAlice, " bob\n"),
       "tokens:2: this token is already given to user 'alice'"},
      {"# nothing\n\n", "no tokens"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TokenTable> table = TokenTable::Parse(c.text, "tokens");
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(table.status().message()), HasSubstr(c.message))
        << c.text;
  }
}

TEST(TokenTableTest, BearerTokenTakesOnlyTheBearerScheme) {
  EXPECT_EQ(BearerToken("Bearer abc").value_or(""), "abc");
  EXPECT_EQ(BearerToken("bearer   abc ").value_or(""), "abc");
  EXPECT_FALSE(BearerToken("Basic abc").has_value());
  EXPECT_FALSE(BearerToken("Bearer ").has_value());
  EXPECT_FALSE(BearerToken("abc").has_value());
}

TEST(TokenTableTest, ConstantTimeEqualsComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(TokenFileTest, ReloadTakesNewTokensAndKeepsOldOnError) {
  const std::string path = ::testing::TempDir() + "/tokens-reload";
  { std::ofstream(path) << kAlice << " alice\n"; }
  absl::StatusOr<std::unique_ptr<TokenFile>> file = TokenFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->Find(kAlice).has_value());
  { std::ofstream(path) << kRoot << " root admin\n"; }
  ASSERT_TRUE((*file)->Reload().ok());
  EXPECT_FALSE((*file)->Find(kAlice).has_value()) << "revoked by the reload";
  EXPECT_TRUE((*file)->Find(kRoot).has_value());
  { std::ofstream(path) << "broken\n"; }
  absl::Status bad = (*file)->Reload();
  EXPECT_THAT(std::string(bad.message()), HasSubstr(path + ":1"));
  EXPECT_TRUE((*file)->Find(kRoot).has_value()) << "kept after a bad reload";
  std::remove(path.c_str());
}

TEST(TokenFileTest, MissingFileIsNamed) {
  absl::StatusOr<std::unique_ptr<TokenFile>> file =
      TokenFile::Open("/nonexistent/tokens");
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()),
              HasSubstr("/nonexistent/tokens"));
}

}  // namespace
}  // namespace tandem
