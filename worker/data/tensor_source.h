// The `tensors` data source (job spec `data.kind: tensors`; worker/README.md,
// "Exported models"): named arrays from a safetensors file
// (common/archive/tensor_data.h), each rank reading its own samples, micro-
// batch by micro-batch. No libtorch: micro_batch.h turns the host arrays
// into tensors.
//
// Layout. Micro-batch k (of grad_accum A) of step s holds the global samples
// b*W*m ... b*W*m + W*m - 1, b = s*A + k (world W, micro_batch m), each
// taken modulo the file's N samples; rank r reads the contiguous
// [r*m, (r+1)*m) of them (RankSequenceIndices). Step s's global batch is
// samples s*G ... s*G + G - 1, G = W*m*A.
//
// Variable lengths. With a `lengths` array, every input whose dim 1 is
// dynamic is cut, per micro-batch, to the largest length among its own
// samples, and positions at or past a sample's own length are padding: -100
// for the input of role targets (cross_entropy's ignore_index), 0 otherwise.
//
// Loss weights. A micro-batch counts items: its targets that are not -100
// (within each sample's length) when the model has an input of role
// targets, else its samples. Its loss weight is its count over the count of
// the step's whole global batch (every rank, every micro-batch), which every
// rank computes from the file, without communication; the executor weights
// the micro-batch's mean loss by it (executor.h), so gradients and the loss
// are the global batch's mean whatever the lengths.
#ifndef TANDEM_WORKER_DATA_TENSOR_SOURCE_H_
#define TANDEM_WORKER_DATA_TENSOR_SOURCE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/archive/tensor_data.h"
#include "tandem/v1/archive.pb.h"

namespace tandem {

// One input's array for one micro-batch: row-major, little-endian.
struct HostArray {
  // The archive's dtype name ("float32", "int64", ...).
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// One rank's micro-batch, read from the file.
struct HostMicroBatch {
  // File indices of its samples, in order.
  std::vector<int64_t> samples;
  // By model input name.
  std::map<std::string, HostArray> arrays;
  // Items its loss counts, and the step's global batch's.
  int64_t counted = 0;
  int64_t global_counted = 0;
  double loss_weight() const {
    return static_cast<double>(counted) / static_cast<double>(global_counted);
  }
};

class TensorSource {
 public:
  // Opens `path` (OpenTensorDataFile) and checks it against the model's
  // `inputs` (TensorDataProblems); reads the targets once to count each
  // sample's items. Errors: the file's (NotFound, InvalidArgument: prefixed
  // "data.path: ") and DataLoss on a short read.
  static absl::StatusOr<std::unique_ptr<TensorSource>> Open(
      const std::string& path, std::vector<v1::ArchiveInput> inputs);
  ~TensorSource();
  TensorSource(const TensorSource&) = delete;
  TensorSource& operator=(const TensorSource&) = delete;

  int64_t samples() const { return file_.samples; }
  // Items file sample `sample` adds to the loss's count.
  int64_t counted(int64_t sample) const;

  // Rank `rank`'s `grad_accum` micro-batches of step `step`, each with
  // `per_rank` samples (RankSequenceIndices, from `first_sample`). Errors:
  // DataLoss on a short read; InvalidArgument when a micro-batch of the step
  // (on any rank: every rank fails alike) counts no item, naming it and its
  // samples.
  absl::StatusOr<std::vector<HostMicroBatch>> ReadRank(
      int64_t step, int32_t grad_accum, int32_t rank, int32_t world,
      int32_t per_rank, int64_t first_sample = 0) const;

 private:
  struct Input {
    v1::ArchiveInput spec;
    const SafetensorsTensor* array = nullptr;
    // Cut along dim 1 to the micro-batch's longest sample, padded past
    // each sample's length.
    bool cut = false;
    // Elements per step of dim 1 (the product of dims >= 2) and per sample.
    int64_t inner = 1;
    int64_t sample_elements = 1;
    int64_t element_bytes = 0;
  };
  TensorSource(TensorDataFile file, int fd) : file_(std::move(file)), fd_(fd) {}
  int64_t length(int64_t sample) const;
  absl::Status ReadInput(const Input& in, absl::Span<const int64_t> samples,
                         HostArray* out) const;

  TensorDataFile file_;
  int fd_ = -1;
  std::vector<Input> inputs_;
  // Per file sample, with a targets input; empty: each sample counts 1.
  std::vector<int64_t> counts_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_DATA_TENSOR_SOURCE_H_
