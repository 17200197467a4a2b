// --device and LOCAL_RANK resolved into a device and a collective backend,
// against stated builds and machines (so the CUDA rules are tested on a
// CPU-only build too), and the runtime activated on this build.
#include "worker/trainer/runtime_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "ATen/Parallel.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

CudaAvailability Gpus(int visible, bool nccl = true) {
  CudaAvailability cuda;
  cuda.built = true;
  cuda.nccl = nccl;
  cuda.visible_devices = visible;
  return cuda;
}

TEST(ParseDeviceChoiceTest, ParseDeviceChoice_KnownValues_Parsed) {
  EXPECT_EQ(*ParseDeviceChoice("auto"), DeviceChoice::kAuto);
  EXPECT_EQ(*ParseDeviceChoice("cpu"), DeviceChoice::kCpu);
  EXPECT_EQ(*ParseDeviceChoice("cuda"), DeviceChoice::kCuda);
}

TEST(ParseDeviceChoiceTest,
     ParseDeviceChoice_Unknown_InvalidArgumentNamesFlag) {
  absl::StatusOr<DeviceChoice> choice = ParseDeviceChoice("gpu");
  EXPECT_EQ(choice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(choice.status().message()), HasSubstr("--device"));
  EXPECT_THAT(std::string(choice.status().message()),
              HasSubstr("auto, cpu or cuda"));
}

TEST(ParseLocalRankTest, ParseLocalRank_LocalRankSet_WinsOverSlurm) {
  EXPECT_EQ(*ParseLocalRank("3", "1"), 3);
}

TEST(ParseLocalRankTest, ParseLocalRank_OnlySlurmLocalId_UsesIt) {
  EXPECT_EQ(*ParseLocalRank(nullptr, "2"), 2);
  EXPECT_EQ(*ParseLocalRank("", "2"), 2);
}

TEST(ParseLocalRankTest, ParseLocalRank_NeitherSet_Zero) {
  EXPECT_EQ(*ParseLocalRank(nullptr, nullptr), 0);
}

TEST(ParseLocalRankTest,
     ParseLocalRank_Malformed_InvalidArgumentNamesVariable) {
  absl::StatusOr<int> bad = ParseLocalRank("one", nullptr);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("LOCAL_RANK='one'"));
  bad = ParseLocalRank(nullptr, "-1");
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("SLURM_LOCALID='-1'"));
}

TEST(ResolveRuntimeOptionsTest, Resolve_Cpu_CpuWithGloo) {
  absl::StatusOr<RuntimeOptions> r =
      ResolveRuntimeOptions(DeviceChoice::kCpu, 1, Gpus(2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->device.str(), "cpu");
  EXPECT_EQ(r->backend, CollectiveBackend::kGloo);
  EXPECT_EQ(DescribeRuntime(*r), "cpu with gloo");
}

TEST(ResolveRuntimeOptionsTest, Resolve_AutoWithoutCuda_Cpu) {
  EXPECT_EQ(ResolveRuntimeOptions(DeviceChoice::kAuto, 0, CudaAvailability())
                ->device.str(),
            "cpu");
  EXPECT_EQ(
      ResolveRuntimeOptions(DeviceChoice::kAuto, 0, Gpus(0))->device.str(),
      "cpu");
  EXPECT_EQ(ResolveRuntimeOptions(DeviceChoice::kAuto, 0, Gpus(1, false))
                ->device.str(),
            "cpu");
}

TEST(ResolveRuntimeOptionsTest, Resolve_AutoWithGpus_LocalRanksGpuWithNccl) {
  absl::StatusOr<RuntimeOptions> r =
      ResolveRuntimeOptions(DeviceChoice::kAuto, 1, Gpus(2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->device.str(), "cuda:1");
  EXPECT_EQ(r->backend, CollectiveBackend::kNccl);
  EXPECT_EQ(DescribeRuntime(*r), "cuda:1 with nccl");
}

TEST(ResolveRuntimeOptionsTest,
     Resolve_CudaOnCpuOnlyBuild_FailedPreconditionSaysRebuild) {
  absl::StatusOr<RuntimeOptions> r =
      ResolveRuntimeOptions(DeviceChoice::kCuda, 0, CudaAvailability());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("CPU-only"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("--device cpu"));
}

TEST(ResolveRuntimeOptionsTest, Resolve_CudaWithoutNccl_FailedPrecondition) {
  absl::StatusOr<RuntimeOptions> r =
      ResolveRuntimeOptions(DeviceChoice::kCuda, 0, Gpus(1, false));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("TANDEM_WITH_NCCL"));
}

TEST(ResolveRuntimeOptionsTest, Resolve_CudaNoGpuVisible_FailedPrecondition) {
  absl::StatusOr<RuntimeOptions> r =
      ResolveRuntimeOptions(DeviceChoice::kCuda, 0, Gpus(0));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no GPU"));
}

TEST(ResolveRuntimeOptionsTest,
     Resolve_LocalRankBeyondGpus_FailedPrecondition) {
  absl::StatusOr<RuntimeOptions> r =
      ResolveRuntimeOptions(DeviceChoice::kCuda, 2, Gpus(2));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("local rank 2 (LOCAL_RANK) needs GPU cuda:2"));
}

