// Standalone training in process at world 1: the CPU run's JSON lines are
// reproducible, and the same run on CUDA (NCCL) matches the CPU's losses
// (skipped where the build or the machine has no GPU).
#include "worker/standalone/standalone_trainer.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/ir/text_format.h"
#include "common/job/job_spec.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "worker/runtime/standard_schedules.h"
#include "worker/trainer/runtime_options.h"

namespace tandem {
namespace {

constexpr int kSteps = 6;
// CUDA against CPU: cuBLAS and the CPU kernels sum in different orders
// (TF32 is off for fp32 matmuls by default), so each loss agrees to fp32
// rounding, amplified a little by AdamW over a few steps.
constexpr double kLossRelTolerance = 1e-3;

v1::JobSpec TinySpec() {
  v1::JobSpec spec;
  spec.set_name("standalone-trainer");
  spec.mutable_model()->set_preset("llama");
  spec.mutable_model()->set_layers(2);
  spec.mutable_model()->set_d_model(32);
  spec.mutable_model()->set_heads(2);
  spec.mutable_model()->set_ffn(64);
  spec.mutable_model()->set_vocab(64);
  spec.mutable_batch()->set_micro_batch(2);
  spec.mutable_batch()->set_seq_len(16);
  spec.mutable_train()->set_steps(kSteps);
  ApplyJobSpecDefaults(spec);
  return spec;
}

// A port nothing listens on now (rank 0's TCPStore takes it).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

absl::StatusOr<std::string> Train(const RuntimeOptions& runtime,
                                  v1::JobSpec spec = TinySpec(),
                                  std::string* partial = nullptr) {
  StandaloneOptions options;
  options.spec = std::move(spec);
  options.rendezvous.port = FreePort();
  options.rendezvous.rank = 0;
  options.rendezvous.world_size = 1;
  options.rendezvous.timeout = std::chrono::seconds(60);
  options.threads = 1;
  options.runtime = runtime;
  std::ostringstream out;
  absl::Status status = RunStandalone(options, out);
  if (partial != nullptr) *partial = out.str();
  if (!status.ok()) return status;
  return out.str();
}

// The number `field` ("loss", "loss_scale") of every step line that has it.
std::vector<double> Field(const std::string& out, const std::string& field) {
  const std::string key = "\"" + field + "\":";
  std::vector<double> values;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    const size_t at = line.find(key);
    if (at == absl::string_view::npos) continue;
    absl::string_view rest = line.substr(at + key.size());
    rest = rest.substr(0, rest.find(','));
    double value = 0;
    EXPECT_TRUE(absl::SimpleAtod(rest, &value)) << line;
    values.push_back(value);
  }
  return values;
}

std::vector<double> Losses(const std::string& out) {
  return Field(out, "loss");
}

TEST(StandaloneTrainerTest, RunStandalone_CpuTwice_SameLinesEveryStep) {
  absl::StatusOr<std::string> first = Train(RuntimeOptions());
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::string> second = Train(RuntimeOptions());
  ASSERT_TRUE(second.ok()) << second.status();

  const std::vector<double> losses = Losses(*first);
  ASSERT_EQ(losses.size(), static_cast<size_t>(kSteps));
  for (double loss : losses) EXPECT_TRUE(std::isfinite(loss) && loss > 0);
  // Seeded data and init: the same losses, bit for bit.
  EXPECT_EQ(Losses(*second), losses);
  EXPECT_THAT(*first, ::testing::HasSubstr("\"steps\":6,\"rank\":0"));
}

// Training that diverges (a learning rate of 1e30, no clipping): the step
// whose loss is not finite is still printed, as valid JSON, and then the
// job stops with the step it happened at; with on_nonfinite: continue it
// trains on.
TEST(StandaloneTrainerTest, RunStandalone_Diverges_StopsWithValidJson) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_train()->set_lr(1e30);
  spec.mutable_train()->set_grad_clip(0);
  std::string out;
  absl::StatusOr<std::string> stopped = Train(RuntimeOptions(), spec, &out);
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(stopped.status().message()),
              ::testing::ContainsRegex(
                  "loss became (NaN|inf|-inf) at step [0-9]+ "
                  "\\(train.on_nonfinite: stop\\): training diverged"));
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    google::protobuf::Struct parsed;
    EXPECT_TRUE(
        google::protobuf::util::JsonStringToMessage(std::string(line), &parsed)
            .ok())
        << line;
    ++lines;
  }
  EXPECT_GE(lines, 1);
  EXPECT_LT(lines, kSteps);
  EXPECT_THAT(out, ::testing::HasSubstr("\"loss\":null,\"loss_nonfinite\":"));

  spec.mutable_train()->set_on_nonfinite("continue");
  absl::StatusOr<std::string> went_on = Train(RuntimeOptions(), spec);
  ASSERT_TRUE(went_on.ok()) << went_on.status();
  EXPECT_THAT(*went_on, ::testing::HasSubstr("\"steps\":6,\"rank\":0"));
}

