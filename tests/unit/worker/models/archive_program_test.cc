// Exported archives as programs: archives written at test time by
// tests/testdata/make_test_archives.py (hand-written TorchScript units,
// manifest and safetensors, not the exporter) train sharded at worlds 1-3
// under on-demand, prefetch, offload and a mid-run switch exactly as the
// same archive trained unsharded in one process (torch::optim::AdamW and
// clip_grad_norm_ over the trained params); frozen params stay bit for bit
// at their initial values; broken archives and value flows fail with what
// to fix.
#include "worker/models/archive_program.h"

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/lowering/least_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/loopback_world.h"
#include "tests/unit/worker/test_schedules.h"
#include "tests/unit/worker/unsharded_reference.h"
// clip_grad.h needs torch::Tensor declared first.
#include "torch/types.h"
// clang-format off
#include "torch/nn/utils/clip_grad.h"
// clang-format on
#include "torch/optim/adamw.h"
#include "worker/data/micro_batch.h"
#include "worker/data/token_source.h"
#include "worker/runtime/executor.h"
#include "worker/runtime/memory_meter.h"
#include "worker/runtime/standard_schedules.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

constexpr int kSteps = 5;
constexpr int kMicroBatch = 2;
constexpr int kSeqLen = 6;  // the archives' causal mask is 6 x 6
constexpr int kVocab = 16;  // the archives' embedding rows
constexpr uint64_t kSeed = 5;
constexpr double kTolerance = 1e-5;

// The archives, written once per test process and removed at its exit
// (ctest runs each test in a process of its own).
const std::string& ArchiveDir() {
  static const std::string* dir = [] {
    auto* d = new std::string(
        absl::StrCat(::testing::TempDir(), "/tandem_archives_", getpid()));
    // With libc's nftw, not std::filesystem: PyTorch's own libtorch.so
    // (2.11) carries a std::filesystem that the test's calls bind to, and
    // its remove_all called a null function from an atexit handler.
    std::atexit([] {
      nftw(
          ArchiveDir().c_str(),
          [](const char* path, const struct stat*, int, struct FTW*) {
            ::remove(path);  // best effort: go on
            return 0;
          },
          16, FTW_DEPTH | FTW_PHYS);
    });
    // The Python with torch: Debian's python3-torch here, PyTorch's own on
    // a GPU machine (scripts/gpu-check.sh sets TANDEM_PYTHON).
    const char* python = std::getenv("TANDEM_PYTHON");
    const std::string command = absl::StrCat(
        python != nullptr && *python != '\0' ? python : "/usr/bin/python3", " ",
        TANDEM_SOURCE_DIR, "/tests/testdata/make_test_archives.py ", *d);
    const int rc = std::system(command.c_str());
    EXPECT_EQ(rc, 0) << "'" << command
                     << "' failed: the archive tests need a Python with torch "
                        "(Debian's python3-torch, or set TANDEM_PYTHON)";
    return d;
  }();
  return *dir;
}

std::string Archive(const std::string& name) {
  return absl::StrCat(ArchiveDir(), "/", name, ".tandem");
}

AdamWOptions TestAdamW(const std::string& archive) {
  AdamWOptions o;
  o.lr = 1e-3;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  // The attention's key bias has an identically zero gradient (softmax
  // ignores a constant per query), so its computed gradient is rounding
  // noise (~1e-9) that Adam with eps 1e-8 turns into full-size updates,
  // different for any two summation orders. eps 1e-3 keeps that noise out
  // while real gradients (~1e-2) still move every other param.
  o.eps = archive == "leaf" ? 1e-3 : 1e-8;
  o.weight_decay = 0.1;
  o.grad_clip = 0.5;
  return o;
}

