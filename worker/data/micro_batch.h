// Turning token rows into the executor's MicroBatch tensors.
#ifndef TANDEM_WORKER_DATA_MICRO_BATCH_H_
#define TANDEM_WORKER_DATA_MICRO_BATCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/token_source.h"
#include "worker/runtime/program.h"

namespace tandem {

// `rows`: n row-major sequences of seq_len + 1 tokens (ReadSequences).
// Inputs are the first seq_len tokens of each row, targets the last seq_len.
MicroBatch MakeMicroBatch(const std::vector<int64_t>& rows, int64_t n,
                          int64_t seq_len);

// Rank `rank`'s micro-batches of step `step` from `source`.
absl::StatusOr<std::vector<MicroBatch>> ReadRankBatches(
    const TokenSource& source, int64_t step, int32_t grad_accum, int32_t rank,
    int32_t world, int32_t per_rank);

}  // namespace tandem

#endif  // TANDEM_WORKER_DATA_MICRO_BATCH_H_
