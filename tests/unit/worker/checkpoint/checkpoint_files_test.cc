// Checkpoint files: round trip, completeness by manifest, and detection of
// truncated, corrupted and foreign-version files.
#include "worker/checkpoint/checkpoint_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

class CheckpointFilesTest : public testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tandem-ckpt-test.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    root_ = dir;
  }
  void TearDown() override {
    std::system(absl::StrCat("rm -rf '", root_, "'").c_str());
  }

  static CheckpointMeta Meta(int64_t step) {
    CheckpointMeta m;
    m.step = step;
    m.world_size = 2;
    m.graph_hash = "00aa11bb22cc33dd";
    m.data_step = step;
    return m;
  }
  static RankCheckpoint State(int64_t step, int32_t rank) {
    RankCheckpoint s;
    s.meta = Meta(step);
    s.rank = rank;
    s.blobs.emplace_back("param/w/shard", std::string(1003, char(rank + 1)));
    s.blobs.emplace_back("rng/cpu", "seed");
    return s;
  }
  // Writes both ranks and the manifest of `step`.
  void WriteComplete(const CheckpointDirectory& dir, int64_t step) {
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(dir.WriteRank(State(step, r)).ok());
    ASSERT_TRUE(dir.WriteManifest(Meta(step)).ok());
  }
  std::string RankPath(const CheckpointDirectory& dir, int64_t step, int r) {
    return absl::StrCat(dir.StepDir(step), "/rank-", r, ".ckpt");
  }
  static std::string Slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static void Spit(const std::string& path, const std::string& data) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << data;
  }

  std::string root_;
};

TEST_F(CheckpointFilesTest, WriteThenRead_RoundTripsEveryBlob) {
  CheckpointDirectory dir(absl::StrCat(root_, "/ckpt/job"));
  WriteComplete(dir, 6);
  EXPECT_EQ(dir.ListWithManifest(), std::vector<int64_t>{6});
  absl::StatusOr<CheckpointMeta> meta = dir.ReadManifest(6);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->world_size, 2);
  EXPECT_EQ(meta->graph_hash, "00aa11bb22cc33dd");
  EXPECT_EQ(meta->data_step, 6);
  absl::StatusOr<RankCheckpoint> state = dir.ReadRank(*meta, 1);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->blobs, State(6, 1).blobs);
  ASSERT_NE(state->Find("rng/cpu"), nullptr);
  EXPECT_EQ(*state->Find("rng/cpu"), "seed");
  EXPECT_EQ(state->Find("nope"), nullptr);
  // No temp files remain.
  struct stat st;
  EXPECT_NE(stat(absl::StrCat(RankPath(dir, 6, 1), ".tmp").c_str(), &st), 0);
}

// Rank files go past the page cache (O_DIRECT, through a 1 MiB staging
// buffer) unless TANDEM_CHECKPOINT_DIRECT_IO=0: both give the same bytes,
// and the direct file is cut back from its last aligned write.
TEST_F(CheckpointFilesTest, LargeBlobs_SameFileWithAndWithoutDirectIo) {
  RankCheckpoint state;
  state.meta = Meta(4);
  state.rank = 1;
  std::string big(3 * (size_t{1} << 20) + 12345, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131);
  state.blobs.emplace_back("param/a/shard", big);
  state.blobs.emplace_back("param/b/shard", std::string(size_t{1} << 20, 'b'));
  state.blobs.emplace_back("rng/cpu", "7 bytes");
  std::vector<std::string> files;
  for (const char* direct : {"1", "0"}) {
    setenv("TANDEM_CHECKPOINT_DIRECT_IO", direct, 1);
    CheckpointDirectory dir(absl::StrCat(root_, "/direct-", direct));
    absl::Status written = dir.WriteRank(state);
    unsetenv("TANDEM_CHECKPOINT_DIRECT_IO");
    ASSERT_TRUE(written.ok()) << written;
    absl::StatusOr<RankCheckpoint> back = dir.ReadRank(Meta(4), 1);
    ASSERT_TRUE(back.ok()) << "direct " << direct << ": " << back.status();
    EXPECT_EQ(back->blobs, state.blobs) << "direct " << direct;
    files.push_back(Slurp(RankPath(dir, 4, 1)));
  }
  EXPECT_EQ(files[0].size(), files[1].size());
  EXPECT_NE(files[0].size() % 4096, 0u);
  EXPECT_TRUE(files[0] == files[1]);
}

