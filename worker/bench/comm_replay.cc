// tandem-comm-replay: the communication half of bench/e2e's lower bound.
// Replays one schedule's collectives with no compute between them: the same
// gather groups (one packed all-gather each), the same reduce-scatters (one
// packed reduce-scatter each), the per-step scalar exchange (loss, gradient
// norm, schedule agreement) and the refresh all-gather of the persistent
// params after the optimizer, in the order the executor issues them (anchor
// order over the graph's nodes), over the same Gloo process group setup as
// tandem-worker. Offload copies run on the host link, not the network, and
// are left out.
//
//   tandem-comm-replay --spec job.yaml --rank R --world W
//                      --rendezvous HOST:PORT [--schedule FILE] [--steps N]
//                      [--warmup N]
//
// Prints one JSON line per measured step ({"step":s,"comm_s":...}) and a
// final {"median_comm_s":...,"bytes_per_step":...,"collectives_per_step":...}.
// Without --schedule it replays the spec's baseline (on-demand) schedule.
// GLOO_SOCKET_IFNAME picks the interface, as for tandem-worker.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/flags/command_line.h"
#include "common/flags/flag_checks.h"
#include "common/ir/graph.h"
#include "common/ir/schedule.h"
#include "common/ir/text_format.h"
#include "common/status_macros.h"
#include "worker/runtime/communicator.h"
#include "worker/runtime/executor.h"
#include "worker/runtime/process_group.h"
#include "worker/runtime/standard_schedules.h"
#include "worker/spec/job_spec_yaml.h"
#include "worker/trainer/training_job.h"

ABSL_FLAG(std::string, spec, "", "the YAML job spec (required)");
ABSL_FLAG(std::string, rendezvous, "",
          "rank 0's HOST:PORT for the rendezvous store (required)");
ABSL_FLAG(std::string, schedule, "",
          "replay this schedule (text form); default: the spec's on-demand "
          "baseline");
ABSL_FLAG(int, rank, -1, "this process's rank (required)");
ABSL_FLAG(int, world, 0, "ranks (required)");
ABSL_FLAG(int, steps, 5, "measured steps");
ABSL_FLAG(int, warmup, 1, "steps before the measured ones");

namespace {
constexpr char kUsage[] =
    "usage: tandem-comm-replay --spec FILE --rank R --world W "
    "--rendezvous HOST:PORT [--schedule FILE] [--steps N] [--warmup N]\n";
}  // namespace

