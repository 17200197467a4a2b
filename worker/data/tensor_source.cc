#include "worker/data/tensor_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/data/token_source.h"

namespace tandem {
namespace {

// Samples read at once when counting the targets.
constexpr int64_t kCountChunkSamples = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<TensorSource>> TensorSource::Open(
    const std::string& path, std::vector<v1::ArchiveInput> inputs) {
  absl::StatusOr<TensorDataFile> file = OpenTensorDataFile(path);
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat("data.path: ", file.status().message()));
  }
  const std::vector<std::string> problems = TensorDataProblems(*file, inputs);
  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.path: ", absl::StrJoin(problems, "; data.path: ")));
  }
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("data.path: '", path, "': ", std::strerror(errno)));
  }
  std::unique_ptr<TensorSource> source(new TensorSource(*std::move(file), fd));
  const TensorDataFile& f = source->file_;
  for (v1::ArchiveInput& spec : inputs) {
    Input in;
    in.array = f.header.Find(spec.name());
    in.cut = !f.lengths.empty() && DynamicDim1(spec);
    in.element_bytes = DTypeElementBytes(in.array->dtype);
    for (size_t d = 2; d < in.array->shape.size(); ++d) {
      in.inner *= in.array->shape[d];
    }
    in.sample_elements =
        in.array->shape.size() >= 2 ? in.array->shape[1] * in.inner : 1;
    in.spec = std::move(spec);
    source->inputs_.push_back(std::move(in));
  }
  // Count each sample's targets once: every step's weights come from them.
  for (const Input& in : source->inputs_) {
    if (in.spec.role() != "targets") continue;
    source->counts_.assign(static_cast<size_t>(f.samples), 0);
    std::vector<int64_t> chunk;
    for (int64_t first = 0; first < f.samples; first += kCountChunkSamples) {
      const int64_t n = std::min(kCountChunkSamples, f.samples - first);
      chunk.resize(static_cast<size_t>(n * in.sample_elements));
      RETURN_IF_ERROR(ReadFileBytes(
          fd, path,
          in.array->begin + static_cast<uint64_t>(first * in.sample_elements *
                                                  in.element_bytes),
          chunk.size() * sizeof(int64_t),
          reinterpret_cast<char*>(chunk.data())));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t valid =
            in.cut ? source->length(first + i) * in.inner : in.sample_elements;
        const int64_t* row =
            &chunk[static_cast<size_t>(i * in.sample_elements)];
        source->counts_[first + i] =
            valid - std::count(row, row + valid, kIgnoredTarget);
      }
    }
  }
  return source;
}

TensorSource::~TensorSource() {
  if (fd_ >= 0) close(fd_);
}

int64_t TensorSource::length(int64_t sample) const {
  return file_.lengths[static_cast<size_t>(sample)];
}

int64_t TensorSource::counted(int64_t sample) const {
  return counts_.empty() ? 1 : counts_[static_cast<size_t>(sample)];
}

absl::Status TensorSource::ReadInput(const Input& in,
                                     absl::Span<const int64_t> samples,
                                     HostArray* out) const {
  out->dtype = in.array->dtype;
  out->shape = in.array->shape;
  out->shape[0] = static_cast<int64_t>(samples.size());
  int64_t cut = 0;
  if (in.cut) {
    for (int64_t s : samples) cut = std::max(cut, length(s));
    out->shape[1] = cut;
  }
  const int64_t row_elements = in.cut ? cut * in.inner : in.sample_elements;
  const int64_t row_bytes = row_elements * in.element_bytes;
  out->bytes.assign(static_cast<size_t>(row_bytes) * samples.size(), '\0');
  const bool targets = in.spec.role() == "targets";
  for (size_t j = 0; j < samples.size(); ++j) {
    char* row = &out->bytes[j * static_cast<size_t>(row_bytes)];
    const int64_t valid =
        in.cut ? length(samples[j]) * in.inner : in.sample_elements;
    RETURN_IF_ERROR(ReadFileBytes(
        fd_, file_.path,
        in.array->begin +
            static_cast<uint64_t>(samples[j] * in.sample_elements *
                                  in.element_bytes),
        static_cast<uint64_t>(valid * in.element_bytes), row));
    // Padding: the bytes were zeroed; targets are ignored, not class 0.
    if (targets && valid < row_elements) {
      int64_t* t = reinterpret_cast<int64_t*>(row);
      std::fill(t + valid, t + row_elements, kIgnoredTarget);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<HostMicroBatch>> TensorSource::ReadRank(
    int64_t step, int32_t grad_accum, int32_t rank, int32_t world,
    int32_t per_rank, int64_t first_sample) const {
  // Every rank counts the whole global batch, micro-batch by micro-batch.
  int64_t global = 0;
  for (int32_t k = 0; k < grad_accum; ++k) {
    for (int32_t r = 0; r < world; ++r) {
      int64_t count = 0;
      const std::vector<int64_t> indices = RankSequenceIndices(
          step, k, grad_accum, r, world, per_rank, first_sample);
      for (int64_t i : indices) count += counted(i % file_.samples);
      if (count == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.path '", file_.path, "': step ", step, ", micro-batch ", k,
            " of rank ", r, " (samples ", indices.front() % file_.samples,
            " to ", indices.back() % file_.samples,
            ", modulo the file's samples) has no target that is not -100 "
            "within its samples' lengths, so its mean loss is undefined; "
            "give every run of batch.micro_batch samples a counted target"));
      }
      global += count;
    }
  }
  std::vector<HostMicroBatch> batches(static_cast<size_t>(grad_accum));
  for (int32_t k = 0; k < grad_accum; ++k) {
    HostMicroBatch& b = batches[k];
    for (int64_t i : RankSequenceIndices(step, k, grad_accum, rank, world,
                                         per_rank, first_sample)) {
      b.samples.push_back(i % file_.samples);
      b.counted += counted(b.samples.back());
    }
    b.global_counted = global;
    for (const Input& in : inputs_) {
      RETURN_IF_ERROR(ReadInput(in, b.samples, &b.arrays[in.spec.name()]));
    }
  }
  return batches;
}

}  // namespace tandem
