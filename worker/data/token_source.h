// Training data for the worker: a deterministic synthetic token stream and a
// binary token-file reader (uint16 or uint32 tokens), behind one interface.
// Sequences are addressed by their global index, so each rank reads exactly
// its slice of the global batch, and world W with micro_batch m sees the same
// sequences as world 1 with micro_batch W*m. No libtorch.
#ifndef TANDEM_WORKER_DATA_TOKEN_SOURCE_H_
#define TANDEM_WORKER_DATA_TOKEN_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Writes sequence `global_index`: seq_len + 1 tokens (inputs, then the
  // last target), each in [0, vocab).
  virtual absl::Status Read(int64_t global_index, int64_t* out) const = 0;
  virtual int32_t seq_len() const = 0;
};

// Seeded synthetic sequences with learnable structure: each sequence walks
// the vocabulary with its own random start and stride, with 1 token in 8
// replaced by noise. Identical for a (seed, index) on every machine.
std::unique_ptr<TokenSource> MakeSyntheticTokens(uint64_t seed, int32_t vocab,
                                                 int32_t seq_len);

// A file of little-endian uint16 (token_bytes 2) or uint32 (4) tokens.
// Sequence i starts at token (i * seq_len) modulo the windows that fit, so
// the file is read in order and wraps around. Errors: NotFound /
// InvalidArgument naming the path when it is missing, too short for one
// sequence, or holds a token >= vocab (checked as sequences are read).
absl::StatusOr<std::unique_ptr<TokenSource>> OpenTokenFile(
    const std::string& path, int32_t token_bytes, int32_t vocab,
    int32_t seq_len);

// The global sequence indices rank `rank` reads for micro-batch
// `micro_batch` of step `step`: global batch b = (step * grad_accum +
// micro_batch) holds world * per_rank sequences, rank r reads
// first_sequence + [b*world*per_rank + r*per_rank, ... + per_rank).
// `first_sequence`: where step 0 starts (a job resumed at another global
// batch size counts its steps from the resume and starts where the
// checkpoint's data stopped).
std::vector<int64_t> RankSequenceIndices(int64_t step, int32_t micro_batch,
                                         int32_t grad_accum, int32_t rank,
                                         int32_t world, int32_t per_rank,
                                         int64_t first_sequence = 0);

// Reads the sequences of `indices` into one row-major [n, seq_len + 1]
// buffer.
absl::StatusOr<std::vector<int64_t>> ReadSequences(
    const TokenSource& source, const std::vector<int64_t>& indices);

}  // namespace tandem

#endif  // TANDEM_WORKER_DATA_TOKEN_SOURCE_H_
