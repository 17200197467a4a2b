// The synthetic data source for an exported model's named inputs (job spec
// `data.kind: synthetic`; worker/README.md, "Synthetic inputs"): every input
// drawn from what its archive declares (v1::ArchiveSynthetic), so a model
// that takes images and labels trains without a data file. No libtorch:
// micro_batch.h turns the host arrays into tensors.
//
// Samples are addressed like the token sources' sequences
// (RankSequenceIndices): world W with micro_batch m sees the same samples as
// world 1 with micro_batch W*m.
//
// Inputs of role tokens and targets come from the synthetic token stream
// (MakeSyntheticTokens: sequence i's first and last seq_len tokens), so a
// language model reads what it reads without named inputs. Every other
// input has the example batch's shape with dim 0 the micro-batch, except a
// dynamic dim 1 of the tokens input's example length (a mask over the
// sequence), which follows batch.seq_len. Element e of sample i of input N:
//
//   key = SplitMix64(seed ^ SplitMix64(FNV-1a-64(N) ^ SplitMix64(i)))
//   x   = SplitMix64(key + e * 0x9e3779b97f4a7c15)        (mod 2^64)
//   integer or bool: low + x mod (high - low + 1)
//   floating: mean + (std * 1.7320508075688772) * (2u - 1), u = (x >> 11) /
//             2^53, in double, rounded to float32 (float64 stays; float16
//             and bfloat16 round from the float32)
//
// client/python/tandem/synthetic.py computes the same values bit for bit.
#ifndef TANDEM_WORKER_DATA_SYNTHETIC_INPUTS_H_
#define TANDEM_WORKER_DATA_SYNTHETIC_INPUTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tandem/v1/archive.pb.h"
#include "worker/data/tensor_source.h"
#include "worker/data/token_source.h"

namespace tandem {

// The generator's raw 64 bits for element `element` of sample `sample` of
// the input named `name`.
uint64_t SyntheticBits(uint64_t seed, absl::string_view name, int64_t sample,
                       int64_t element);

class SyntheticInputs {
 public:
  // `inputs`: the archive's; `vocab` and `seq_len`: the job's model.vocab
  // and batch.seq_len. Errors (InvalidArgument, prefixed "model.path: "): an
  // input without role that has no synthetic description (an archive
  // written before there was one: export it again), a dtype the generator
  // cannot draw, low > high, a negative or non-finite std, or token inputs
  // the token stream cannot feed (TokenInputsOf's rules).
  static absl::StatusOr<std::unique_ptr<SyntheticInputs>> Make(
      std::vector<v1::ArchiveInput> inputs, uint64_t seed, int32_t vocab,
      int32_t seq_len);

  // Rank `rank`'s `grad_accum` micro-batches of step `step`, each with
  // `per_rank` samples (RankSequenceIndices, from `first_sample`). Every
  // sample counts 1 towards the loss weights.
  std::vector<HostMicroBatch> ReadRank(int64_t step, int32_t grad_accum,
                                       int32_t rank, int32_t world,
                                       int32_t per_rank,
                                       int64_t first_sample = 0) const;

  // The dtype each input is declared with; ReadRank's arrays hold float16
  // and bfloat16 inputs as float32 (micro_batch.h rounds them).
  const std::vector<v1::ArchiveInput>& inputs() const { return inputs_; }

 private:
  SyntheticInputs() = default;
  // `in`'s arrays for `samples`, each of `sample_shape`.
  void Draw(const v1::ArchiveInput& in,
            const std::vector<int64_t>& sample_shape,
            const std::vector<int64_t>& samples, HostArray* out) const;

  std::vector<v1::ArchiveInput> inputs_;
  // Per input: the per-sample shape (without dim 0).
  std::vector<std::vector<int64_t>> sample_shapes_;
  uint64_t seed_ = 0;
  int32_t seq_len_ = 0;
  std::unique_ptr<TokenSource> tokens_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_DATA_SYNTHETIC_INPUTS_H_
