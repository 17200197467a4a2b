#include "worker/checkpoint/checkpoint_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

constexpr char kMagic[8] = {'T', 'N', 'D', 'M', 'C', 'K', 'P', 'T'};
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8;
constexpr char kManifest[] = "MANIFEST";

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat(what, " '", path, "': ", std::strerror(errno)));
}

absl::Status MakeDirs(const std::string& dir) {
  std::string prefix;
  for (absl::string_view part : absl::StrSplit(dir, '/')) {
    absl::StrAppend(&prefix, part, "/");
    if (part.empty()) continue;
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return Errno("cannot create checkpoint directory", prefix);
    }
  }
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Errno("cannot open", dir);
  const int rc = fsync(fd);
  close(fd);
  return rc == 0 ? absl::OkStatus() : Errno("cannot fsync", dir);
}

// Bytes written between two requests that the kernel start writing them
// back: a checkpoint's dirty pages go to disk while it is written, not all
// at the fsync, and never pile up in the page cache.
constexpr size_t kWritebackBytes = size_t{8} << 20;
// How much of a blob is checksummed and written at once: small enough to
// still be in the cache when write() copies it.
constexpr size_t kChunkBytes = size_t{1} << 20;
// Direct I/O: the alignment of the staging buffer, of every write's length
// and of its file offset (a multiple of any device's logical block size),
// and the staging buffer's size.
constexpr size_t kDirectAlign = 4096;
constexpr size_t kStagingBytes = size_t{1} << 20;

// The longest a paced writer sleeps before it looks at `hurry` again.
constexpr auto kPaceSlice = std::chrono::milliseconds(20);

// The staging buffer of the calling thread's direct writes: allocated once
// per writer thread, so a checkpoint faults in no fresh memory.
char* StagingBuffer() {
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<char, Free> buffer(
      static_cast<char*>(std::aligned_alloc(kDirectAlign, kStagingBytes)));
  return buffer.get();
}

// Whether rank files go past the page cache: yes, unless
// TANDEM_CHECKPOINT_DIRECT_IO=0 (for a file system whose direct I/O is
// slow or broken).
bool DirectIoFromEnvironment() {
  const char* v = std::getenv("TANDEM_CHECKPOINT_DIRECT_IO");
  return v == nullptr || std::string_view(v) != "0";
}

// An open temporary file written front to back.
//
// A direct sink (the file opened with O_DIRECT) bypasses the page cache:
// the bytes are gathered in an aligned staging buffer and go from there
// to the device, so the kernel neither copies them nor allocates, dirties
// and writes back page-cache pages for them. On this kind of machine that
// work was most of the CPU a checkpoint took from training (bench/README.md,
// "checkpoint_stall"). A file system that refuses direct writes gets
// buffered ones.
class FileSink {
 public:
  FileSink(int fd, const std::string& path, bool direct)
      : fd_(fd), path_(path), staging_(direct ? StagingBuffer() : nullptr) {}

  bool direct() const { return staging_ != nullptr; }

  // From now on, `total` bytes go out evenly over `pace.spread_s`.
  void Pace(const WritePace& pace, uint64_t total) {
    pace_ = pace;
    total_ = total;
    start_ = std::chrono::steady_clock::now();
  }

  absl::Status Write(absl::string_view data) {
    if (!direct()) return WriteOut(data);
    while (!data.empty()) {
      const size_t n = std::min(data.size(), kStagingBytes - staged_);
      std::memcpy(staging_ + staged_, data.data(), n);
      staged_ += n;
      data.remove_prefix(n);
      if (staged_ == kStagingBytes) {
        RETURN_IF_ERROR(WriteOut(absl::string_view(staging_, staged_)));
        staged_ = 0;
      }
    }
    return absl::OkStatus();
  }