// f16 has CUDA kernels only: a CPU rank refuses it before it trains,
// saying why (the coordinator refuses such a rank when it registers).
TEST(StandaloneTrainerTest, RunStandalone_F16OnCpu_RefusedSayingWhy) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_model()->set_dtype(v1::DTYPE_F16);
  spec.mutable_train()->clear_loss_scale();
  spec.mutable_train()->clear_reduce_dtype();
  ApplyJobSpecDefaults(spec);
  absl::StatusOr<std::string> out = Train(RuntimeOptions(), spec);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(out.status().message()),
              ::testing::HasSubstr(
                  "rank 0 reports device cpu, but model.dtype f16 needs a "
                  "CUDA device on every rank"));
}

// Loss scaling on an f32 job: the step lines carry the scale, and a job
// resumed from a checkpoint goes on with the scaler's state (the scale and
// its growth count), so it repeats the uninterrupted run's lines exactly.
TEST(StandaloneTrainerTest, RunStandalone_LossScaling_ResumesTheScale) {
  char whole_dir[] = "/tmp/tandem_scale_whole_XXXXXX";
  char split_dir[] = "/tmp/tandem_scale_split_XXXXXX";
  ASSERT_NE(mkdtemp(whole_dir), nullptr);
  ASSERT_NE(mkdtemp(split_dir), nullptr);
  v1::JobSpec spec = TinySpec();
  v1::LossScaleSpec& ls = *spec.mutable_train()->mutable_loss_scale();
  ls.set_mode("dynamic");
  ls.set_init_scale(1024);
  ls.set_growth_interval(2);
  ApplyJobSpecDefaults(spec);
  spec.mutable_checkpoint()->set_every(3);

  spec.mutable_checkpoint()->set_dir(whole_dir);
  absl::StatusOr<std::string> whole = Train(RuntimeOptions(), spec);
  ASSERT_TRUE(whole.ok()) << whole.status();
  // GradScaler with growth every 2 clean steps.
  EXPECT_EQ(Field(*whole, "loss_scale"),
            (std::vector<double>{1024, 1024, 2048, 2048, 4096, 4096}));
  EXPECT_THAT(*whole, ::testing::HasSubstr("\"skipped\":false"));

  spec.mutable_checkpoint()->set_dir(split_dir);
  spec.mutable_train()->set_steps(3);
  absl::StatusOr<std::string> first = Train(RuntimeOptions(), spec);
  ASSERT_TRUE(first.ok()) << first.status();
  spec.mutable_train()->set_steps(kSteps);
  absl::StatusOr<std::string> rest = Train(RuntimeOptions(), spec);
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(Field(*rest, "loss_scale"),
            (std::vector<double>{2048, 4096, 4096}));
  const std::vector<double> all = Losses(*whole);
  ASSERT_EQ(all.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(Losses(*rest), std::vector<double>(all.begin() + 3, all.end()));
  std::filesystem::remove_all(whole_dir);
  std::filesystem::remove_all(split_dir);
}

// --alternate: the two schedules take turns in blocks after the first step,
// the alternate first, and each step line says which ran. A bad
// alternate is refused before training.
TEST(StandaloneTrainerTest, RunStandalone_Alternate_BlocksOfEachSchedule) {
  char dir[] = "/tmp/tandem_alternate_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string graph_path = std::string(dir) + "/graph.txt";
  v1::JobSpec spec = TinySpec();
  spec.mutable_train()->set_steps(1);
  StandaloneOptions options;
  options.spec = spec;
  options.rendezvous.port = FreePort();
  options.rendezvous.world_size = 1;
  options.rendezvous.timeout = std::chrono::seconds(60);
  options.threads = 1;
  options.graph_out = graph_path;
  std::ostringstream ignored;
  ASSERT_TRUE(RunStandalone(options, ignored).ok());
  std::ifstream graph_in(graph_path);
  std::stringstream graph_text;
  graph_text << graph_in.rdbuf();
  absl::StatusOr<Graph> graph = ParseGraph(graph_text.str());
  ASSERT_TRUE(graph.ok()) << graph.status();
  absl::StatusOr<Schedule> prefetch = HoistGathers(
      *graph, *BaselineSchedule(*graph, /*zero_stage=*/3), /*lead=*/1);
  ASSERT_TRUE(prefetch.ok()) << prefetch.status();
  const std::string alternate = std::string(dir) + "/prefetch.sched";
  std::ofstream(alternate) << PrintSchedule(*prefetch);

  options.spec = TinySpec();
  options.spec.mutable_train()->set_steps(10);
  options.graph_out.clear();
  options.alternate_path = alternate;
  options.block_steps = 2;
  options.rendezvous.port = FreePort();
  std::ostringstream out;
  ASSERT_TRUE(RunStandalone(options, out).ok());
  // The baseline is v0; the alternate, not newer, runs as v1.
  EXPECT_EQ(Field(out.str(), "schedule_version"),
            (std::vector<double>{0, 1, 1, 0, 0, 1, 1, 0, 0, 1}));
  // The same numbers as without alternating: both schedules compute the
  // same values.
  absl::StatusOr<std::string> plain = Train(RuntimeOptions(), options.spec);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(Losses(out.str()), Losses(*plain));

  options.alternate_path = std::string(dir) + "/missing.sched";
  options.rendezvous.port = FreePort();
  EXPECT_THAT(std::string(RunStandalone(options, out).message()),
              ::testing::HasSubstr("--alternate: cannot read"));
  options.alternate_path = alternate;
  options.block_steps = 0;
  EXPECT_THAT(std::string(RunStandalone(options, out).message()),
              ::testing::HasSubstr("--block-steps must be >= 1"));
  std::filesystem::remove_all(dir);
}

TEST(StandaloneTrainerTest, RunStandalone_Cuda_MatchesCpuLosses) {
  const CudaAvailability cuda = ThisBuildsCuda();
  if (!cuda.built || !cuda.nccl || cuda.visible_devices == 0) {
    GTEST_SKIP() << "needs a CUDA build with NCCL and a visible GPU";
  }
  absl::StatusOr<RuntimeOptions> gpu =
      ResolveRuntimeOptions(DeviceChoice::kCuda, 0, cuda);
  ASSERT_TRUE(gpu.ok()) << gpu.status();

  absl::StatusOr<std::string> on_cpu = Train(RuntimeOptions());
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  absl::StatusOr<std::string> on_gpu = Train(*gpu);
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();

  const std::vector<double> cpu_losses = Losses(*on_cpu);
  const std::vector<double> gpu_losses = Losses(*on_gpu);
  ASSERT_EQ(cpu_losses.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(gpu_losses.size(), cpu_losses.size());
  for (size_t i = 0; i < cpu_losses.size(); ++i) {
    EXPECT_NEAR(gpu_losses[i], cpu_losses[i],
                kLossRelTolerance * std::abs(cpu_losses[i]))
        << "step " << i;
  }
}

}  // namespace
}  // namespace tandem
