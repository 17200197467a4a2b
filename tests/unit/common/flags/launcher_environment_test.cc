#include "common/flags/launcher_environment.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

Environment Env(absl::flat_hash_map<std::string, std::string> variables) {
  return Environment(std::move(variables));
}

TEST(LauncherEnvironmentTest, Get_EmptyCountsAsUnset) {
  const Environment env = Env({{"A", "1"}, {"B", ""}});
  EXPECT_EQ(env.Get("A"), "1");
  EXPECT_EQ(env.Get("B"), std::nullopt);
  EXPECT_EQ(env.Get("C"), std::nullopt);
}

TEST(LauncherEnvironmentTest, Process_ReadsTheProcessEnvironment) {
  ASSERT_EQ(setenv("TANDEM_LAUNCHER_ENVIRONMENT_TEST", "42", 1), 0);
  EXPECT_EQ(Environment::Process().Get("TANDEM_LAUNCHER_ENVIRONMENT_TEST"),
            "42");
  unsetenv("TANDEM_LAUNCHER_ENVIRONMENT_TEST");
  EXPECT_EQ(Environment::Process().Get("TANDEM_LAUNCHER_ENVIRONMENT_TEST"),
            std::nullopt);
}

TEST(LauncherEnvironmentTest, Rank_RankBeforeSlurmProcid) {
  auto rank = RankFromEnvironment(Env({{"RANK", "3"}, {"SLURM_PROCID", "5"}}));
  ASSERT_TRUE(rank.ok()) << rank.status();
  ASSERT_TRUE(rank->has_value());
  EXPECT_EQ((*rank)->value, 3);
  EXPECT_EQ((*rank)->source, "RANK");

  rank = RankFromEnvironment(Env({{"SLURM_PROCID", "5"}}));
  ASSERT_TRUE(rank.ok() && rank->has_value());
  EXPECT_EQ((*rank)->value, 5);
  EXPECT_EQ((*rank)->source, "SLURM_PROCID");

  rank = RankFromEnvironment(Env({}));
  ASSERT_TRUE(rank.ok());
  EXPECT_FALSE(rank->has_value());
}

TEST(LauncherEnvironmentTest, Rank_NotANonNegativeInteger_NamesTheVariable) {
  for (const char* bad : {"x", "-1", "1.5"}) {
    auto rank = RankFromEnvironment(Env({{"RANK", bad}}));
    ASSERT_FALSE(rank.ok()) << bad;
    EXPECT_THAT(
        rank.status().message(),
        HasSubstr(absl::StrCat("RANK='", bad, "' is not an integer >= 0")));
    EXPECT_THAT(rank.status().message(), HasSubstr("--rank"));
  }
}

TEST(LauncherEnvironmentTest, WorldSize_SlurmNtasksOnlyInsideATask) {
  auto world = WorldSizeFromEnvironment(
      Env({{"WORLD_SIZE", "4"}, {"SLURM_NTASKS", "8"}, {"SLURM_PROCID", "0"}}));
  ASSERT_TRUE(world.ok() && world->has_value());
  EXPECT_EQ((*world)->value, 4);
  EXPECT_EQ((*world)->source, "WORLD_SIZE");

  world = WorldSizeFromEnvironment(
      Env({{"SLURM_NTASKS", "8"}, {"SLURM_PROCID", "1"}}));
  ASSERT_TRUE(world.ok() && world->has_value());
  EXPECT_EQ((*world)->value, 8);
  EXPECT_EQ((*world)->source, "SLURM_NTASKS");

  // An salloc shell: SLURM_NTASKS, but this process is no task.
  world = WorldSizeFromEnvironment(Env({{"SLURM_NTASKS", "8"}}));
  ASSERT_TRUE(world.ok());
  EXPECT_FALSE(world->has_value());
}

TEST(LauncherEnvironmentTest, WorldSize_Zero_IsRejected) {
  auto world = WorldSizeFromEnvironment(Env({{"WORLD_SIZE", "0"}}));
  ASSERT_FALSE(world.ok());
  EXPECT_THAT(world.status().message(),
              HasSubstr("WORLD_SIZE='0' is not an integer >= 1"));
  EXPECT_THAT(world.status().message(), HasSubstr("--world"));
}

