#include "common/flags/command_line.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"

ABSL_FLAG(int, test_count, 3, "how many");
ABSL_FLAG(std::string, test_name, "", "a name");
ABSL_FLAG(bool, test_verbose, false, "say more");
ABSL_FLAG(double, test_ratio, 0.5, "a fraction");
ABSL_FLAG(std::optional<int>, test_rank, std::nullopt, "a rank when given");

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

absl::StatusOr<ParsedCommandLine> Parse(const CommandLineSpec& spec,
                                        std::vector<const char*> args) {
  args.insert(args.begin(), "prog");
  return ParseCommandLine(spec, args);
}

// Every test restores the flags it sets.
class CommandLineTest : public ::testing::Test {
 protected:
  absl::FlagSaver saver_;
  CommandLineSpec spec_{"prog", "usage: prog [--test-count N]\n"};
};

TEST_F(CommandLineTest, Parse_DashedOrSnakeNamesWithSpaceOrEquals_SetFlags) {
  ASSERT_TRUE(Parse(spec_, {"--test-count", "5", "--test_name=alice"}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 5);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "alice");
  ASSERT_TRUE(Parse(spec_, {"--test_count=7", "-test-name", "bob"}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 7);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "bob");
}

TEST_F(CommandLineTest, Parse_RepeatedFlag_LastWins) {
  ASSERT_TRUE(Parse(spec_, {"--test-count", "1", "--test-count=2"}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 2);
}

TEST_F(CommandLineTest, Parse_ValueStartingWithDash_IsTheValue) {
  ASSERT_TRUE(Parse(spec_, {"--test-count", "-4", "--test-name", "-x"}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), -4);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "-x");
}

TEST_F(CommandLineTest, Parse_BooleanForms_SetTrueOrFalse) {
  ASSERT_TRUE(Parse(spec_, {"--test-verbose"}).ok());
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_verbose));
  ASSERT_TRUE(Parse(spec_, {"--test-verbose=false"}).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_test_verbose));
  ASSERT_TRUE(Parse(spec_, {"--test-verbose=true", "--notest-verbose"}).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_test_verbose));
  ASSERT_TRUE(Parse(spec_, {"--test-verbose", "--no-test-verbose"}).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_test_verbose));
}

TEST_F(CommandLineTest, Parse_BooleanWithSpacedValue_SaysToUseEquals) {
  absl::StatusOr<ParsedCommandLine> parsed =
      Parse(spec_, {"--test-verbose", "false"});
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("--test-verbose=false"));
}

TEST_F(CommandLineTest, Parse_BooleanWithBadValue_NamesFlagAndType) {
  absl::StatusOr<ParsedCommandLine> parsed =
      Parse(spec_, {"--test-verbose=maybe"});
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(),
            "--test-verbose: expected true or false, got 'maybe'");
}

TEST_F(CommandLineTest, Parse_NoFormOfValuedFlag_IsRejected) {
  absl::StatusOr<ParsedCommandLine> parsed = Parse(spec_, {"--notest-count"});
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(),
              HasSubstr("only a boolean flag has a --no form"));
}

TEST_F(CommandLineTest, Parse_UnknownFlag_NamesItSuggestsAndListsAll) {
  absl::StatusOr<ParsedCommandLine> parsed = Parse(spec_, {"--test-cont=4"});
  ASSERT_FALSE(parsed.ok());
  const std::string message(parsed.status().message());
  EXPECT_THAT(message, HasSubstr("unknown flag '--test-cont'"));
  EXPECT_THAT(message, HasSubstr("did you mean --test-count?"));
  EXPECT_THAT(message, HasSubstr("--test-count, --test-name, --test-rank, "
                                 "--test-ratio, --test-verbose"));
  EXPECT_THAT(message, HasSubstr("--help"));
}

TEST_F(CommandLineTest, Parse_FarOffUnknownFlag_SuggestsNothing) {
  absl::StatusOr<ParsedCommandLine> parsed = Parse(spec_, {"--zzzzzz"});
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("unknown flag '--zzzzzz'"));
  EXPECT_THAT(parsed.status().message(), Not(HasSubstr("did you mean")));
}