TEST(ResolveRuntimeOptionsTest, Resolve_OneVisibleGpu_Cuda0WhateverLocalRank) {
  absl::StatusOr<RuntimeOptions> r =
      ResolveRuntimeOptions(DeviceChoice::kCuda, 5, Gpus(1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->device.str(), "cuda:0");
}

TEST(ThisBuildsCudaTest, ThisBuildsCuda_MatchesTheBuild) {
  const CudaAvailability cuda = ThisBuildsCuda();
#ifdef TANDEM_WITH_CUDA
  EXPECT_TRUE(cuda.built);
  EXPECT_GE(cuda.visible_devices, 0);
#else
  EXPECT_FALSE(cuda.built);
  EXPECT_EQ(cuda.visible_devices, 0);
#endif
#ifdef TANDEM_WITH_NCCL
  EXPECT_TRUE(cuda.nccl);
#else
  EXPECT_FALSE(cuda.nccl);
#endif
}

TEST(ActivateRuntimeTest, ActivateRuntime_Cpu_CountingAllocatorMeter) {
  absl::StatusOr<MemoryMeter*> meter = ActivateRuntime(RuntimeOptions());
  ASSERT_TRUE(meter.ok()) << meter.status();
  EXPECT_EQ(*meter, CountingCpuAllocator::Get());
}

TEST(ActivateRuntimeTest, ActivateRuntime_NcclOnCpu_InvalidArgument) {
  RuntimeOptions options;
  options.backend = CollectiveBackend::kNccl;
  absl::StatusOr<MemoryMeter*> meter = ActivateRuntime(options);
  EXPECT_EQ(meter.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(meter.status().message()), HasSubstr("use gloo"));
}

#ifndef TANDEM_WITH_NCCL
TEST(ActivateRuntimeTest,
     ActivateRuntime_CudaOnBuildWithoutNccl_FailedPrecondition) {
  RuntimeOptions options;
  options.device = c10::Device(c10::DeviceType::CUDA, 0);
  options.backend = CollectiveBackend::kNccl;
  absl::StatusOr<MemoryMeter*> meter = ActivateRuntime(options);
  EXPECT_EQ(meter.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(meter.status().message()), HasSubstr("no nccl"));
}
#endif

TEST(TrainingJobOptionsForTest, TrainingJobOptionsFor_Cpu_CarriesOffloadDir) {
  absl::StatusOr<TrainingJobOptions> job =
      TrainingJobOptionsFor(RuntimeOptions(), "/tmp/offload");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->offload_dir, "/tmp/offload");
}

// --threads reaches OpenBLAS's pool (libtorch's BLAS on Debian), which
// at::set_num_threads alone leaves at one thread per core; an
// OPENBLAS_NUM_THREADS the user set wins.
TEST(SetComputeThreadsTest, OpenBlasPool_FollowsThreadsUnlessEnvironmentSet) {
  const char* env = std::getenv("OPENBLAS_NUM_THREADS");
  const std::string saved = env == nullptr ? "" : env;
  unsetenv("OPENBLAS_NUM_THREADS");
  const int torch_before = at::get_num_threads();
  const int before = SetComputeThreads(0);
  if (before == 0) GTEST_SKIP() << "libtorch's BLAS is not OpenBLAS here";
  EXPECT_EQ(SetComputeThreads(1), 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_EQ(SetComputeThreads(2), 2);
  setenv("OPENBLAS_NUM_THREADS", "2", 1);
  EXPECT_EQ(SetComputeThreads(1), 2);
  unsetenv("OPENBLAS_NUM_THREADS");
  SetComputeThreads(before);
  at::set_num_threads(torch_before);
  if (env != nullptr) setenv("OPENBLAS_NUM_THREADS", saved.c_str(), 1);
}

}  // namespace
}  // namespace tandem
