// A rank's sharded training state in a checkpoint
// (worker/checkpoint/checkpoint_files.h has the files themselves): what a
// snapshot copies out of the ShardedParamStore, and how a rank reads its
// shards back, resharded when the checkpoint was written at another world
// size (worker/README.md, "Checkpoints").
#ifndef TANDEM_WORKER_CHECKPOINT_SHARDED_CHECKPOINT_H_
#define TANDEM_WORKER_CHECKPOINT_SHARDED_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/checkpoint/checkpoint_files.h"
#include "worker/runtime/loss_scaler.h"
#include "worker/runtime/program.h"
#include "worker/runtime/sharded_param_store.h"

namespace tandem {

// Fills `state` with the params' list (names, shapes and export names, for
// tandem export-weights), the shards, the AdamW moments (on the device: the
// optimizer just used them; frozen params have none), the CPU RNG's state
// and, with `loss_scale` (a job that scales its loss), the loss scaler's.
// `state`'s blobs, from the previous checkpoint, are overwritten in place: the
// same names in the same order, so their buffers are reused and a snapshot
// neither allocates nor frees (the memory the kernel hands out zeroed, and
// takes back with a TLB flush on every core, cost the training thread more than
// the copy). Throws (libtorch) when a param's states are on the host tier.
void FillCheckpoint(const Program& program, const ShardedParamStore& store,
                    RankCheckpoint& state,
                    const LossScaleState* loss_scale = nullptr);

// A stretch of this rank's shard that a checkpoint rank holds: `count`
// values from offset `from` of old rank `rank`'s shard, to offset `to`.
struct ShardPiece {
  int32_t rank;
  int64_t from;
  int64_t to;
  int64_t count;
};

// Where rank `rank`'s shard of a `numel`-element param (world `world`) lies
// in the shards of a checkpoint written by `old_world` ranks: every rank's
// shard is ceil(numel / world) consecutive values of the flattened param.
std::vector<ShardPiece> ShardPieces(int64_t numel, int32_t old_world,
                                    int32_t world, int32_t rank);

// This rank's state in one checkpoint, read and checked but not yet
// applied: the rank files its shards come from (at another world size,
// several or none of the same number), each whole.
struct RestoreSource {
  CheckpointMeta meta;
  std::map<int32_t, RankCheckpoint> files;
  // The rank whose CPU RNG state (and loss scaler state) this rank takes.
  int32_t rng_rank = 0;
  // The loss scaler's state (the same on every rank), when the checkpoint
  // holds one.
  std::optional<LossScaleState> loss_scale;
};

// Reads and checks what rank `rank` of `world` needs of checkpoint `meta`.
// Errors: FailedPrecondition when the checkpoint holds other params than
// `program` (or, without a params list, is of another graph than
// `graph_hash`: resuming it cannot work, fatal), DataLoss or NotFound for an
// unreadable or damaged file (another checkpoint may do).
absl::StatusOr<RestoreSource> ReadRestoreSource(const CheckpointDirectory& dir,
                                                const CheckpointMeta& meta,
                                                const Program& program,
                                                const std::string& graph_hash,
                                                const ShardedParamStore& store,
                                                int32_t rank, int32_t world);

// Applies a source ReadRestoreSource checked: the shards (this rank's part
// of every param, padding zero), the AdamW moments and the CPU RNG state.
// Throws (libtorch) on a device error.
void Restore(const RestoreSource& source, ShardedParamStore& store);

}  // namespace tandem

#endif  // TANDEM_WORKER_CHECKPOINT_SHARDED_CHECKPOINT_H_
