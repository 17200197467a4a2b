#include "worker/data/micro_batch.h"

#include <cstring>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem {

absl::StatusOr<TokenInputs> TokenInputsOf(const Program& program) {
  TokenInputs names{"", ""};
  for (const ProgramInput& in : program.inputs) {
    std::string* slot = in.role == "tokens"    ? &names.tokens
                        : in.role == "targets" ? &names.targets
                                               : nullptr;
    if (slot == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", program.name, "' takes input '", in.name,
          "', which a token data source cannot feed (its role is '", in.role,
          "', not tokens or targets); use a data source of named tensors"));
    }
    if (!slot->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model '", program.name, "' has two inputs of role ",
                       in.role, ": '", *slot, "' and '", in.name, "'"));
    }
    *slot = in.name;
  }
  if (names.tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", program.name,
        "' has no input of role tokens, so a token data source cannot feed "
        "it; use a data source of named tensors"));
  }
  return names;
}

MicroBatch MakeMicroBatch(const std::vector<int64_t>& rows, int64_t n,
                          int64_t seq_len, const TokenInputs& names) {
  at::Tensor all = at::empty({n, seq_len + 1}, at::kLong);
  std::memcpy(all.data_ptr<int64_t>(), rows.data(),
              rows.size() * sizeof(int64_t));
  MicroBatch batch;
  if (!names.tokens.empty()) {
    batch.tensors[names.tokens] = all.narrow(1, 0, seq_len).contiguous();
  }
  if (!names.targets.empty()) {
    batch.tensors[names.targets] = all.narrow(1, 1, seq_len).contiguous();
  }
  return batch;
}

absl::StatusOr<std::vector<MicroBatch>> ReadRankBatches(
    const TokenSource& source, int64_t step, int32_t grad_accum, int32_t rank,
    int32_t world, int32_t per_rank, const TokenInputs& names) {
  std::vector<MicroBatch> batches;
  for (int32_t k = 0; k < grad_accum; ++k) {
    ASSIGN_OR_RETURN(
        std::vector<int64_t> rows,
        ReadSequences(source, RankSequenceIndices(step, k, grad_accum, rank,
                                                  world, per_rank)));
    batches.push_back(MakeMicroBatch(rows, per_rank, source.seq_len(), names));
  }
  return batches;
}

}  // namespace tandem