  // Writes what is staged. A direct sink's last write is padded to the
  // alignment, and the file cut back to the bytes written.
  absl::Status Finish() {
    if (!direct() || staged_ == 0) return absl::OkStatus();
    const size_t length = written_ + staged_;
    const size_t padded =
        (staged_ + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    std::memset(staging_ + staged_, 0, padded - staged_);
    RETURN_IF_ERROR(WriteOut(absl::string_view(staging_, padded)));
    staged_ = 0;
    if (ftruncate(fd_, static_cast<off_t>(length)) != 0) {
      return Errno("cannot truncate", path_);
    }
    written_ = length;
    return absl::OkStatus();
  }

 private:
  absl::Status WriteOut(absl::string_view data) {
    WaitForPace();
    while (!data.empty()) {
      const ssize_t n = write(fd_, data.data(), data.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EINVAL && direct() && !fell_back_) {
        // The file system takes no direct writes of this alignment: the
        // rest goes through the page cache.
        const int flags = fcntl(fd_, F_GETFL);
        if (flags >= 0 && fcntl(fd_, F_SETFL, flags & ~O_DIRECT) == 0) {
          fell_back_ = true;
          continue;
        }
      }
      if (n <= 0) return Errno("cannot write", path_);
      data.remove_prefix(static_cast<size_t>(n));
      written_ += static_cast<size_t>(n);
    }
    if (!direct() && written_ - flushed_ >= kWritebackBytes) {
      // Asynchronous: starts the writeback of what is dirty so far.
      (void)sync_file_range(fd_, static_cast<off64_t>(flushed_),
                            static_cast<off64_t>(written_ - flushed_),
                            SYNC_FILE_RANGE_WRITE);
      flushed_ = written_;
    }
    return absl::OkStatus();
  }

  // Sleeps while the bytes written run ahead of the pace.
  void WaitForPace() const {
    if (pace_.spread_s <= 0 || total_ == 0) return;
    const auto due =
        start_ +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(pace_.spread_s *
                                          static_cast<double>(written_) /
                                          static_cast<double>(total_)));
    while (pace_.hurry == nullptr || !pace_.hurry->load()) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= due) return;
      std::this_thread::sleep_for(
          std::min<std::chrono::steady_clock::duration>(due - now, kPaceSlice));
    }
  }

  const int fd_;
  const std::string& path_;
  char* const staging_;
  size_t staged_ = 0;
  bool fell_back_ = false;
  size_t written_ = 0;
  size_t flushed_ = 0;
  WritePace pace_;
  uint64_t total_ = 0;
  std::chrono::steady_clock::time_point start_;
};

// temp file written by `fill`, fsync, rename, fsync of the directory. With
// `direct`, the file is written past the page cache where the file system
// allows it (FileSink).
absl::Status WriteAtomically(
    const std::string& dir, const std::string& name, bool direct,
    const std::function<absl::Status(FileSink&)>& fill) {
  const std::string path = absl::StrCat(dir, "/", name);
  const std::string tmp = absl::StrCat(path, ".tmp");
  int fd = -1;
  if (direct) {
    fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    // EINVAL: no direct I/O on this file system (tmpfs).
    if (fd < 0 && errno != EINVAL) return Errno("cannot create", tmp);
    direct = fd >= 0;
  }
  if (fd < 0) fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Errno("cannot create", tmp);
  FileSink sink(fd, tmp, direct);
  absl::Status s = fill(sink);
  if (s.ok()) s = sink.Finish();
  if (!s.ok()) {
    close(fd);
    return s;
  }
  if (fsync(fd) != 0) {
    absl::Status s = Errno("cannot fsync", tmp);
    close(fd);
    return s;
  }
  if (close(fd) != 0) return Errno("cannot close", tmp);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return Errno("cannot rename into", path);
  }
  return SyncDir(dir);
}

absl::Status WriteAtomically(const std::string& dir, const std::string& name,
                             absl::string_view data) {
  return WriteAtomically(dir, name, /*direct=*/false,
                         [data](FileSink& sink) { return sink.Write(data); });
}

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("no file '", path, "'"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

template <typename T>
void Put(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian hosts only
  out.append(bytes, sizeof(T));
}

// Reads from a payload, failing (ok = false) instead of running past it.
class Reader {
 public:
  explicit Reader(absl::string_view data) : data_(data) {}
  template <typename T>
  T Get() {
    T value{};
    if (!ok_ || data_.size() < sizeof(T)) {
      ok_ = false;
      return value;
    }
    std::memcpy(&value, data_.data(), sizeof(T));
    data_.remove_prefix(sizeof(T));
    return value;
  }
  absl::string_view Bytes(uint64_t n) {
    if (!ok_ || data_.size() < n) {
      ok_ = false;
      return {};
    }
    absl::string_view out = data_.substr(0, n);
    data_.remove_prefix(n);
    return out;
  }
  bool ok() const { return ok_; }
  bool done() const { return data_.empty(); }

 private:
  absl::string_view data_;
  bool ok_ = true;
};

std::string MetaText(const CheckpointMeta& m, int32_t rank) {
  return absl::StrCat("step=", m.step, "\nworld=", m.world_size,
                      "\nrank=", rank, "\ngraph_hash=", m.graph_hash,
                      "\ndata_step=", m.data_step,
                      "\ndata_sequences=", m.data_sequences, "\n");
}

std::string RankFileName(int32_t rank) {
  return absl::StrCat("rank-", rank, ".ckpt");
}

}  // namespace