// Single process, unsharded, the global batch of world W and grad_accum K
// (K * W * micro_batch sequences) as one micro-batch.
Trajectory TrainReference(const std::string& archive, int world,
                          int grad_accum) {
  absl::StatusOr<Program> program = LoadArchiveProgram(Archive(archive), {});
  EXPECT_TRUE(program.ok()) << program.status();
  Trajectory result;
  if (!program.ok()) return result;
  const int global = world * kMicroBatch * grad_accum;
  // What PyTorch fine-tuning steps and clips: the params that require grad.
  std::vector<at::Tensor> trained;
  std::vector<at::Tensor> params = InitialParams(*program, &trained);
  const AdamWOptions o = TestAdamW(archive);
  std::unique_ptr<torch::optim::AdamW> optimizer = TorchAdamW(trained, o);
  auto data = MakeSyntheticTokens(kSeed, kVocab, kSeqLen);
  absl::StatusOr<TokenInputs> names = TokenInputsOf(*program);
  EXPECT_TRUE(names.ok()) << names.status();
  for (const at::Tensor& p : params) {
    result.initial.push_back(p.detach().clone());
  }
  for (int step = 0; step < kSteps; ++step) {
    auto batches = ReadRankBatches(*data, step, 1, 0, 1, global, *names);
    EXPECT_TRUE(batches.ok());
    at::Tensor loss = RunUnsharded(*program, params, (*batches)[0]);
    result.losses.push_back(loss.item<double>());
    optimizer->zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(trained, o.grad_clip);
    optimizer->step();
  }
  for (const at::Tensor& p : params) result.params.push_back(p.detach());
  return result;
}

struct ShardedRun {
  std::vector<std::vector<double>> losses;
  std::vector<std::vector<int64_t>> versions;
  std::vector<std::vector<double>> digests;
  std::vector<at::Tensor> params;  // rank 0's gathered values
  Graph graph;
};

using ScheduleMaker = std::function<Schedule(const Graph&)>;
using StepHook = std::function<void(int rank, int step, Executor&)>;

ShardedRun TrainSharded(const std::string& archive, int world, int grad_accum,
                        const ScheduleMaker& initial, const StepHook& hook) {
  ShardedRun run;
  run.losses.resize(world);
  run.versions.resize(world);
  run.digests.resize(world);
  RunLoopbackWorld(world, [&](int rank, Communicator& comm) {
    // Each rank loads its own program, as a worker process does.
    absl::StatusOr<Program> program = LoadArchiveProgram(Archive(archive), {});
    ASSERT_TRUE(program.ok()) << program.status();
    absl::StatusOr<Graph> graph =
        DeriveGraph(*program, world, grad_accum, kMicroBatch * kSeqLen);
    ASSERT_TRUE(graph.ok()) << graph.status();
    if (rank == 0) run.graph = *graph;
    auto store = ShardedParamStore::Create(*program, rank, world);
    ASSERT_TRUE(store.ok()) << store.status();
    ExecutorOptions options;
    options.adamw = TestAdamW(archive);
    auto executor =
        Executor::Create(&*program, *graph, store->get(), &comm,
                         CountingCpuAllocator::Get(), initial(*graph), options);
    ASSERT_TRUE(executor.ok()) << executor.status();
    auto data = MakeSyntheticTokens(kSeed, kVocab, kSeqLen);
    absl::StatusOr<TokenInputs> names = TokenInputsOf(*program);
    ASSERT_TRUE(names.ok()) << names.status();
    for (int step = 0; step < kSteps; ++step) {
      if (hook) hook(rank, step, **executor);
      auto batches = ReadRankBatches(*data, step, grad_accum, rank, world,
                                     kMicroBatch, *names);
      ASSERT_TRUE(batches.ok());
      absl::StatusOr<StepStats> stats = (*executor)->RunStep(*batches);
      ASSERT_TRUE(stats.ok()) << "rank " << rank << ": " << stats.status();
      run.losses[rank].push_back(stats->loss);
      run.versions[rank].push_back(stats->schedule_version);
    }
    absl::StatusOr<std::vector<double>> digests = (*executor)->ParamDigests();
    ASSERT_TRUE(digests.ok());
    run.digests[rank] = *digests;
    for (int id = 0; id < (*store)->num_params(); ++id) {
      absl::StatusOr<at::Tensor> value = (*store)->GatherValue(id, comm);
      ASSERT_TRUE(value.ok());
      if (rank == 0) run.params.push_back(*value);
    }
  });
  return run;
}

