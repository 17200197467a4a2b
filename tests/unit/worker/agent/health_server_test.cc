// The worker's grpc.health.v1 server over loopback, through the generated
// client stub (what tandem-health and Kubernetes' gRPC probes speak).
#include "worker/agent/health_server.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace tandem {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

class HealthServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<HealthServer>> server =
        HealthServer::Start("127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = Health::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                            grpc::InsecureChannelCredentials()));
  }

  // The status, or -code for an RPC error.
  int Check(const std::string& service) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    grpc::Status status = stub_->Check(&context, request, &response);
    if (!status.ok()) return -static_cast<int>(status.error_code());
    return response.status();
  }

  std::unique_ptr<HealthServer> server_;
  std::unique_ptr<Health::Stub> stub_;
};

TEST_F(HealthServerTest, Start_AliveButNotReady) {
  EXPECT_GT(server_->port(), 0);
  EXPECT_EQ(Check(""), HealthCheckResponse::SERVING);
  EXPECT_EQ(Check("ready"), HealthCheckResponse::NOT_SERVING);
}

TEST_F(HealthServerTest, SetReady_TogglesReadinessOnly) {
  server_->SetReady(true);
  EXPECT_EQ(Check("ready"), HealthCheckResponse::SERVING);
  server_->SetReady(false);
  EXPECT_EQ(Check("ready"), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Check(""), HealthCheckResponse::SERVING);
}

TEST_F(HealthServerTest, Check_UnknownService_NotFound) {
  EXPECT_EQ(Check("tandem.v1.JobService"),
            -static_cast<int>(grpc::StatusCode::NOT_FOUND));
}

TEST_F(HealthServerTest, Watch_ReadinessChanges_StreamsEachStatus) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  HealthCheckRequest request;
  request.set_service("ready");
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader =
      stub_->Watch(&context, request);
  HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  server_->SetReady(true);
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  // Shutdown: NOT_SERVING, then the stream ends. (Join before asserting: a
  // failed ASSERT must not leave the thread joinable.)
  std::thread stopper([&] { server_->Shutdown(); });
  const bool got_last = reader->Read(&response);
  const auto last = response.status();
  const bool got_more = got_last && reader->Read(&response);
  stopper.join();
  ASSERT_TRUE(got_last);
  EXPECT_EQ(last, HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(got_more);
}

TEST_F(HealthServerTest, Watch_UnknownService_ServiceUnknown) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  HealthCheckRequest request;
  request.set_service("nope");
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader =
      stub_->Watch(&context, request);
  HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVICE_UNKNOWN);
  context.TryCancel();
}

TEST_F(HealthServerTest, Shutdown_PortCloses) {
  server_->Shutdown();
  server_->SetReady(true);  // ignored
  EXPECT_EQ(Check(""), -static_cast<int>(grpc::StatusCode::UNAVAILABLE));
}

TEST(HealthServerStartTest, Start_PortTaken_UnavailableNamesFlag) {
  absl::StatusOr<std::unique_ptr<HealthServer>> first =
      HealthServer::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok());
  absl::StatusOr<std::unique_ptr<HealthServer>> second =
      HealthServer::Start(absl::StrCat("127.0.0.1:", (*first)->port()));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("--health-listen"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