namespace tandem {
namespace {

struct Args {
  std::string spec_path;
  std::string rendezvous;
  std::string schedule_path;
  int rank = -1;
  int world = -1;
  int steps = 5;
  int warmup = 1;
};

// One collective of the replay: kind and element count per rank's shard.
struct Collective {
  bool gather = true;  // else reduce-scatter
  int64_t shard_numel = 0;
};

absl::StatusOr<Schedule> LoadSchedule(const Args& args, const Graph& graph,
                                      int zero_stage) {
  if (args.schedule_path.empty()) return BaselineSchedule(graph, zero_stage);
  std::ifstream in(args.schedule_path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("--schedule: cannot read '", args.schedule_path, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseSchedule(text.str());
}

int64_t ShardNumel(const Graph& graph, const std::vector<int32_t>& ids,
                   int world) {
  int64_t n = 0;
  for (int32_t id : ids) {
    for (const Param& p : graph.params) {
      if (p.id == id) n += p.shard_numel(world);
    }
  }
  return n;
}

// The schedule's collectives in issue order: nodes in graph order, at each
// node the actions anchored before it, then those after it, in list order.
std::vector<Collective> CollectivesInOrder(const Graph& graph,
                                           const Schedule& schedule,
                                           int world) {
  std::vector<Collective> out;
  for (const Node& node : graph.nodes) {
    for (AnchorPosition pos :
         {AnchorPosition::kBefore, AnchorPosition::kAfter}) {
      for (const Action& a : schedule.actions) {
        if (a.node_id != node.id || a.position != pos) continue;
        if (a.kind == ActionKind::kAllGather) {
          const GatherGroup* g = schedule.FindGroup(a.group_id);
          if (g != nullptr) {
            out.push_back({true, ShardNumel(graph, g->param_ids, world)});
          }
        } else if (a.kind == ActionKind::kReduceScatter) {
          out.push_back({false, ShardNumel(graph, a.param_ids, world)});
        }
      }
    }
  }
  return out;
}

absl::Status Run(const Args& args) {
  ASSIGN_OR_RETURN(v1::JobSpec spec, LoadJobSpec(args.spec_path));
  ASSIGN_OR_RETURN(ModelParts model, PrepareModel(spec, args.world));
  ASSIGN_OR_RETURN(
      Schedule schedule,
      LoadSchedule(args, model.graph, spec.parallel().zero_stage()));
  RETURN_IF_ERROR(CheckRunnableSchedule(model.graph, schedule));
  const std::vector<Collective> collectives =
      CollectivesInOrder(model.graph, schedule, args.world);
  const int64_t persistent_numel =
      ShardNumel(model.graph, schedule.persistent_param_ids, args.world);

  RendezvousOptions rv;
  RETURN_IF_ERROR(ParseRendezvousAddress(args.rendezvous, &rv));
  rv.rank = args.rank;
  rv.world_size = args.world;
  ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::ProcessGroup> group,
                   CreateProcessGroup(rv));
  Communicator comm(group, CommOptionsFromSpec(spec));
  RETURN_IF_ERROR(comm.TuneChunkBytes().status());

  // Buffers sized for the largest collective, reused (contents do not
  // matter; the bytes on the wire do).
  int64_t max_numel = persistent_numel;
  int64_t bytes_per_step = 0;
  for (const Collective& c : collectives) {
    max_numel = std::max(max_numel, c.shard_numel);
    bytes_per_step += c.shard_numel * args.world * 4;
  }
  bytes_per_step += persistent_numel * args.world * 4;
  const at::Tensor shard = at::ones({std::max<int64_t>(max_numel, 1)});
  const at::Tensor full =
      at::ones({std::max<int64_t>(max_numel, 1) * args.world});

  std::vector<double> times;
  for (int step = 0; step < args.warmup + args.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    for (const Collective& c : collectives) {
      const int64_t n = c.shard_numel;
      if (n == 0) continue;
      comm.Submit([&comm, &shard, &full, n, gather = c.gather, w = args.world] {
        if (gather) {
          comm.AllGather(shard.narrow(0, 0, n), full.narrow(0, 0, n * w));
        } else {
          comm.ReduceScatterSum(full.narrow(0, 0, n * w),
                                shard.narrow(0, 0, n));
        }
      });
    }
    RETURN_IF_ERROR(comm.Drain());
    ASSIGN_OR_RETURN(std::vector<double> scalars,
                     comm.AllGatherScalars({1.0, 2.0, 0.0, 0.0}));
    (void)scalars;
    if (persistent_numel > 0) {
      const int64_t n = persistent_numel;
      comm.Submit([&comm, &shard, &full, n, w = args.world] {
        comm.AllGather(shard.narrow(0, 0, n), full.narrow(0, 0, n * w));
      });
      RETURN_IF_ERROR(comm.Drain());
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    if (step >= args.warmup) {
      times.push_back(s);
      std::cout << absl::StrFormat(
          "{\"step\":%d,\"comm_s\":%.6f,\"rank\":%d}\n", step - args.warmup, s,
          args.rank);
      std::cout.flush();
    }
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double median =
      sorted.empty() ? 0
      : sorted.size() % 2 == 1
          ? sorted[sorted.size() / 2]
          : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
  std::cout << absl::StrFormat(
      "{\"median_comm_s\":%.6f,\"bytes_per_step\":%d,"
      "\"collectives_per_step\":%d,\"rank\":%d}\n",
      median, bytes_per_step,
      static_cast<int64_t>(collectives.size()) + 1 + (persistent_numel > 0),
      args.rank);
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  const tandem::CommandLineSpec spec{"tandem-comm-replay", kUsage};
  tandem::ParseCommandLineOrExit(spec, argc, argv);
  tandem::Args args;
  args.spec_path = absl::GetFlag(FLAGS_spec);
  args.rendezvous = absl::GetFlag(FLAGS_rendezvous);
  args.schedule_path = absl::GetFlag(FLAGS_schedule);
  args.rank = absl::GetFlag(FLAGS_rank);
  args.world = absl::GetFlag(FLAGS_world);
  args.steps = absl::GetFlag(FLAGS_steps);
  args.warmup = absl::GetFlag(FLAGS_warmup);
  if (args.spec_path.empty() || args.rendezvous.empty() || args.rank < 0 ||
      args.world < 1) {
    tandem::ExitWithUsageError(
        spec, "--spec, --rank, --world and --rendezvous are required");
  }
  tandem::ExitIfInvalid(
      spec, {args.rank < args.world ? absl::OkStatus()
                                    : absl::InvalidArgumentError(absl::StrCat(
                                          "--rank ", args.rank,
                                          " must be < --world ", args.world)),
             tandem::CheckPositive("--steps", args.steps),
             tandem::CheckAtLeast("--warmup", args.warmup, 0),
             tandem::CheckHostPort("--rendezvous", args.rendezvous,
                                   tandem::PortZero::kRejected)});
  absl::Status status = tandem::Run(args);
  if (!status.ok()) {
    std::fprintf(stderr, "tandem-comm-replay rank %d: %s\n", args.rank,
                 std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