// Every state offloaded (frozen params have none).
Schedule OffloadAll(const Graph& g) {
  std::vector<int32_t> ids;
  for (const Param& p : g.params) {
    if (p.trainable) ids.push_back(p.id);
  }
  absl::StatusOr<Schedule> s = OffloadStates(g, Prefetch(g), ids, 2);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

double RelativeError(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() /
         std::max(b.norm().item<double>(), 1e-30);
}

// archive, world, schedule kind, grad_accum.
using NumericsCase = std::tuple<std::string, int, std::string, int>;
class ArchiveNumericsTest : public testing::TestWithParam<NumericsCase> {};

TEST_P(ArchiveNumericsTest, FiveSteps_MatchUnshardedSingleProcess) {
  const auto& [archive, world, kind, grad_accum] = GetParam();
  ScheduleMaker initial = [](const Graph& g) { return OnDemand(g); };
  StepHook hook;
  std::vector<int64_t> expected_versions(kSteps, 1);
  if (kind == "prefetch") {
    initial = [](const Graph& g) { return Prefetch(g); };
  } else if (kind == "offload") {
    initial = [](const Graph& g) { return OffloadAll(g); };
  } else if (kind == "zero1") {
    initial = [](const Graph& g) {
      absl::StatusOr<Schedule> s = Zero1Schedule(g, 1, 1);  // tiny buckets
      EXPECT_TRUE(s.ok()) << s.status();
      return *s;
    };
  } else if (kind == "switch") {
    // On demand, then everything persistent from step 3.
    hook = [](int, int step, Executor& e) {
      if (step != 0) return;
      ASSERT_TRUE(e.OfferSchedule(Persistent(e.graph(), 2), 3).ok());
    };
    expected_versions = {1, 1, 1, 2, 2};
  }
  const ShardedRun run =
      TrainSharded(archive, world, grad_accum, initial, hook);
  const Trajectory ref = TrainReference(archive, world, grad_accum);
  ASSERT_EQ(run.params.size(), ref.params.size());
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(run.losses[r], run.losses[0]) << "rank " << r;
    EXPECT_EQ(run.digests[r], run.digests[0]) << "rank " << r;
    EXPECT_EQ(run.versions[r], expected_versions) << "rank " << r;
  }
  ASSERT_EQ(run.losses[0].size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_NEAR(run.losses[0][s], ref.losses[s],
                kTolerance * std::abs(ref.losses[s]))
        << "step " << s;
  }
  double worst = 0;
  for (size_t i = 0; i < ref.params.size(); ++i) {
    const double err = RelativeError(run.params[i], ref.params[i]);
    worst = std::max(worst, err);
    EXPECT_LE(err, kTolerance) << run.graph.params[i].name;
    if (!run.graph.params[i].trainable) {
      // Frozen: exactly its initial value, here and in PyTorch.
      EXPECT_TRUE(at::equal(run.params[i], ref.initial[i]))
          << run.graph.params[i].name;
      EXPECT_TRUE(at::equal(ref.params[i], ref.initial[i]))
          << run.graph.params[i].name;
      continue;
    }
    // Training moved every trained param well beyond the tolerance.
    EXPECT_GT(RelativeError(ref.params[i], ref.initial[i]), 1e-3)
        << run.graph.params[i].name;
  }
  std::printf(
      "%s world %d %s grad_accum %d: worst param relative error "
      "%.3g\n",
      archive.c_str(), world, kind.c_str(), grad_accum, worst);
}

INSTANTIATE_TEST_SUITE_P(Residual, ArchiveNumericsTest,
                         testing::Combine(testing::Values("residual"),
                                          testing::Values(1, 2, 3),
                                          testing::Values("on_demand",
                                                          "prefetch", "offload",
                                                          "switch"),
                                          testing::Values(1)),
                         [](const testing::TestParamInfo<NumericsCase>& info) {
                           return absl::StrCat("world", std::get<1>(info.param),
                                               "_", std::get<2>(info.param));
                         });
INSTANTIATE_TEST_SUITE_P(
    ResidualGradAccum, ArchiveNumericsTest,
    testing::Combine(testing::Values("residual"), testing::Values(2),
                     testing::Values("on_demand", "prefetch"),
                     testing::Values(2)),
    [](const testing::TestParamInfo<NumericsCase>& info) {
      return absl::StrCat("world2_", std::get<2>(info.param), "_accum2");
    });
// Fine-tuning: a frozen tied embedding (a frozen prefix: the first unit's
// output carries no gradient) and a frozen bias next to a trained weight.
INSTANTIATE_TEST_SUITE_P(Frozen, ArchiveNumericsTest,
                         testing::Combine(testing::Values("frozen"),
                                          testing::Values(1, 2, 3),
                                          testing::Values("on_demand",
                                                          "prefetch", "offload",
                                                          "switch", "zero1"),
                                          testing::Values(1)),
                         [](const testing::TestParamInfo<NumericsCase>& info) {
                           return absl::StrCat("world", std::get<1>(info.param),
                                               "_", std::get<2>(info.param));
                         });
