// Checkpoint files on disk (worker/README.md, "Persistence and faults"): each
// rank writes its own file, and a manifest written last marks a checkpoint
// complete. No libtorch: the runtime fills a RankCheckpoint with its shards,
// optimizer states and RNG state, and restores from one.
//
// Layout under the job's checkpoint.dir (shared by all ranks):
//
//   step-00000012/             the state after 12 completed steps
//     rank-0.ckpt ... rank-{W-1}.ckpt
//     MANIFEST                 written by rank 0 once every rank's file is
//                              durable; its presence marks completeness
//
// Every file is written atomically: to "<name>.tmp", fsync, rename, fsync of
// the directory. A checkpoint without a MANIFEST (a run killed while writing)
// is ignored.
//
// Rank file, format version 1 (integers little-endian):
//   "TNDMCKPT"  u32 format version  u32 0  u64 payload length
//   payload:    u32 length + "key=value\n" metadata (step, world, rank,
//               graph_hash, data_step, data_sequences), u32 blob count,
//               and per blob u32 name length, name, u64 byte length, bytes
//   u64 checksum of the payload (FNV-1a over 64-bit words)
// A truncated file fails the length check and a corrupted one the checksum.
//
// The runtime's blobs (worker/checkpoint/sharded_checkpoint.cc): "tensors"
// (every param's name, shape and export name: common/archive/weights_file.h),
// per param "param/<name>/shard" and, if trained, ".../exp_avg" and
// ".../exp_avg_sq" (float32, ceil(numel / world) elements, the last rank's
// tail zero padding), and "rng/cpu".
//
// MANIFEST, text: "tandem-checkpoint <version>" then "step", "world",
// "graph_hash", "data_step", "data_sequences" and "files" lines, and a last
// line "checksum <hex>" over everything before it.
#ifndef TANDEM_WORKER_CHECKPOINT_CHECKPOINT_FILES_H_
#define TANDEM_WORKER_CHECKPOINT_CHECKPOINT_FILES_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

inline constexpr uint32_t kCheckpointFormatVersion = 1;

// What identifies a checkpoint and where training resumes from it.
struct CheckpointMeta {
  // Optimizer steps completed; training resumes with iteration `step`.
  int64_t step = 0;
  int32_t world_size = 1;
  // Structural hash of the job's graph (the model, its sharding and
  // micro-batching).
  std::string graph_hash;
  // Position in the data stream: the next global batch's index.
  int64_t data_step = 0;
  // The next sequence (sample) of the data the job reads: where a resume
  // at another global batch size (world, micro_batch, grad_accum) goes on.
  // -1: not recorded (written before it was), read as data_step global
  // batches of the resuming job's size.
  int64_t data_sequences = -1;
};

// One rank's state.
struct RankCheckpoint {
  CheckpointMeta meta;
  int32_t rank = 0;
  // Named byte blobs, in the order written.
  std::vector<std::pair<std::string, std::string>> blobs;

  // The blob called `name`, or nullptr.
  const std::string* Find(absl::string_view name) const;
};

// FNV-1a over 64-bit little-endian words (a zero-padded tail word), seeded
// with the length.
uint64_t CheckpointChecksum(absl::string_view bytes);

// CheckpointChecksum of bytes that come in pieces, `length` of them in all.
class CheckpointChecksummer {
 public:
  explicit CheckpointChecksummer(uint64_t length)
      : h_(14695981039346656037ull ^ length) {}
  void Add(absl::string_view bytes);
  uint64_t Finish();

 private:
  void Mix(const char* word_bytes);
  uint64_t h_;
  char carry_[8];
  size_t carried_ = 0;
};

// How fast a background write goes. On a machine whose cores share one
// budget (a VM's quota, SMT siblings), every cycle the writer spends is
// taken from training, wherever it is scheduled: spread over the steps
// until the next checkpoint, the same work costs each step a few percent
// instead of one step most of its time.
struct WritePace {
  // The write's bytes go out evenly over this many seconds from its start
  // (0: as fast as the disk takes them).
  double spread_s = 0;
  // Once set (someone waits for the write), the rest goes at full speed.
  const std::atomic<bool>* hurry = nullptr;
};

class CheckpointDirectory {
 public:
  explicit CheckpointDirectory(std::string dir) : dir_(std::move(dir)) {}

  const std::string& dir() const { return dir_; }
  // "<dir>/step-%08d".
  std::string StepDir(int64_t step) const;

  // Writes `state` as this rank's file of checkpoint `state.meta.step`
  // atomically (creating the directories), at `pace`. Errors: Unavailable
  // with the path and errno text.
  absl::Status WriteRank(const RankCheckpoint& state,
                         const WritePace& pace = {}) const;
  // Writes the MANIFEST of `meta.step`, naming every rank's file: call once
  // every rank's WriteRank succeeded.
  absl::Status WriteManifest(const CheckpointMeta& meta) const;

  // Steps that have a MANIFEST file, newest first (the manifest itself is
  // checked by ReadManifest).
  std::vector<int64_t> ListWithManifest() const;
  // Errors: NotFound; DataLoss (truncated, corrupted or unparsable manifest);
  // FailedPrecondition (another format version).
  absl::StatusOr<CheckpointMeta> ReadManifest(int64_t step) const;
  // Reads and verifies `rank`'s file of `meta.step` against `meta`.
  // Errors: NotFound; DataLoss (truncated: shorter than its header says;
  // corrupted: checksum or structure); FailedPrecondition (other format
  // version, or metadata that disagrees with the manifest).
  absl::StatusOr<RankCheckpoint> ReadRank(const CheckpointMeta& meta,
                                          int32_t rank) const;

  // Removes checkpoints older than the `keep` newest with a manifest, and
  // directories without one older than the newest with one (left by runs
  // killed while writing). Best effort.
  void Prune(int keep) const;

 private:
  std::string dir_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_CHECKPOINT_CHECKPOINT_FILES_H_