TEST_F(CheckpointFilesTest, WithoutManifest_IsNotListed) {
  CheckpointDirectory dir(root_);
  WriteComplete(dir, 2);
  ASSERT_TRUE(dir.WriteRank(State(4, 0)).ok());  // killed before rank 1
  EXPECT_EQ(dir.ListWithManifest(), std::vector<int64_t>{2});
}

TEST_F(CheckpointFilesTest, TruncatedRankFile_IsDataLoss) {
  CheckpointDirectory dir(root_);
  WriteComplete(dir, 2);
  const std::string path = RankPath(dir, 2, 0);
  const std::string data = Slurp(path);
  Spit(path, data.substr(0, data.size() - 100));
  absl::StatusOr<RankCheckpoint> state = dir.ReadRank(Meta(2), 0);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(state.status().message().find("truncated"), std::string::npos)
      << state.status();
  Spit(path, data.substr(0, 10));
  EXPECT_EQ(dir.ReadRank(Meta(2), 0).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(CheckpointFilesTest, FlippedByte_IsDataLossByChecksum) {
  CheckpointDirectory dir(root_);
  WriteComplete(dir, 2);
  const std::string path = RankPath(dir, 2, 1);
  std::string data = Slurp(path);
  data[data.size() / 2] ^= 0x10;
  Spit(path, data);
  absl::StatusOr<RankCheckpoint> state = dir.ReadRank(Meta(2), 1);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(state.status().message().find("corrupted"), std::string::npos)
      << state.status();
  // The other rank's file is fine.
  EXPECT_TRUE(dir.ReadRank(Meta(2), 0).ok());
}

TEST_F(CheckpointFilesTest, CorruptedManifest_IsDataLoss) {
  CheckpointDirectory dir(root_);
  WriteComplete(dir, 2);
  const std::string path = absl::StrCat(dir.StepDir(2), "/MANIFEST");
  std::string text = Slurp(path);
  text.replace(text.find("world 2"), 7, "world 3");
  Spit(path, text);
  EXPECT_EQ(dir.ReadManifest(2).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(CheckpointFilesTest, OtherFormatVersion_IsFailedPrecondition) {
  CheckpointDirectory dir(root_);
  WriteComplete(dir, 2);
  const std::string path = RankPath(dir, 2, 0);
  std::string data = Slurp(path);
  data[8] = 7;  // the version field follows the magic
  Spit(path, data);
  absl::StatusOr<RankCheckpoint> state = dir.ReadRank(Meta(2), 0);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(state.status().message().find("format version 7"),
            std::string::npos)
      << state.status();
}

TEST_F(CheckpointFilesTest, RankFileOfAnotherCheckpoint_IsRefused) {
  CheckpointDirectory dir(root_);
  WriteComplete(dir, 2);
  CheckpointMeta other = Meta(2);
  other.graph_hash = "ffffffffffffffff";
  EXPECT_EQ(dir.ReadRank(other, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CheckpointFilesTest, Prune_KeepsNewestCompleteAndNewerPartial) {
  CheckpointDirectory dir(root_);
  for (int64_t step : {2, 4, 6, 8}) WriteComplete(dir, step);
  ASSERT_TRUE(dir.WriteRank(State(3, 0)).ok());   // stale partial
  ASSERT_TRUE(dir.WriteRank(State(10, 0)).ok());  // being written
  dir.Prune(2);
  EXPECT_EQ(dir.ListWithManifest(), std::vector<int64_t>({8, 6}));
  struct stat st;
  EXPECT_NE(stat(dir.StepDir(3).c_str(), &st), 0);
  EXPECT_NE(stat(dir.StepDir(2).c_str(), &st), 0);
  EXPECT_EQ(stat(dir.StepDir(10).c_str(), &st), 0);
}

// Blobs larger than the writer's chunks and writeback interval, of odd
// sizes (the payload's words straddle the pieces): streamed straight from
// the blobs, read back whole and checked by the one-shot checksum.
TEST_F(CheckpointFilesTest, LargeOddBlobs_StreamedAndReadBack) {
  CheckpointDirectory dir(absl::StrCat(root_, "/ckpt/big"));
  RankCheckpoint state;
  state.meta.step = 3;
  state.meta.world_size = 1;
  state.meta.graph_hash = "ff";
  for (size_t size :
       {size_t{3}, (size_t{9} << 20) + 5, size_t{0}, (size_t{1} << 20) + 1}) {
    std::string bytes(size, '\0');
    for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 131);
    state.blobs.emplace_back(absl::StrCat("blob/", size), std::move(bytes));
  }
  ASSERT_TRUE(dir.WriteRank(state).ok());
  ASSERT_TRUE(dir.WriteManifest(state.meta).ok());
  absl::StatusOr<CheckpointMeta> meta = dir.ReadManifest(3);
  ASSERT_TRUE(meta.ok()) << meta.status();
  absl::StatusOr<RankCheckpoint> back = dir.ReadRank(*meta, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->blobs, state.blobs);
}

// A paced write spreads its bytes over the time it is given (a lower
// bound: it sleeps ahead of the pace); once hurried, it sleeps no more.
TEST_F(CheckpointFilesTest, PacedWrite_SpreadsUnlessHurried) {
  CheckpointDirectory dir(absl::StrCat(root_, "/ckpt/paced"));
  RankCheckpoint state;
  state.meta.step = 1;
  state.meta.world_size = 1;
  state.blobs.emplace_back("blob", std::string(size_t{4} << 20, 'x'));
  WritePace pace;
  pace.spread_s = 0.4;
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(dir.WriteRank(state, pace).ok());
  // Its last bytes are due at the end of the spread.
  EXPECT_GE(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count(),
      0.3);

  std::atomic<bool> hurry{true};
  pace.spread_s = 60;
  pace.hurry = &hurry;
  state.meta.step = 2;
  start = std::chrono::steady_clock::now();
  ASSERT_TRUE(dir.WriteRank(state, pace).ok());
  EXPECT_LT(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count(),
      30);
  absl::StatusOr<CheckpointMeta> meta =
      (dir.WriteManifest(state.meta).ok() ? dir.ReadManifest(2)
                                          : absl::InternalError("manifest"));
  ASSERT_TRUE(meta.ok()) << meta.status();
  absl::StatusOr<RankCheckpoint> back = dir.ReadRank(*meta, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->blobs, state.blobs);
}

TEST(CheckpointChecksumTest, InPieces_EqualsWhole) {
  std::string bytes(1000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i);
  for (size_t n : {size_t{0}, size_t{7}, size_t{8}, size_t{13}, size_t{1000}}) {
    const absl::string_view all = absl::string_view(bytes).substr(0, n);
    for (size_t cut : {size_t{1}, size_t{3}, size_t{8}, size_t{11}}) {
      CheckpointChecksummer sum(n);
      for (size_t at = 0; at < n; at += cut) sum.Add(all.substr(at, cut));
      EXPECT_EQ(sum.Finish(), CheckpointChecksum(all)) << n << " " << cut;
    }
  }
}

TEST(CheckpointChecksumTest, DependsOnEveryByteAndLength) {
  const std::string a(37, 'x');
  std::string b = a;
  b[36] = 'y';
  EXPECT_NE(CheckpointChecksum(a), CheckpointChecksum(b));
  EXPECT_NE(CheckpointChecksum(a), CheckpointChecksum(a + std::string(1, 0)));
  EXPECT_EQ(CheckpointChecksum(a), CheckpointChecksum(std::string(37, 'x')));
}

}  // namespace
}  // namespace tandem
