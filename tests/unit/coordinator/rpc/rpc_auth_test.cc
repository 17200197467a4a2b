// Who may call what (rpc_auth.h), without a network: the credential checks
// on their own. test_auth.py runs them through real processes.
#include "coordinator/rpc/rpc_auth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "coordinator/service/job_manager.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

constexpr char kAlice[] = "alice-token-0123456789";
constexpr char kBob[] = "bob-token-0123456789xx";
constexpr char kRoot[] = "root-token-0123456789abcdef";

std::unique_ptr<TokenFile> Tokens() {
  const std::string path = ::testing::TempDir() + "/rpc-auth-tokens";
  {
    std::ofstream(path) << kAlice << " alice\n"
                        << kBob << " bob\n"
                        << kRoot << " root admin\n";
  }
  absl::StatusOr<std::unique_ptr<TokenFile>> file = TokenFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  std::remove(path.c_str());
  return *std::move(file);
}

JoinSecrets Secrets() { return JoinSecrets(std::string(32, 'k')); }

v1::Job JobOf(const std::string& owner) {
  v1::Job job;
  job.set_id("j-1");
  job.set_owner(owner);
  return job;
}

std::string Bearer(const char* token) { return absl::StrCat("Bearer ", token); }

TEST(JoinSecretsTest, OneSecretPerJobStableForAKey) {
  JoinSecrets secrets = Secrets();
  const std::string a = secrets.For("j-a");
  EXPECT_EQ(a.size(), 4u + 64u);
  EXPECT_EQ(a.substr(0, 4), "tjs-");
  EXPECT_EQ(a, JoinSecrets(std::string(32, 'k')).For("j-a"));
  EXPECT_NE(a, secrets.For("j-b"));
  EXPECT_NE(a, JoinSecrets(std::string(32, 'x')).For("j-a"));
  EXPECT_TRUE(secrets.Matches("j-a", a));
  EXPECT_FALSE(secrets.Matches("j-b", a));
  EXPECT_FALSE(secrets.Matches("j-a", ""));
}

TEST(RpcAuthTest, OffAdmitsEveryone) {
  RpcAuth auth(nullptr, Secrets(), false);
  EXPECT_FALSE(auth.enabled());
  Principal caller;
  ASSERT_TRUE(auth.Authenticate(std::nullopt, &caller).ok());
  EXPECT_TRUE(caller.admin);
  EXPECT_TRUE(auth.MayAccess(caller, JobOf("alice")).ok());
  EXPECT_FALSE(auth.ListFilter(caller).has_value());
  EXPECT_TRUE(auth.CheckWorker(std::nullopt, false, "j-1").ok());
}

TEST(RpcAuthTest, UsersNeedAKnownBearerToken) {
  RpcAuth auth(Tokens(), Secrets(), false);
  Principal caller;
  grpc::Status none = auth.Authenticate(std::nullopt, &caller);
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.error_message(), HasSubstr("no token"));
  EXPECT_THAT(none.error_message(), HasSubstr("TANDEM_TOKEN"));

  grpc::Status unknown =
      auth.Authenticate(std::string("Bearer nobody-0123456789abc"), &caller);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(unknown.error_message(), HasSubstr("unknown token"));

  grpc::Status basic = auth.Authenticate(std::string("Basic abc"), &caller);
  EXPECT_EQ(basic.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(basic.error_message(), HasSubstr("Bearer TOKEN"));

  ASSERT_TRUE(auth.Authenticate(Bearer(kAlice), &caller).ok());
  EXPECT_EQ(caller.user, "alice");
  EXPECT_FALSE(caller.admin);
}

TEST(RpcAuthTest, JobsAreTheirOwnersOrAnAdmins) {
  RpcAuth auth(Tokens(), Secrets(), false);
  Principal alice, bob, root;
  ASSERT_TRUE(auth.Authenticate(Bearer(kAlice), &alice).ok());
  ASSERT_TRUE(auth.Authenticate(Bearer(kBob), &bob).ok());
  ASSERT_TRUE(auth.Authenticate(Bearer(kRoot), &root).ok());
  EXPECT_TRUE(auth.MayAccess(alice, JobOf("alice")).ok());
  EXPECT_TRUE(auth.MayAccess(root, JobOf("alice")).ok());
  // Another user's job reads as one that does not exist: a stranger cannot
  // tell which ids do.
  grpc::Status denied = auth.MayAccess(bob, JobOf("alice"));
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(denied.error_message(), NoSuchJob("j-1"));
  EXPECT_EQ(auth.ListFilter(bob).value_or(""), "bob");
  EXPECT_FALSE(auth.ListFilter(root).has_value());
}

TEST(RpcAuthTest, WorkersNeedTheJobsJoinSecret) {
  RpcAuth auth(Tokens(), Secrets(), false);
  const std::string secret = Secrets().For("j-1");
  EXPECT_TRUE(auth.CheckWorker(secret, false, "j-1").ok());

  grpc::Status none = auth.CheckWorker(std::nullopt, false, "j-1");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.error_message(), HasSubstr("no join secret"));
  EXPECT_THAT(none.error_message(), HasSubstr("tandem join-secret j-1"));

  grpc::Status other = auth.CheckWorker(Secrets().For("j-2"), false, "j-1");
  EXPECT_EQ(other.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(other.error_message(),
              HasSubstr("wrong join secret for job j-1"));
}

TEST(RpcAuthTest, WorkerCertificateRequiredWithClientCa) {
  RpcAuth auth(nullptr, Secrets(), true);
  grpc::Status no_cert = auth.CheckWorker(std::nullopt, false, "j-1");
  EXPECT_EQ(no_cert.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(no_cert.error_message(), HasSubstr("client certificate"));
  EXPECT_TRUE(auth.CheckWorker(std::nullopt, true, "j-1").ok());
}

TEST(RpcAuthTest, RendezvousKeysBelongToTheirJob) {
  EXPECT_EQ(JobOfKey("jobs/j-1/rank0").value_or(""), "j-1");
  EXPECT_EQ(JobOfKey("jobs/j-1/").value_or(""), "j-1");
  EXPECT_FALSE(JobOfKey("jobs/j-1").has_value());
  EXPECT_FALSE(JobOfKey("jobs//x").has_value());
  EXPECT_FALSE(JobOfKey("other/j-1/x").has_value());
  EXPECT_FALSE(JobOfKey("").has_value());
}

}  // namespace
}  // namespace tandem
