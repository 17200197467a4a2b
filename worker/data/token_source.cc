#include "worker/data/token_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/random_bits.h"

namespace tandem {

namespace {

class SyntheticTokens final : public TokenSource {
 public:
  SyntheticTokens(uint64_t seed, int32_t vocab, int32_t seq_len)
      : seed_(seed), vocab_(vocab), seq_len_(seq_len) {}

  absl::Status Read(int64_t global_index, int64_t* out) const override {
    uint64_t state =
        SplitMix64(seed_ ^ SplitMix64(static_cast<uint64_t>(global_index)));
    auto next = [&state] { return state = SplitMix64(state); };
    const uint64_t v = static_cast<uint64_t>(vocab_);
    uint64_t token = next() % v;
    const uint64_t stride = 1 + next() % std::min<uint64_t>(v, 7);
    for (int32_t i = 0; i <= seq_len_; ++i) {
      const uint64_t r = next();
      out[i] = static_cast<int64_t>((r & 7) == 0 ? (r >> 3) % v : token);
      token = (token + stride) % v;
    }
    return absl::OkStatus();
  }
  int32_t seq_len() const override { return seq_len_; }

 private:
  const uint64_t seed_;
  const int32_t vocab_;
  const int32_t seq_len_;
};

class TokenFile final : public TokenSource {
 public:
  TokenFile(std::string path, int fd, int32_t token_bytes, int64_t tokens,
            int32_t vocab, int32_t seq_len)
      : path_(std::move(path)),
        fd_(fd),
        token_bytes_(token_bytes),
        tokens_(tokens),
        vocab_(vocab),
        seq_len_(seq_len) {}
  ~TokenFile() override { close(fd_); }

  absl::Status Read(int64_t global_index, int64_t* out) const override {
    const int64_t windows = (tokens_ - 1) / seq_len_;  // >= 1
    const int64_t first = (global_index % windows) * seq_len_;
    const int64_t count = seq_len_ + 1;
    std::vector<unsigned char> buf(static_cast<size_t>(count * token_bytes_));
    const ssize_t got =
        pread(fd_, buf.data(), buf.size(), first * token_bytes_);
    if (got != static_cast<ssize_t>(buf.size())) {
      return absl::DataLossError(absl::StrCat(
          "data.path ", path_, ": short read at token ", first, " (",
          got < 0 ? std::strerror(errno) : "file changed while training?",
          ")"));
    }
    for (int64_t i = 0; i < count; ++i) {
      const unsigned char* p = &buf[static_cast<size_t>(i * token_bytes_)];
      uint32_t t = p[0] | (uint32_t{p[1]} << 8);
      if (token_bytes_ == 4)
        t |= (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
      if (t >= static_cast<uint32_t>(vocab_)) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.path ", path_, ": token ", t, " at position ",
                         first + i, " is outside model.vocab (", vocab_,
                         "); raise the vocab or check data.token_bytes"));
      }
      out[i] = t;
    }
    return absl::OkStatus();
  }
  int32_t seq_len() const override { return seq_len_; }

 private:
  const std::string path_;
  const int fd_;
  const int32_t token_bytes_;
  const int64_t tokens_;
  const int32_t vocab_;
  const int32_t seq_len_;
};

}  // namespace

std::unique_ptr<TokenSource> MakeSyntheticTokens(uint64_t seed, int32_t vocab,
                                                 int32_t seq_len) {
  return std::make_unique<SyntheticTokens>(seed, vocab, seq_len);
}

absl::StatusOr<std::unique_ptr<TokenSource>> OpenTokenFile(
    const std::string& path, int32_t token_bytes, int32_t vocab,
    int32_t seq_len) {
  if (token_bytes != 2 && token_bytes != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.token_bytes must be 2 (uint16) or 4 (uint32), got ",
                     token_bytes));
  }
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("data.path ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size % token_bytes != 0) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "data.path ", path, ": size is not a multiple of data.token_bytes (",
        token_bytes, ")"));
  }
  const int64_t tokens = st.st_size / token_bytes;
  if (tokens < int64_t{seq_len} + 1) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "data.path ", path, ": holds ", tokens,
        " tokens, fewer than one sequence (batch.seq_len + 1 = ", seq_len + 1,
        ")"));
  }
  return std::unique_ptr<TokenSource>(
      new TokenFile(path, fd, token_bytes, tokens, vocab, seq_len));
}

std::vector<int64_t> RankSequenceIndices(int64_t step, int32_t micro_batch,
                                         int32_t grad_accum, int32_t rank,
                                         int32_t world, int32_t per_rank,
                                         int64_t first_sequence) {
  const int64_t batch = step * grad_accum + micro_batch;
  const int64_t first = first_sequence + batch * world * per_rank +
                        static_cast<int64_t>(rank) * per_rank;
  std::vector<int64_t> indices(static_cast<size_t>(per_rank));
  for (int32_t i = 0; i < per_rank; ++i) indices[i] = first + i;
  return indices;
}

absl::StatusOr<std::vector<int64_t>> ReadSequences(
    const TokenSource& source, const std::vector<int64_t>& indices) {
  const int64_t width = source.seq_len() + 1;
  std::vector<int64_t> out(indices.size() * static_cast<size_t>(width));
  for (size_t i = 0; i < indices.size(); ++i) {
    absl::Status s = source.Read(indices[i], &out[i * width]);
    if (!s.ok()) return s;
  }
  return out;
}

}  // namespace tandem