TEST(LauncherEnvironmentTest, Rendezvous_MasterAddrAndPort) {
  auto rv = RendezvousFromEnvironment(
      Env({{"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(rv.ok()) << rv.status();
  ASSERT_TRUE(rv->has_value());
  EXPECT_EQ((*rv)->value, "node0:29500");
  EXPECT_EQ((*rv)->source, "MASTER_ADDR:MASTER_PORT");

  rv = RendezvousFromEnvironment(Env({}));
  ASSERT_TRUE(rv.ok());
  EXPECT_FALSE(rv->has_value());
}

TEST(LauncherEnvironmentTest, Rendezvous_HalfSetOrBadPort_SaysWhatToSet) {
  auto rv = RendezvousFromEnvironment(Env({{"MASTER_ADDR", "node0"}}));
  ASSERT_FALSE(rv.ok());
  EXPECT_THAT(rv.status().message(),
              HasSubstr("MASTER_ADDR is set but MASTER_PORT is not"));
  EXPECT_THAT(rv.status().message(), HasSubstr("--rendezvous"));

  rv = RendezvousFromEnvironment(Env({{"MASTER_PORT", "29500"}}));
  ASSERT_FALSE(rv.ok());
  EXPECT_THAT(rv.status().message(),
              HasSubstr("MASTER_PORT is set but MASTER_ADDR is not"));

  rv = RendezvousFromEnvironment(
      Env({{"MASTER_ADDR", "node0"}, {"MASTER_PORT", "0"}}));
  ASSERT_FALSE(rv.ok());
  EXPECT_THAT(rv.status().message(),
              HasSubstr("MASTER_PORT='0' is not a port in 1..65535"));
}

TEST(LauncherEnvironmentTest, Rendezvous_TorchrunAgentStore_IsRefused) {
  auto rv = RendezvousFromEnvironment(
      Env({{"MASTER_ADDR", "node0"},
           {"MASTER_PORT", "29500"},
           {"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
  ASSERT_FALSE(rv.ok());
  EXPECT_EQ(rv.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(rv.status().message(), HasSubstr("--rdzv-backend=c10d"));

  rv = RendezvousFromEnvironment(
      Env({{"MASTER_ADDR", "node0"},
           {"MASTER_PORT", "29500"},
           {"TORCHELASTIC_USE_AGENT_STORE", "False"}}));
  ASSERT_TRUE(rv.ok()) << rv.status();
  EXPECT_EQ((*rv)->value, "node0:29500");
}

TEST(LauncherEnvironmentTest, JoinSecret_FileBeforeVariable) {
  const std::string path = ::testing::TempDir() + "/join-secret";
  { std::ofstream(path) << "  tjs-from-file\n"; }
  const Environment env = Env({{"TANDEM_JOIN_SECRET", "tjs-from-env"}});
  EXPECT_EQ(ReadJoinSecret(path, env).value_or(""), "tjs-from-file");
  EXPECT_EQ(ReadJoinSecret("", env).value_or(""), "tjs-from-env");
  EXPECT_EQ(ReadJoinSecret("", Env({})).value_or("x"), "");
  std::remove(path.c_str());
}

TEST(LauncherEnvironmentTest, JoinSecret_BadValuesNameTheirSource) {
  absl::StatusOr<std::string> missing =
      ReadJoinSecret("/nonexistent/secret", Env({}));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("--join-secret-file: cannot read /nonexistent/secret"));
  absl::StatusOr<std::string> spaced =
      ReadJoinSecret("", Env({{"TANDEM_JOIN_SECRET", "two words"}}));
  ASSERT_FALSE(spaced.ok());
  EXPECT_THAT(std::string(spaced.status().message()),
              HasSubstr("$TANDEM_JOIN_SECRET: a join secret is"));
}

}  // namespace
}  // namespace tandem
