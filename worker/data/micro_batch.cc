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
          "', not tokens or targets); use data.kind tensors or synthetic"));
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
        "it; use data.kind tensors"));
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
    int32_t world, int32_t per_rank, const TokenInputs& names,
    int64_t first_sequence) {
  std::vector<MicroBatch> batches;
  for (int32_t k = 0; k < grad_accum; ++k) {
    ASSIGN_OR_RETURN(std::vector<int64_t> rows,
                     ReadSequences(source, RankSequenceIndices(
                                               step, k, grad_accum, rank, world,
                                               per_rank, first_sequence)));
    batches.push_back(MakeMicroBatch(rows, per_rank, source.seq_len(), names));
  }
  return batches;
}

namespace {

at::ScalarType ScalarTypeOf(const std::string& dtype) {
  static const std::pair<const char*, at::ScalarType> kTypes[] = {
      {"float64", at::kDouble}, {"float32", at::kFloat},
      {"float16", at::kHalf},   {"bfloat16", at::kBFloat16},
      {"int64", at::kLong},     {"int32", at::kInt},
      {"int16", at::kShort},    {"int8", at::kChar},
      {"uint8", at::kByte},     {"bool", at::kBool}};
  for (const auto& [name, type] : kTypes) {
    if (dtype == name) return type;
  }
  TORCH_CHECK(false, "no tensor dtype for '", dtype, "'");
}

}  // namespace

std::vector<v1::ArchiveInput> ArchiveInputsOf(const Program& program) {
  std::vector<v1::ArchiveInput> inputs;
  for (const ProgramInput& p : program.inputs) {
    v1::ArchiveInput& in = inputs.emplace_back();
    in.set_name(p.name);
    in.set_role(p.role);
    in.set_dtype(p.dtype);
    for (int64_t d : p.shape) in.add_shape(d);
    for (int32_t d : p.dynamic_dims) in.add_dynamic_dims(d);
    if (p.synthetic.has_value()) *in.mutable_synthetic() = *p.synthetic;
  }
  return inputs;
}

MicroBatch ToMicroBatch(const HostMicroBatch& host) {
  MicroBatch batch;
  for (const auto& [name, array] : host.arrays) {
    at::Tensor t = at::empty(array.shape, ScalarTypeOf(array.dtype));
    TORCH_CHECK(static_cast<size_t>(t.nbytes()) == array.bytes.size(),
                "array '", name, "' holds ", array.bytes.size(), " bytes for ",
                t.nbytes());
    std::memcpy(t.data_ptr(), array.bytes.data(), array.bytes.size());
    batch.tensors[name] = std::move(t);
  }
  batch.loss_weight = host.loss_weight();
  return batch;
}

absl::StatusOr<std::vector<MicroBatch>> ReadRankBatches(
    const TensorSource& source, int64_t step, int32_t grad_accum, int32_t rank,
    int32_t world, int32_t per_rank, int64_t* counted, int64_t first_sample) {
  ASSIGN_OR_RETURN(
      std::vector<HostMicroBatch> host,
      source.ReadRank(step, grad_accum, rank, world, per_rank, first_sample));
  std::vector<MicroBatch> batches;
  if (counted != nullptr) *counted = 0;
  for (const HostMicroBatch& h : host) {
    batches.push_back(ToMicroBatch(h));
    if (counted != nullptr) *counted += h.counted;
  }
  return batches;
}

std::vector<MicroBatch> ReadRankBatches(const SyntheticInputs& source,
                                        int64_t step, int32_t grad_accum,
                                        int32_t rank, int32_t world,
                                        int32_t per_rank,
                                        int64_t first_sample) {
  std::vector<MicroBatch> batches;
  for (const HostMicroBatch& h :
       source.ReadRank(step, grad_accum, rank, world, per_rank, first_sample)) {
    MicroBatch batch = ToMicroBatch(h);
    // float16 and bfloat16 were drawn as float32: round them here.
    for (const v1::ArchiveInput& in : source.inputs()) {
      at::Tensor& t = batch.tensors[in.name()];
      const at::ScalarType declared = ScalarTypeOf(in.dtype());
      if (t.scalar_type() != declared) t = t.to(declared);
    }
    batches.push_back(std::move(batch));
  }
  return batches;
}

}  // namespace tandem