TEST_F(CommandLineTest, Parse_BadNumbers_NameFlagAndType) {
  absl::StatusOr<ParsedCommandLine> parsed =
      Parse(spec_, {"--test-count", "abc"});
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(),
            "--test-count: expected an integer, got 'abc'");
  parsed = Parse(spec_, {"--test-ratio=half"});
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(),
            "--test-ratio: expected a number, got 'half'");
}

TEST_F(CommandLineTest, Parse_MissingValue_SaysHowToGiveOne) {
  absl::StatusOr<ParsedCommandLine> parsed = Parse(spec_, {"--test-count"});
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(),
              HasSubstr("--test-count needs a value"));
}

TEST_F(CommandLineTest, Parse_OptionalFlag_UnsetUntilGiven) {
  ASSERT_TRUE(Parse(spec_, {}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_rank), std::nullopt);
  ASSERT_TRUE(Parse(spec_, {"--test-rank", "2"}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_rank), 2);
  ASSERT_TRUE(Parse(spec_, {"--test-rank="}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_rank), std::nullopt);
  absl::StatusOr<ParsedCommandLine> parsed = Parse(spec_, {"--test-rank=x"});
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(),
            "--test-rank: expected an integer, got 'x'");
}

TEST_F(CommandLineTest, Parse_PositionalWhenNoneTaken_IsRejected) {
  absl::StatusOr<ParsedCommandLine> parsed = Parse(spec_, {"file.txt"});
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(),
              HasSubstr("unexpected argument 'file.txt'"));
}

TEST_F(CommandLineTest, Parse_Positionals_KeptInOrderAndCapped) {
  spec_.positional = "HOST:PORT";
  spec_.max_positional = 1;
  absl::StatusOr<ParsedCommandLine> parsed =
      Parse(spec_, {"--test-count", "1", "host:1", "--test-verbose"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->positional, ElementsAre("host:1"));
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_verbose));
  parsed = Parse(spec_, {"a:1", "b:2"});
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(),
              HasSubstr("takes at most 1 positional argument: HOST:PORT"));

  spec_.max_positional = -1;
  parsed = Parse(spec_, {"a", "--", "--test-count", "-"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->positional, ElementsAre("a", "--test-count", "-"));
  // Still what the first line set: after "--" nothing is a flag.
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 1);
}

TEST_F(CommandLineTest, Parse_Help_StopsReadingWithFlagsBeforeItSet) {
  for (const char* help : {"--help", "-h"}) {
    absl::StatusOr<ParsedCommandLine> parsed =
        Parse(spec_, {"--test-count=9", help, "--no-such-flag"});
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_TRUE(parsed->help);
    EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 9);
  }
}

TEST_F(CommandLineTest, Parse_ShortName_MeansItsLongFlag) {
  spec_.short_names = {{"v", "test-verbose"}};
  ASSERT_TRUE(Parse(spec_, {"-v"}).ok());
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_verbose));
}

TEST_F(CommandLineTest, Help_ListsUsageAndEveryFlagInKebabCase) {
  const std::string help = CommandLineHelp(spec_);
  EXPECT_EQ(help.rfind("usage: prog [--test-count N]\n", 0), 0u) << help;
  EXPECT_THAT(help, HasSubstr("--test-count"));
  EXPECT_THAT(help, HasSubstr("how many (default: 3)"));
  EXPECT_THAT(help, HasSubstr("--test-verbose"));
  EXPECT_THAT(help, HasSubstr("say more"));
  // No default shown for an unset optional, an empty string or a false
  // boolean.
  EXPECT_THAT(help, Not(HasSubstr("a rank when given (default")));
  EXPECT_THAT(help, Not(HasSubstr("a name (default")));
  EXPECT_THAT(help, Not(HasSubstr("say more (default")));
  EXPECT_THAT(help, Not(HasSubstr("test_count")));
  // Sorted by name.
  EXPECT_LT(help.find("--test-count"), help.find("--test-name"));
  EXPECT_LT(help.find("--test-ratio"), help.find("--test-verbose"));
}

TEST_F(CommandLineTest, FlagNames_SortedDashed) {
  const std::vector<std::string> names = FlagNames();
  EXPECT_THAT(names, ElementsAre("--test-count", "--test-name", "--test-rank",
                                 "--test-ratio", "--test-verbose"));
}

}  // namespace
}  // namespace tandem
