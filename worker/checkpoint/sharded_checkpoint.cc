#include "worker/checkpoint/sharded_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/archive/weights_file.h"
#include "common/status_macros.h"
#include "worker/models/init_from.h"

namespace tandem {
namespace {

constexpr char kLossScalerBlob[] = "loss_scaler";

std::string ParamBlob(const ShardedParamStore& store, int32_t id,
                      absl::string_view what) {
  return absl::StrCat("param/", store.name(id), "/", what);
}

// Copies `t`'s bytes into `out`, reusing its buffer when it is large enough.
void AssignTensorBytes(const at::Tensor& t, std::string& out) {
  const at::Tensor cpu = t.to(at::kCPU).contiguous();
  out.assign(static_cast<const char*>(cpu.data_ptr()), cpu.nbytes());
}

// `pieces` of the checkpoint's fp32 blobs `what` of param `id`: this rank's
// shard (padding zero).
at::Tensor ReadPieces(const RestoreSource& source,
                      const ShardedParamStore& store, int32_t id,
                      const std::vector<ShardPiece>& pieces, const char* what) {
  at::Tensor values = at::zeros({store.shard_numel(id)}, at::kFloat);
  float* out = values.data_ptr<float>();
  for (const ShardPiece& piece : pieces) {
    const std::string& blob =
        *source.files.at(piece.rank).Find(ParamBlob(store, id, what));
    std::memcpy(out + piece.to, blob.data() + piece.from * sizeof(float),
                static_cast<size_t>(piece.count) * sizeof(float));
  }
  return values;
}

}  // namespace

void FillCheckpoint(const Program& program, const ShardedParamStore& store,
                    RankCheckpoint& state, const LossScaleState* loss_scale) {
  size_t next = 0;
  auto blob = [&](std::string name) -> std::string& {
    if (next == state.blobs.size()) state.blobs.emplace_back();
    auto& [blob_name, bytes] = state.blobs[next++];
    blob_name = std::move(name);
    return bytes;
  };
  blob(kCheckpointTensorsBlob) =
      CheckpointTensorsText(ProgramWeightTensors(program));
  for (int32_t id = 0; id < store.num_params(); ++id) {
    TORCH_CHECK(!store.states_on_host(id), "states of '", store.name(id),
                "' are on the host tier at a checkpoint");
    // The fp32 master (the shard itself at f32).
    AssignTensorBytes(store.MasterShard(id),
                      blob(ParamBlob(store, id, "shard")));
    if (!store.trainable(id)) continue;
    AssignTensorBytes(store.exp_avg(id), blob(ParamBlob(store, id, "exp_avg")));
    AssignTensorBytes(store.exp_avg_sq(id),
                      blob(ParamBlob(store, id, "exp_avg_sq")));
  }
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  AssignTensorBytes(gen.get_state(), blob("rng/cpu"));
  if (loss_scale != nullptr) {
    blob(kLossScalerBlob) = LossScaler::Serialize(*loss_scale);
  }
  state.blobs.resize(next);
}

std::vector<ShardPiece> ShardPieces(int64_t numel, int32_t old_world,
                                    int32_t world, int32_t rank) {
  const int64_t old_shard = (numel + old_world - 1) / old_world;
  const int64_t shard = (numel + world - 1) / world;
  const int64_t begin = std::min(numel, rank * shard);
  const int64_t end = std::min(numel, begin + shard);
  std::vector<ShardPiece> out;
  for (int64_t at = begin; at < end;) {
    const int32_t q = static_cast<int32_t>(at / old_shard);
    const int64_t stop = std::min(end, (q + 1) * old_shard);
    out.push_back({q, at - q * old_shard, at - begin, stop - at});
    at = stop;
  }
  return out;
}

absl::StatusOr<RestoreSource> ReadRestoreSource(const CheckpointDirectory& dir,
                                                const CheckpointMeta& meta,
                                                const Program& program,
                                                const std::string& graph_hash,
                                                const ShardedParamStore& store,
                                                int32_t rank, int32_t world) {
  RestoreSource source;
  source.meta = meta;
  source.rng_rank = rank % meta.world_size;
  auto file = [&](int32_t r) -> absl::StatusOr<const RankCheckpoint*> {
    auto it = source.files.find(r);
    if (it == source.files.end()) {
      ASSIGN_OR_RETURN(RankCheckpoint read, dir.ReadRank(meta, r));
      it = source.files.emplace(r, std::move(read)).first;
    }
    return &it->second;
  };
  const std::string where = dir.StepDir(meta.step);
  ASSIGN_OR_RETURN(const RankCheckpoint* own, file(source.rng_rank));
  if (own->Find("rng/cpu") == nullptr) {
    return absl::DataLossError(
        absl::StrCat("rank ", source.rng_rank, "'s blob 'rng/cpu' is missing"));
  }
  if (const std::string* scaler = own->Find(kLossScalerBlob)) {
    absl::StatusOr<LossScaleState> parsed = LossScaler::Parse(*scaler);
    if (!parsed.ok()) {
      return absl::DataLossError(
          absl::StrCat("rank ", source.rng_rank, "'s blob '", kLossScalerBlob,
                       "': ", parsed.status().message()));
    }
    source.loss_scale = *parsed;
  }
  // The params' names, shapes and export names, which the shards' layout
  // follows, must be this model's (checkpoints written before the list
  // existed resume only at their own world size).
  const std::string* listed = own->Find(kCheckpointTensorsBlob);
  if (listed == nullptr && meta.world_size != world) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", where, " was written by ", meta.world_size,
        " ranks by a worker that did not record its params' shapes, so it "
        "cannot be resharded to ",
        world,
        " ranks; resume it with "
        "parallel.world_size ",
        meta.world_size, ", or point checkpoint.dir at an empty directory"));
  }
  if (listed == nullptr && meta.graph_hash != graph_hash) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", where, " is of another model (graph ",
                     meta.graph_hash, ", this job's is ", graph_hash,
                     "); resume it with the job spec that wrote it, or point "
                     "checkpoint.dir at an empty directory to start afresh"));
  }
  if (listed != nullptr) {
    const std::string mine =
        CheckpointTensorsText(ProgramWeightTensors(program));
    if (*listed != mine) {
      const std::vector<absl::string_view> theirs =
          absl::StrSplit(*listed, '\n');
      const std::vector<absl::string_view> ours = absl::StrSplit(mine, '\n');
      size_t i = 0;
      while (i < theirs.size() && i < ours.size() && theirs[i] == ours[i]) ++i;
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", where, " is of another model: its param ", i, " is '",
          i < theirs.size() ? theirs[i] : "(none)", "', this job's is '",
          i < ours.size() ? ours[i] : "(none)",
          "'; resume it with the job spec that wrote it (any world size), or "
          "point checkpoint.dir at an empty directory to start afresh"));
    }
  }
  for (int32_t id = 0; id < store.num_params(); ++id) {
    const int64_t old_shard =
        (store.numel(id) + meta.world_size - 1) / meta.world_size;
    for (const ShardPiece& piece :
         ShardPieces(store.numel(id), meta.world_size, world, rank)) {
      ASSIGN_OR_RETURN(const RankCheckpoint* from, file(piece.rank));
      for (const char* what : {"shard", "exp_avg", "exp_avg_sq"}) {
        if (!store.trainable(id) && std::string(what) != "shard") continue;
        const std::string name = ParamBlob(store, id, what);
        const std::string* blob = from->Find(name);
        const size_t bytes = static_cast<size_t>(old_shard) * sizeof(float);
        if (blob == nullptr || blob->size() != bytes) {
          return absl::DataLossError(
              absl::StrCat("rank ", piece.rank, "'s blob '", name, "' is ",
                           blob == nullptr ? "missing" : "mis-sized",
                           " (expected ", bytes, " bytes)"));
        }
      }
    }
  }
  return source;
}

void Restore(const RestoreSource& source, ShardedParamStore& store) {
  for (int32_t id = 0; id < store.num_params(); ++id) {
    const std::vector<ShardPiece> pieces =
        ShardPieces(store.numel(id), source.meta.world_size, store.world_size(),
                    store.rank());
    store.SetMasterShard(id, ReadPieces(source, store, id, pieces, "shard"));
    if (!store.trainable(id)) continue;
    at::Tensor exp_avg = store.exp_avg(id);
    at::Tensor exp_avg_sq = store.exp_avg_sq(id);
    exp_avg.copy_(ReadPieces(source, store, id, pieces, "exp_avg"));
    exp_avg_sq.copy_(ReadPieces(source, store, id, pieces, "exp_avg_sq"));
  }
  const std::string& rng = *source.files.at(source.rng_rank).Find("rng/cpu");
  at::Tensor rng_state =
      at::empty({static_cast<int64_t>(rng.size())}, at::kByte);
  std::memcpy(rng_state.data_ptr(), rng.data(), rng.size());
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng_state);
}

}  // namespace tandem