INSTANTIATE_TEST_SUITE_P(
    FrozenGradAccum, ArchiveNumericsTest,
    testing::Combine(testing::Values("frozen"), testing::Values(2, 3),
                     testing::Values("on_demand", "prefetch"),
                     testing::Values(2)),
    [](const testing::TestParamInfo<NumericsCase>& info) {
      return absl::StrCat("world", std::get<1>(info.param), "_",
                          std::get<2>(info.param), "_accum2");
    });
INSTANTIATE_TEST_SUITE_P(
    Leaf, ArchiveNumericsTest,
    testing::Combine(testing::Values("leaf"), testing::Values(1, 2, 3),
                     testing::Values("on_demand", "switch"),
                     testing::Values(1)),
    [](const testing::TestParamInfo<NumericsCase>& info) {
      return absl::StrCat("world", std::get<1>(info.param), "_",
                          std::get<2>(info.param));
    });

TEST(ArchiveProgramTest, Residual_TiedParamAndSkippingValue) {
  absl::StatusOr<Program> program = LoadArchiveProgram(Archive("residual"), {});
  ASSERT_TRUE(program.ok()) << program.status();
  ASSERT_EQ(program->nodes.size(), 4u);
  EXPECT_EQ(program->params[0].name, "embed.weight");
  // The tied embedding: one param, used by the first and the last node.
  EXPECT_EQ(program->nodes[0].param_ids, std::vector<int32_t>{0});
  EXPECT_EQ(program->nodes[3].param_ids, (std::vector<int32_t>{0, 4}));
  EXPECT_EQ(program->nodes[3].inputs,
            (std::vector<std::string>{"x2", "x0", "targets"}));
  absl::StatusOr<TokenInputs> names = TokenInputsOf(*program);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names->tokens, "tokens");
  EXPECT_EQ(names->targets, "targets");
  // The initial values are the archive's.
  at::Tensor gain = at::empty(program->params[4].shape, at::kFloat);
  program->params[4].init(gain.data_ptr<float>(), gain.numel());
  EXPECT_GT(gain.min().item<float>(), 0.5f);
  EXPECT_LT(gain.max().item<float>(), 1.5f);
  EXPECT_NE(gain.std().item<float>(), 0.0f);
  // The baseline reduces the tied gradient once, after its last backward
  // use (embed.bwd, the end of backward).
  absl::StatusOr<Graph> graph = DeriveGraph(*program, 2, 1, 12);
  ASSERT_TRUE(graph.ok());
  Schedule s = OnDemand(*graph);
  int reductions = 0;
  for (const Action& a : s.actions) {
    if (a.kind != ActionKind::kReduceScatter) continue;
    for (int32_t id : a.param_ids) {
      if (id != 0) continue;
      ++reductions;
      EXPECT_EQ(graph->nodes[a.node_id].name, "embed.bwd");
    }
  }
  EXPECT_EQ(reductions, 1);
}

// model.dtype bf16: the params are declared bf16 (the store gathers them so)
// and the units' float buffers reach them in bf16, so a unit computes in
// bf16 throughout (blocks.1 multiplies by its f32 `scale` buffer: uncast, its
// output would be promoted to f32) and lands within bf16's rounding of the
// f32 values.
TEST(ArchiveProgramTest, Bf16_BuffersCastAndUnitsComputeInBf16) {
  absl::StatusOr<Program> f32 = LoadArchiveProgram(Archive("residual"), {});
  ArchiveProgramOptions options;
  options.dtype = DType::kBF16;
  absl::StatusOr<Program> bf16 =
      LoadArchiveProgram(Archive("residual"), options);
  ASSERT_TRUE(f32.ok() && bf16.ok()) << bf16.status();
  EXPECT_EQ(f32->dtype, DType::kF32);
  EXPECT_EQ(bf16->dtype, DType::kBF16);
  EXPECT_EQ(bf16->reduce_dtype, DType::kF32);
  absl::StatusOr<Graph> graph = DeriveGraph(*bf16, 2, 1, 12);
  ASSERT_TRUE(graph.ok());
  EXPECT_EQ(graph->params[1].dtype, DType::kBF16);
  EXPECT_EQ(graph->reduce_dtype, DType::kF32);

  std::vector<at::Tensor> params;
  for (const ProgramParam& p : f32->params) {
    at::Tensor t = at::empty(p.shape, at::kFloat);
    p.init(t.data_ptr<float>(), t.numel());
    params.push_back(t);
  }
  const at::Tensor tokens = at::arange(kSeqLen * kMicroBatch, at::kLong)
                                .remainder(kVocab)
                                .view({kMicroBatch, kSeqLen});
  auto run = [&](const Program& program, at::ScalarType dtype) {
    absl::flat_hash_map<std::string, at::Tensor> env = {
        {"tokens", tokens}, {"targets", tokens.roll(1, 1)}};
    for (const ProgramNode& node : program.nodes) {
      std::vector<at::Tensor> in, ps;
      for (const std::string& name : node.inputs) in.push_back(env.at(name));
      for (int32_t id : node.param_ids) ps.push_back(params[id].to(dtype));
      std::vector<at::Tensor> out = node.forward(in, ps);
      for (size_t o = 0; o < out.size(); ++o) env[node.outputs[o]] = out[o];
    }
    return env;
  };
  auto want = run(*f32, at::kFloat);
  auto got = run(*bf16, at::kBFloat16);
  for (const std::string name : {"x0", "x1", "x2", "loss"}) {
    EXPECT_EQ(got.at(name).scalar_type(), at::kBFloat16) << name;
    const at::Tensor w = want.at(name);
    const double err =
        (got.at(name).to(at::kFloat) - w).abs().max().item<double>() /
        w.abs().max().item<double>();
    // bf16 keeps 8 bits; a few roundings deep.
    EXPECT_LT(err, 0.05) << name;
    EXPECT_GT(err, 0.0) << name << ": not rounded at all";
  }
}