const std::string* RankCheckpoint::Find(absl::string_view name) const {
  for (const auto& [n, bytes] : blobs) {
    if (n == name) return &bytes;
  }
  return nullptr;
}

void CheckpointChecksummer::Add(absl::string_view bytes) {
  // Complete a word begun by the previous piece first.
  while (carried_ > 0 && carried_ < 8 && !bytes.empty()) {
    carry_[carried_++] = bytes.front();
    bytes.remove_prefix(1);
  }
  if (carried_ == 8) {
    Mix(carry_);
    carried_ = 0;
  }
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) Mix(bytes.data() + i);
  for (; i < bytes.size(); ++i) carry_[carried_++] = bytes[i];
}

uint64_t CheckpointChecksummer::Finish() {
  if (carried_ > 0) {
    std::memset(carry_ + carried_, 0, 8 - carried_);
    Mix(carry_);
    carried_ = 0;
  }
  return h_;
}

void CheckpointChecksummer::Mix(const char* word_bytes) {
  uint64_t word;
  std::memcpy(&word, word_bytes, 8);
  h_ = (h_ ^ word) * 1099511628211ull;
}

uint64_t CheckpointChecksum(absl::string_view bytes) {
  CheckpointChecksummer sum(bytes.size());
  sum.Add(bytes);
  return sum.Finish();
}

std::string CheckpointDirectory::StepDir(int64_t step) const {
  return absl::StrFormat("%s/step-%08d", dir_, step);
}

absl::Status CheckpointDirectory::WriteRank(const RankCheckpoint& state,
                                            const WritePace& pace) const {
  // The payload is written piece by piece, straight from the blobs: no copy
  // of the whole (as large as the rank's shards and moments) is made.
  const std::string meta = MetaText(state.meta, state.rank);
  uint64_t length = 4 + meta.size() + 4;
  for (const auto& [name, bytes] : state.blobs) {
    length += 4 + name.size() + 8 + bytes.size();
  }
  std::string header(kMagic, sizeof(kMagic));
  Put<uint32_t>(header, kCheckpointFormatVersion);
  Put<uint32_t>(header, 0);
  Put<uint64_t>(header, length);

  const std::string dir = StepDir(state.meta.step);
  if (absl::Status s = MakeDirs(dir); !s.ok()) return s;
  return WriteAtomically(
      dir, RankFileName(state.rank), DirectIoFromEnvironment(),
      [&](FileSink& sink) -> absl::Status {
        sink.Pace(pace, header.size() + length + sizeof(uint64_t));
        if (absl::Status s = sink.Write(header); !s.ok()) return s;
        CheckpointChecksummer sum(length);
        // A piece of the payload: checksummed and written a chunk at a time.
        auto payload = [&](absl::string_view piece) -> absl::Status {
          for (size_t at = 0; at < piece.size(); at += kChunkBytes) {
            const absl::string_view chunk = piece.substr(at, kChunkBytes);
            sum.Add(chunk);
            if (absl::Status s = sink.Write(chunk); !s.ok()) return s;
          }
          return absl::OkStatus();
        };
        auto field = [&](auto value) {
          std::string bytes;
          Put(bytes, value);
          return payload(bytes);
        };
        RETURN_IF_ERROR(field(static_cast<uint32_t>(meta.size())));
        RETURN_IF_ERROR(payload(meta));
        RETURN_IF_ERROR(field(static_cast<uint32_t>(state.blobs.size())));
        for (const auto& [name, bytes] : state.blobs) {
          RETURN_IF_ERROR(field(static_cast<uint32_t>(name.size())));
          RETURN_IF_ERROR(payload(name));
          RETURN_IF_ERROR(field(static_cast<uint64_t>(bytes.size())));
          RETURN_IF_ERROR(payload(bytes));
        }
        std::string trailer;
        Put<uint64_t>(trailer, sum.Finish());
        return sink.Write(trailer);
      });
}

