#include "worker/data/micro_batch.h"

#include <cstring>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "common/status_macros.h"

namespace tandem {

MicroBatch MakeMicroBatch(const std::vector<int64_t>& rows, int64_t n,
                          int64_t seq_len) {
  at::Tensor all = at::empty({n, seq_len + 1}, at::kLong);
  std::memcpy(all.data_ptr<int64_t>(), rows.data(),
              rows.size() * sizeof(int64_t));
  return {all.narrow(1, 0, seq_len).contiguous(),
          all.narrow(1, 1, seq_len).contiguous()};
}

absl::StatusOr<std::vector<MicroBatch>> ReadRankBatches(
    const TokenSource& source, int64_t step, int32_t grad_accum, int32_t rank,
    int32_t world, int32_t per_rank) {
  std::vector<MicroBatch> batches;
  for (int32_t k = 0; k < grad_accum; ++k) {
    ASSIGN_OR_RETURN(
        std::vector<int64_t> rows,
        ReadSequences(source, RankSequenceIndices(step, k, grad_accum, rank,
                                                  world, per_rank)));
    batches.push_back(MakeMicroBatch(rows, per_rank, source.seq_len()));
  }
  return batches;
}

}  // namespace tandem