TEST(ArchiveProgramTest, Frozen_ParamsLoadUntrainedAndAreNeverReduced) {
  absl::StatusOr<Program> program = LoadArchiveProgram(Archive("frozen"), {});
  ASSERT_TRUE(program.ok()) << program.status();
  ASSERT_EQ(program->params.size(), 5u);
  const std::vector<bool> trainable = {false, true, false, true, true};
  for (size_t i = 0; i < trainable.size(); ++i) {
    EXPECT_EQ(program->params[i].trainable, trainable[i])
        << program->params[i].name;
  }
  absl::StatusOr<Graph> graph = DeriveGraph(*program, 2, 2, 12);
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (size_t i = 0; i < trainable.size(); ++i) {
    EXPECT_EQ(graph->params[i].trainable, trainable[i]);
  }
  // Another model than the archive with every param trained.
  absl::StatusOr<Program> residual =
      LoadArchiveProgram(Archive("residual"), {});
  ASSERT_TRUE(residual.ok());
  absl::StatusOr<Graph> trained = DeriveGraph(*residual, 2, 2, 12);
  ASSERT_TRUE(trained.ok());
  EXPECT_NE(graph->StructuralHash(), trained->StructuralHash());
  // The baseline gathers the frozen params for every use and reduces only
  // the trained ones (per micro-batch here: the least-memory plan).
  for (const Schedule& s :
       {OnDemand(*graph), *LeastMemorySchedule(*graph, ShardingMode::kZero3)}) {
    for (const Action& a : s.actions) {
      if (a.kind != ActionKind::kReduceScatter) continue;
      for (int32_t id : a.param_ids) EXPECT_TRUE(trainable[id]) << id;
    }
    for (const OffloadEntry& o : s.offloads) {
      for (int32_t id : o.param_ids) EXPECT_TRUE(trainable[id]) << id;
    }
  }
  // A frozen param cannot be offloaded: it has no optimizer state.
  absl::StatusOr<Schedule> offload =
      OffloadStates(*graph, OnDemand(*graph), {0});
  ASSERT_FALSE(offload.ok());
  EXPECT_THAT(offload.status().message(),
              HasSubstr("is frozen and has no optimizer state"));
}

TEST(ArchiveProgramTest, BrokenArchives_SayWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"bad_checksum", "model/units/002.pt does not match its sha256"},
      {"bad_version", "format_version 7 is not one this Tandem reads"},
      {"use_before_def",
       "units[1].inputs[0] 'x2' (unit 'blocks.0') is neither a batch input "
       "nor an output of an earlier unit"},
      {"missing_entry", "no entry 'model/units/001.pt'"},
      {"no_such_archive", "does not exist"},
  };
  for (const auto& [name, message] : cases) {
    absl::StatusOr<Program> program = LoadArchiveProgram(Archive(name), {});
    EXPECT_FALSE(program.ok()) << name;
    EXPECT_THAT(program.status().message(), HasSubstr(message))
        << name << ": " << program.status();
  }
}