absl::Status CheckpointDirectory::WriteManifest(
    const CheckpointMeta& meta) const {
  std::string text =
      absl::StrCat("tandem-checkpoint ", kCheckpointFormatVersion, "\nstep ",
                   meta.step, "\nworld ", meta.world_size, "\ngraph_hash ",
                   meta.graph_hash, "\ndata_step ", meta.data_step,
                   "\ndata_sequences ", meta.data_sequences, "\nfiles");
  for (int32_t r = 0; r < meta.world_size; ++r) {
    absl::StrAppend(&text, " ", RankFileName(r));
  }
  text += "\n";
  absl::StrAppend(&text, "checksum ",
                  absl::StrFormat("%016x", CheckpointChecksum(text)), "\n");
  return WriteAtomically(StepDir(meta.step), kManifest, text);
}

std::vector<int64_t> CheckpointDirectory::ListWithManifest() const {
  std::vector<int64_t> steps;
  DIR* d = opendir(dir_.c_str());
  if (d == nullptr) return steps;
  while (dirent* e = readdir(d)) {
    absl::string_view name = e->d_name;
    int64_t step = 0;
    if (!absl::ConsumePrefix(&name, "step-") ||
        !absl::SimpleAtoi(name, &step)) {
      continue;
    }
    struct stat st;
    if (stat(absl::StrCat(StepDir(step), "/", kManifest).c_str(), &st) == 0) {
      steps.push_back(step);
    }
  }
  closedir(d);
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

absl::StatusOr<CheckpointMeta> CheckpointDirectory::ReadManifest(
    int64_t step) const {
  const std::string path = absl::StrCat(StepDir(step), "/", kManifest);
  absl::StatusOr<std::string> text = ReadWhole(path);
  if (!text.ok()) return text.status();
  const size_t last = text->rfind("checksum ");
  auto corrupt = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("manifest '", path, "' ", why));
  };
  if (last == std::string::npos) return corrupt("is truncated (no checksum)");
  uint64_t expected = 0;
  absl::string_view sum =
      absl::StripAsciiWhitespace(absl::string_view(*text).substr(last + 9));
  if (!absl::SimpleHexAtoi(sum, &expected) ||
      expected !=
          CheckpointChecksum(absl::string_view(*text).substr(0, last))) {
    return corrupt("is corrupted (checksum mismatch)");
  }
  CheckpointMeta meta;
  int64_t version = -1;
  bool has_step = false, has_world = false;
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(*text).substr(0, last), '\n')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(' ', 1));
    if (kv.first == "tandem-checkpoint") {
      if (!absl::SimpleAtoi(kv.second, &version)) return corrupt("bad version");
    } else if (kv.first == "step") {
      has_step = absl::SimpleAtoi(kv.second, &meta.step);
    } else if (kv.first == "world") {
      has_world = absl::SimpleAtoi(kv.second, &meta.world_size);
    } else if (kv.first == "graph_hash") {
      meta.graph_hash = std::string(kv.second);
    } else if (kv.first == "data_step") {
      if (!absl::SimpleAtoi(kv.second, &meta.data_step)) {
        return corrupt("bad data_step");
      }
    } else if (kv.first == "data_sequences") {
      if (!absl::SimpleAtoi(kv.second, &meta.data_sequences)) {
        return corrupt("bad data_sequences");
      }
    }
  }
  if (version < 0) return corrupt("has no format version");
  if (version != kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", StepDir(step), " has format version ", version,
        "; this worker reads version ", kCheckpointFormatVersion,
        ": resume with the Tandem release that wrote it, or point "
        "checkpoint.dir elsewhere to start afresh"));
  }
  if (!has_step || !has_world || meta.step != step) {
    return corrupt("does not name this checkpoint's step and world");
  }
  return meta;
}

