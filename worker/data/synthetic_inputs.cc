#include "worker/data/synthetic_inputs.h"

#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/archive/safetensors.h"
#include "common/archive/tensor_data.h"
#include "common/random_bits.h"
#include "common/status_macros.h"

// The floating values must round alike here and in numpy (synthetic.py):
// this file is built with -ffp-contract=off (worker/CMakeLists.txt), so no
// multiply and add fuse into one rounding.

namespace tandem {
namespace {

constexpr double kSqrt3 = 1.7320508075688772;

template <typename T>
void Store(char* out, int64_t index, T value) {
  std::memcpy(out + index * static_cast<int64_t>(sizeof(T)), &value, sizeof(T));
}

}  // namespace

uint64_t SyntheticBits(uint64_t seed, absl::string_view name, int64_t sample,
                       int64_t element) {
  const uint64_t key =
      SplitMix64(seed ^ SplitMix64(Fnv1a64(name) ^
                                   SplitMix64(static_cast<uint64_t>(sample))));
  return SplitMix64(key + static_cast<uint64_t>(element) * kGoldenGamma);
}

absl::StatusOr<std::unique_ptr<SyntheticInputs>> SyntheticInputs::Make(
    std::vector<v1::ArchiveInput> inputs, uint64_t seed, int32_t vocab,
    int32_t seq_len) {
  std::unique_ptr<SyntheticInputs> source(new SyntheticInputs());
  source->seed_ = seed;
  source->seq_len_ = seq_len;
  std::vector<std::string> problems;
  // The tokens input's example length: a dynamic dim 1 of that length in
  // another input runs along the sequence.
  int64_t example_seq = -1;
  bool token_roles = false;
  for (const v1::ArchiveInput& in : inputs) {
    if (in.role().empty()) continue;
    token_roles = true;
    if (in.shape_size() != 2 || in.dtype() != "int64") {
      problems.push_back(absl::StrCat(
          "input '", in.name(), "' (role ", in.role(),
          ") must be int64 [micro_batch, seq_len] for the token stream"));
    } else if (in.role() == "tokens") {
      example_seq = in.shape(1);
    }
  }
  for (const v1::ArchiveInput& in : inputs) {
    std::vector<int64_t> shape;
    for (int d = 1; d < in.shape_size(); ++d) {
      const bool along_seq = (!in.role().empty() && d == 1) ||
                             (d == 1 && example_seq >= 0 && DynamicDim1(in) &&
                              in.shape(1) == example_seq);
      shape.push_back(along_seq ? seq_len : in.shape(d));
    }
    source->sample_shapes_.push_back(std::move(shape));
  }
  for (std::string& p : SyntheticDataProblems(inputs)) {
    problems.push_back(std::move(p));
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.path: ", absl::StrJoin(problems, "; ")));
  }
  if (token_roles) source->tokens_ = MakeSyntheticTokens(seed, vocab, seq_len);
  source->inputs_ = std::move(inputs);
  return source;
}

void SyntheticInputs::Draw(const v1::ArchiveInput& in,
                           const std::vector<int64_t>& sample_shape,
                           const std::vector<int64_t>& samples,
                           HostArray* out) const {
  out->shape.assign(1, static_cast<int64_t>(samples.size()));
  out->shape.insert(out->shape.end(), sample_shape.begin(), sample_shape.end());
  int64_t per_sample = 1;
  for (int64_t d : sample_shape) per_sample *= d;
  const int64_t n = per_sample * static_cast<int64_t>(samples.size());
  if (!in.role().empty()) {
    // The token stream: tokens are a sequence's first seq_len tokens,
    // targets its last.
    out->dtype = "int64";
    out->bytes.resize(static_cast<size_t>(n) * sizeof(int64_t));
    std::vector<int64_t> row(static_cast<size_t>(seq_len_) + 1);
    const int64_t offset = in.role() == "targets" ? 1 : 0;
    for (size_t j = 0; j < samples.size(); ++j) {
      // The synthetic stream cannot fail.
      (void)tokens_->Read(samples[j], row.data());
      std::memcpy(&out->bytes[j * static_cast<size_t>(seq_len_) * 8],
                  row.data() + offset, static_cast<size_t>(seq_len_) * 8);
    }
    return;
  }
  const v1::ArchiveSynthetic& s = in.synthetic();
  const bool floating = SyntheticFloating(in.dtype());
  const bool wide = in.dtype() == "float64";
  const int64_t bytes = floating && !wide ? 4 : DTypeElementBytes(in.dtype());
  out->dtype = floating && !wide ? std::string("float32") : in.dtype();
  out->bytes.resize(static_cast<size_t>(n * bytes));
  char* data = out->bytes.data();
  const double scale = s.std() * kSqrt3;
  // high - low + 1 in 64 bits; 0 when the range is all of them.
  const uint64_t span =
      static_cast<uint64_t>(s.high()) - static_cast<uint64_t>(s.low()) + 1;
  for (size_t j = 0; j < samples.size(); ++j) {
    for (int64_t e = 0; e < per_sample; ++e) {
      const uint64_t x = SyntheticBits(seed_, in.name(), samples[j], e);
      const int64_t at = static_cast<int64_t>(j) * per_sample + e;
      if (floating) {
        const double u = static_cast<double>(x >> 11) * 0x1.0p-53;
        const double v = s.mean() + scale * (2.0 * u - 1.0);
        if (wide) {
          Store<double>(data, at, v);
        } else {
          Store<float>(data, at, static_cast<float>(v));
        }
        continue;
      }
      const uint64_t drawn =
          static_cast<uint64_t>(s.low()) + (span == 0 ? x : x % span);
      switch (bytes) {
        case 8:
          Store<int64_t>(data, at, static_cast<int64_t>(drawn));
          break;
        case 4:
          Store<int32_t>(data, at, static_cast<int32_t>(drawn));
          break;
        case 2:
          Store<int16_t>(data, at, static_cast<int16_t>(drawn));
          break;
        default:
          Store<uint8_t>(data, at, static_cast<uint8_t>(drawn));
          break;
      }
    }
  }
}

std::vector<HostMicroBatch> SyntheticInputs::ReadRank(
    int64_t step, int32_t grad_accum, int32_t rank, int32_t world,
    int32_t per_rank, int64_t first_sample) const {
  std::vector<HostMicroBatch> batches(static_cast<size_t>(grad_accum));
  const int64_t global = int64_t{grad_accum} * world * per_rank;
  for (int32_t k = 0; k < grad_accum; ++k) {
    HostMicroBatch& b = batches[k];
    b.samples = RankSequenceIndices(step, k, grad_accum, rank, world, per_rank,
                                    first_sample);
    b.counted = static_cast<int64_t>(b.samples.size());
    b.global_counted = global;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      Draw(inputs_[i], sample_shapes_[i], b.samples,
           &b.arrays[inputs_[i].name()]);
    }
  }
  return batches;
}

}  // namespace tandem
