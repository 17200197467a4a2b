// Turning token rows, or the tensors or synthetic source's arrays, into the
// executor's MicroBatch tensors, under the names the program reads them by.
#ifndef TANDEM_WORKER_DATA_MICRO_BATCH_H_
#define TANDEM_WORKER_DATA_MICRO_BATCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/synthetic_inputs.h"
#include "worker/data/tensor_source.h"
#include "worker/data/token_source.h"
#include "worker/runtime/program.h"

namespace tandem {

// The program inputs a token source feeds (ProgramInput::role): the names
// of the "tokens" and "targets" inputs ("" when the program has none).
struct TokenInputs {
  std::string tokens = "tokens";
  std::string targets = "targets";
};

// `program`'s token inputs. Errors (InvalidArgument): no input has role
// "tokens", a role repeats, or an input has no role (a token source cannot
// feed it).
absl::StatusOr<TokenInputs> TokenInputsOf(const Program& program);

// `rows`: n row-major sequences of seq_len + 1 tokens (ReadSequences). The
// tokens input is the first seq_len tokens of each row, the targets input
// the last seq_len, both int64 [n, seq_len].
MicroBatch MakeMicroBatch(const std::vector<int64_t>& rows, int64_t n,
                          int64_t seq_len, const TokenInputs& names = {});

// Rank `rank`'s micro-batches of step `step` from `source`
// (RankSequenceIndices, from `first_sequence`).
absl::StatusOr<std::vector<MicroBatch>> ReadRankBatches(
    const TokenSource& source, int64_t step, int32_t grad_accum, int32_t rank,
    int32_t world, int32_t per_rank, const TokenInputs& names = {},
    int64_t first_sequence = 0);

// The program's inputs as the archive declares them, for
// TensorSource::Open.
std::vector<v1::ArchiveInput> ArchiveInputsOf(const Program& program);

// `host`'s arrays as CPU tensors (copied), and its loss weight.
MicroBatch ToMicroBatch(const HostMicroBatch& host);

// Rank `rank`'s micro-batches of step `step` from the tensors source, each
// with its loss weight (TensorSource::ReadRank); `counted`, when given,
// receives the items the rank's micro-batches count.
absl::StatusOr<std::vector<MicroBatch>> ReadRankBatches(
    const TensorSource& source, int64_t step, int32_t grad_accum, int32_t rank,
    int32_t world, int32_t per_rank, int64_t* counted = nullptr,
    int64_t first_sample = 0);

// Rank `rank`'s micro-batches of step `step` from the synthetic inputs
// (SyntheticInputs::ReadRank), each input in its declared dtype.
std::vector<MicroBatch> ReadRankBatches(const SyntheticInputs& source,
                                        int64_t step, int32_t grad_accum,
                                        int32_t rank, int32_t world,
                                        int32_t per_rank,
                                        int64_t first_sample = 0);

}  // namespace tandem

#endif  // TANDEM_WORKER_DATA_MICRO_BATCH_H_