absl::StatusOr<RankCheckpoint> CheckpointDirectory::ReadRank(
    const CheckpointMeta& meta, int32_t rank) const {
  const std::string path =
      absl::StrCat(StepDir(meta.step), "/", RankFileName(rank));
  absl::StatusOr<std::string> file = ReadWhole(path);
  if (!file.ok()) return file.status();
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("'", path, "' is ", why));
  };
  if (file->size() < kHeaderBytes ||
      std::memcmp(file->data(), kMagic, sizeof(kMagic)) != 0) {
    return file->size() < kHeaderBytes ? bad("truncated (no header)")
                                       : bad("corrupted (not a checkpoint)");
  }
  Reader header(absl::string_view(*file).substr(8, kHeaderBytes - 8));
  const uint32_t version = header.Get<uint32_t>();
  header.Get<uint32_t>();
  const uint64_t length = header.Get<uint64_t>();
  if (version != kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' has format version ", version,
                     "; this worker reads version ", kCheckpointFormatVersion));
  }
  if (file->size() < kHeaderBytes + length + 8) {
    return bad(absl::StrCat("truncated (", file->size(), " of ",
                            kHeaderBytes + length + 8, " bytes)"));
  }
  if (file->size() > kHeaderBytes + length + 8) {
    return bad("corrupted (longer than its header says)");
  }
  const absl::string_view payload =
      absl::string_view(*file).substr(kHeaderBytes, length);
  uint64_t checksum = 0;
  std::memcpy(&checksum, file->data() + kHeaderBytes + length, 8);
  if (checksum != CheckpointChecksum(payload)) {
    return bad("corrupted (checksum mismatch)");
  }
  Reader r(payload);
  RankCheckpoint out;
  out.rank = rank;
  const absl::string_view meta_text = r.Bytes(r.Get<uint32_t>());
  const uint32_t count = r.Get<uint32_t>();
  for (uint32_t i = 0; i < count && r.ok(); ++i) {
    std::string name(r.Bytes(r.Get<uint32_t>()));
    std::string bytes(r.Bytes(r.Get<uint64_t>()));
    out.blobs.emplace_back(std::move(name), std::move(bytes));
  }
  if (!r.ok() || !r.done()) return bad("corrupted (bad structure)");
  int32_t file_rank = -1;
  for (absl::string_view line : absl::StrSplit(meta_text, '\n')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits('=', 1));
    if (kv.first == "step") (void)absl::SimpleAtoi(kv.second, &out.meta.step);
    if (kv.first == "world") {
      (void)absl::SimpleAtoi(kv.second, &out.meta.world_size);
    }
    if (kv.first == "rank") (void)absl::SimpleAtoi(kv.second, &file_rank);
    if (kv.first == "graph_hash") out.meta.graph_hash = std::string(kv.second);
    if (kv.first == "data_step") {
      (void)absl::SimpleAtoi(kv.second, &out.meta.data_step);
    }
    if (kv.first == "data_sequences") {
      (void)absl::SimpleAtoi(kv.second, &out.meta.data_sequences);
    }
  }
  if (out.meta.step != meta.step || out.meta.world_size != meta.world_size ||
      out.meta.graph_hash != meta.graph_hash ||
      out.meta.data_step != meta.data_step ||
      out.meta.data_sequences != meta.data_sequences || file_rank != rank) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' does not match its manifest (",
                     MetaText(out.meta, file_rank), ")"));
  }
  return out;
}

void CheckpointDirectory::Prune(int keep) const {
  const std::vector<int64_t> complete = ListWithManifest();
  if (complete.empty()) return;
  std::vector<int64_t> doomed;
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < complete.size();
       ++i) {
    doomed.push_back(complete[i]);
  }
  DIR* d = opendir(dir_.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    absl::string_view name = e->d_name;
    int64_t step = 0;
    if (absl::ConsumePrefix(&name, "step-") && absl::SimpleAtoi(name, &step) &&
        step < complete.front() &&
        std::find(complete.begin(), complete.end(), step) == complete.end()) {
      doomed.push_back(step);
    }
  }
  closedir(d);
  for (int64_t step : doomed) {
    const std::string dir = StepDir(step);
    // The manifest first: a half-removed checkpoint is then incomplete.
    std::remove(absl::StrCat(dir, "/", kManifest).c_str());
    if (DIR* sd = opendir(dir.c_str())) {
      std::vector<std::string> names;
      while (dirent* e = readdir(sd)) {
        if (e->d_name[0] != '.') names.push_back(e->d_name);
      }
      closedir(sd);
      for (const std::string& n : names) {
        std::remove(absl::StrCat(dir, "/", n).c_str());
      }
    }
    rmdir(dir.c_str());
  }
}

}  // namespace tandem
