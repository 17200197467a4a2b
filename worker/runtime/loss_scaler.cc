#include "worker/runtime/loss_scaler.h"

#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// "TLS1", then the scale's fp32 bits, the tracker and the skipped count.
constexpr char kMagic[4] = {'T', 'L', 'S', '1'};
constexpr size_t kBlobBytes = 4 + 4 + 4 + 8;

template <typename T>
void PutLittleEndian(T value, std::string& out) {
  unsigned char bytes[sizeof(T)];
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  for (size_t i = 0; i < sizeof(T); ++i) {
    bytes[i] = static_cast<unsigned char>(bits >> (8 * i));
  }
  out.append(reinterpret_cast<const char*>(bytes), sizeof(T));
}

template <typename T>
T GetLittleEndian(const char* in) {
  uint64_t bits = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    bits |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  }
  T value;
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

absl::Status CheckState(const LossScaleState& s) {
  if (!std::isfinite(s.scale) || s.scale <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss scale ", s.scale, " is not a positive number"));
  }
  if (s.growth_tracker < 0 || s.skipped_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss scaler counts must not be negative (growth tracker ",
        s.growth_tracker, ", skipped steps ", s.skipped_steps, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

LossScaler::LossScaler(const LossScaleOptions& options) : options_(options) {
  state_.scale = options.enabled ? options.init_scale : 1.0f;
}

float LossScaler::inv_scale() const {
  return static_cast<float>(1.0 / static_cast<double>(state_.scale));
}

void LossScaler::Update(bool found_inf) {
  if (!options_.enabled) return;
  if (found_inf) {
    state_.scale = static_cast<float>(static_cast<double>(state_.scale) *
                                      options_.backoff_factor);
    state_.growth_tracker = 0;
    ++state_.skipped_steps;
    return;
  }
  const int32_t successful = state_.growth_tracker + 1;
  if (successful == options_.growth_interval) {
    const float grown = static_cast<float>(static_cast<double>(state_.scale) *
                                           options_.growth_factor);
    if (std::isfinite(grown)) state_.scale = grown;
    state_.growth_tracker = 0;
  } else {
    state_.growth_tracker = successful;
  }
}

absl::Status LossScaler::Restore(const LossScaleState& state) {
  if (absl::Status s = CheckState(state); !s.ok()) return s;
  state_ = state;
  return absl::OkStatus();
}

std::string LossScaler::Serialize(const LossScaleState& state) {
  std::string out(kMagic, sizeof(kMagic));
  PutLittleEndian(state.scale, out);
  PutLittleEndian(state.growth_tracker, out);
  PutLittleEndian(state.skipped_steps, out);
  return out;
}

absl::StatusOr<LossScaleState> LossScaler::Parse(absl::string_view blob) {
  if (blob.size() != kBlobBytes ||
      std::memcmp(blob.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(
        absl::StrCat("the loss scaler's state is damaged: ", blob.size(),
                     " bytes, expected ", kBlobBytes, " starting with 'TLS1'"));
  }
  LossScaleState s;
  s.scale = GetLittleEndian<float>(blob.data() + 4);
  s.growth_tracker = GetLittleEndian<int32_t>(blob.data() + 8);
  s.skipped_steps = GetLittleEndian<int64_t>(blob.data() + 12);
  if (absl::Status check = CheckState(s); !check.ok()) {
    return absl::DataLossError(
        absl::StrCat("the loss scaler's state is damaged: ", check.message()));
  }
  return s;
}

}  // namespace tandem