// Programs built here: two nodes, a linear layer and a loss.
Program TwoNodeProgram() {
  Program p;
  p.name = "two";
  p.inputs = {{"x", ""}};
  p.loss = "loss";
  ProgramParam w;
  w.name = "w";
  w.shape = {4, 4};
  w.unit = "a";
  w.init = [](float* data, int64_t n) {
    for (int64_t i = 0; i < n; ++i) data[i] = 0.1f * static_cast<float>(i % 5);
  };
  p.params = {w, w};
  p.params[1].name = "v";
  p.params[1].unit = "b";
  return p;
}

absl::Status RunOneStep(const Program& program) {
  absl::Status result;
  RunLoopbackWorld(1, [&](int rank, Communicator& comm) {
    absl::StatusOr<Graph> graph = DeriveGraph(program, 1, 1, 4);
    ASSERT_TRUE(graph.ok()) << graph.status();
    auto store = ShardedParamStore::Create(program, rank, 1);
    ASSERT_TRUE(store.ok());
    auto executor =
        Executor::Create(&program, *graph, store->get(), &comm,
                         CountingCpuAllocator::Get(), OnDemand(*graph), {});
    ASSERT_TRUE(executor.ok()) << executor.status();
    MicroBatch batch;
    batch.tensors["x"] = at::ones({2, 4});
    result = (*executor)->RunStep({batch}).status();
  });
  return result;
}

TEST(ArchiveProgramTest, ValueWithoutGradientToLoss_BoundaryNeverFires) {
  Program p = TwoNodeProgram();
  p.nodes.push_back(
      {"a",
       {0},
       {"x"},
       {"h", "unused"},
       [](absl::Span<const at::Tensor> in, absl::Span<const at::Tensor> w) {
         const at::Tensor h = at::matmul(in[0], w[0]);
         return std::vector<at::Tensor>{h, h * 2};
       }});
  // b reads "unused" but its loss does not depend on it.
  p.nodes.push_back(
      {"b",
       {1},
       {"h", "unused"},
       {"loss"},
       [](absl::Span<const at::Tensor> in, absl::Span<const at::Tensor> w) {
         return std::vector<at::Tensor>{at::matmul(in[0], w[0]).sum()};
       }});
  const absl::Status s = RunOneStep(p);
  EXPECT_THAT(s.message(),
              HasSubstr("the backward boundary between node 'a' and node 'b' "
                        "never fired"));
  EXPECT_THAT(s.message(), HasSubstr("unused"));
}

// A node with params that reads only the batch (b), after another (a): its
// backward is ordered by its params' gradients (worker/README.md, "Glue";
// executor_test's GradientlessNodeTest checks the numbers).
TEST(ArchiveProgramTest, NodeReadingNoGradient_Runs) {
  Program p = TwoNodeProgram();
  p.params.push_back(p.params[1]);
  p.params[2].name = "u";
  auto matmul = [](absl::Span<const at::Tensor> in,
                   absl::Span<const at::Tensor> w) {
    return std::vector<at::Tensor>{at::matmul(in[0], w[0])};
  };
  p.nodes.push_back({"a", {0}, {"x"}, {"h"}, matmul});
  // b has params but reads only the batch input; c joins both.
  p.nodes.push_back({"b", {1}, {"x"}, {"g"}, matmul});
  p.nodes.push_back(
      {"c",
       {2},
       {"h", "g"},
       {"loss"},
       [](absl::Span<const at::Tensor> in, absl::Span<const at::Tensor> w) {
         return std::vector<at::Tensor>{at::matmul(in[0] + in[1], w[0]).sum()};
       }});
  EXPECT_TRUE(RunOneStep(p).ok()) << RunOneStep(p);
}

TEST(ArchiveProgramTest, BrokenFlow_DeriveGraphNamesNodeAndValue) {
  Program p = TwoNodeProgram();
  p.nodes.push_back({"a", {0}, {"y"}, {"h"}, nullptr});
  absl::StatusOr<Graph> graph = DeriveGraph(p, 1, 1, 4);
  EXPECT_THAT(graph.status().message(),
              HasSubstr("node 'a' reads 'y', which is neither a batch input "
                        "nor an output of an earlier node"));
  p.nodes[0].inputs = {"x"};
  p.loss = "nope";
  EXPECT_THAT(DeriveGraph(p, 1, 1, 4).status().message(),
              HasSubstr("the loss 'nope' is not an output of the last node"));
}

}  // namespace
}  // namespace tandem
