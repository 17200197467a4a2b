#include "common/archive/zip_reader.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

constexpr uint32_t kEndOfCentralDirectory = 0x06054b50;
constexpr uint32_t kZip64EndOfCentralDirectory = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint32_t kCentralFileHeader = 0x02014b50;
constexpr uint32_t kLocalFileHeader = 0x04034b50;
constexpr size_t kEocdSize = 22;
constexpr size_t kZip64LocatorSize = 20;
constexpr size_t kZip64EocdSize = 56;
constexpr size_t kCentralHeaderSize = 46;
constexpr size_t kLocalHeaderSize = 30;

uint16_t U16(const char* p) {
  const auto* b = reinterpret_cast<const uint8_t*>(p);
  return static_cast<uint16_t>(b[0] | (b[1] << 8));
}
uint32_t U32(const char* p) {
  const auto* b = reinterpret_cast<const uint8_t*>(p);
  return uint32_t{b[0]} | (uint32_t{b[1]} << 8) | (uint32_t{b[2]} << 16) |
         (uint32_t{b[3]} << 24);
}
uint64_t U64(const char* p) {
  return uint64_t{U32(p)} | (uint64_t{U32(p + 4)} << 32);
}

// Reads `size` bytes at `offset`, failing unless all of them are there.
absl::StatusOr<std::string> ReadAt(const std::string& path, uint64_t offset,
                                   uint64_t size, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  }
  std::string out(size, '\0');
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(out.data(), static_cast<std::streamsize>(size));
  if (!in || static_cast<uint64_t>(in.gcount()) != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' is truncated: ", what, " (", size, " bytes at offset ",
        offset, ") is past the end of the file; export the archive again"));
  }
  return out;
}

absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("'", path, "' is not a readable zip archive: ", what,
                   "; export the model again (tandem export)"));
}

}  // namespace

uint32_t Crc32(absl::string_view data, uint32_t crc) {
  static const auto* table = [] {
    auto* t = new uint32_t[256];
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (unsigned char ch : data) crc = table[(crc ^ ch) & 0xff] ^ (crc >> 8);
  return ~crc;
}

absl::StatusOr<ZipReader> ZipReader::Open(const std::string& path) {
  ZipReader zip;
  zip.path_ = path;
  {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) {
      return absl::NotFoundError(
          absl::StrCat("model archive '", path,
                       "' does not exist or cannot be read; check the path"));
    }
    zip.file_size_ = static_cast<uint64_t>(in.tellg());
  }
  if (zip.file_size_ < kEocdSize) {
    return Corrupt(path, absl::StrCat("it holds only ", zip.file_size_,
                                      " bytes (truncated?)"));
  }
  // The end-of-central-directory record ends the file, followed by a comment
  // of at most 65535 bytes.
  const uint64_t tail_size =
      std::min<uint64_t>(zip.file_size_, kEocdSize + 65535 + kZip64LocatorSize);
  ASSIGN_OR_RETURN(std::string tail,
                   ReadAt(path, zip.file_size_ - tail_size, tail_size,
                          "the end-of-central-directory record"));
  int64_t eocd = -1;
  for (int64_t i = static_cast<int64_t>(tail.size() - kEocdSize); i >= 0; --i) {
    if (U32(&tail[i]) == kEndOfCentralDirectory &&
        i + kEocdSize + U16(&tail[i + 20]) == tail.size()) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) {
    return Corrupt(path,
                   "no end-of-central-directory record (truncated, or not a "
                   "zip file)");
  }
  const char* e = &tail[eocd];
  if (U16(e + 4) != 0 || U16(e + 6) != 0) {
    return Corrupt(path, "it is split over several disks");
  }
  uint64_t count = U16(e + 10);
  uint64_t cd_size = U32(e + 12);
  uint64_t cd_offset = U32(e + 16);
  if (count == 0xffff || cd_size == 0xffffffffu || cd_offset == 0xffffffffu) {
    // ZIP64: the locator sits right before the record.
    if (eocd < static_cast<int64_t>(kZip64LocatorSize) ||
        U32(&tail[eocd - kZip64LocatorSize]) != kZip64Locator) {
      return Corrupt(path, "a ZIP64 archive without its ZIP64 locator");
    }
    const uint64_t z64_offset = U64(&tail[eocd - kZip64LocatorSize + 8]);
    ASSIGN_OR_RETURN(std::string z64, ReadAt(path, z64_offset, kZip64EocdSize,
                                             "the ZIP64 end record"));
    if (U32(z64.data()) != kZip64EndOfCentralDirectory) {
      return Corrupt(path, "a bad ZIP64 end-of-central-directory record");
    }
    count = U64(&z64[32]);
    cd_size = U64(&z64[40]);
    cd_offset = U64(&z64[48]);
  }
  if (cd_offset + cd_size > zip.file_size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' is truncated: its central directory ends at byte ",
        cd_offset + cd_size, " of a ", zip.file_size_,
        "-byte file; export the archive again"));
  }
  ASSIGN_OR_RETURN(std::string cd,
                   ReadAt(path, cd_offset, cd_size, "the central directory"));
  size_t at = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (at + kCentralHeaderSize > cd.size() ||
        U32(&cd[at]) != kCentralFileHeader) {
      return Corrupt(
          path, absl::StrCat("central directory entry ", i, " is malformed"));
    }
    const char* h = &cd[at];
    const uint16_t flags = U16(h + 8);
    const uint16_t method = U16(h + 10);
    ZipEntry entry;
    entry.crc32 = U32(h + 16);
    uint64_t compressed = U32(h + 20);
    entry.size = U32(h + 24);
    const size_t name_len = U16(h + 28);
    const size_t extra_len = U16(h + 30);
    const size_t comment_len = U16(h + 32);
    uint64_t local_offset = U32(h + 42);
    if (at + kCentralHeaderSize + name_len + extra_len + comment_len >
        cd.size()) {
      return Corrupt(path, absl::StrCat("central directory entry ", i,
                                        " runs past the directory"));
    }
    entry.name.assign(h + kCentralHeaderSize, name_len);
    // ZIP64 extended information: the 0xffffffff fields, in this order.
    const char* extra = h + kCentralHeaderSize + name_len;
    for (size_t x = 0; x + 4 <= extra_len;) {
      const uint16_t id = U16(extra + x);
      const uint16_t len = U16(extra + x + 2);
      if (x + 4 + len > extra_len) break;
      if (id == 0x0001) {
        const char* f = extra + x + 4;
        size_t used = 0;
        auto take = [&](uint64_t& field) {
          if (field != 0xffffffffu) return;
          if (used + 8 <= len) {
            field = U64(f + used);
            used += 8;
          }
        };
        take(entry.size);
        take(compressed);
        take(local_offset);
      }
      x += 4 + len;
    }
    if (flags & 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "': entry '", entry.name,
                       "' is encrypted; re-export: entries must be stored "
                       "(uncompressed, unencrypted)"));
    }
    if (method != 0 || compressed != entry.size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", path, "': entry '", entry.name, "' is compressed (method ",
          method, "); re-export: entries must be stored (zip method 0)"));
    }
    // The data starts after the local header, whose name and extra field
    // lengths may differ from the central directory's.
    ASSIGN_OR_RETURN(
        std::string local,
        ReadAt(path, local_offset, kLocalHeaderSize,
               absl::StrCat("the header of entry '", entry.name, "'")));
    if (U32(local.data()) != kLocalFileHeader) {
      return Corrupt(
          path, absl::StrCat("entry '", entry.name,
                             "' has no local header at offset ", local_offset));
    }
    entry.data_offset =
        local_offset + kLocalHeaderSize + U16(&local[26]) + U16(&local[28]);
    if (entry.data_offset + entry.size > zip.file_size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", path, "' is truncated: entry '", entry.name, "' ends at byte ",
          entry.data_offset + entry.size, " of a ", zip.file_size_,
          "-byte file; export the archive again"));
    }
    zip.entries_.push_back(std::move(entry));
    at += kCentralHeaderSize + name_len + extra_len + comment_len;
  }
  return zip;
}

const ZipEntry* ZipReader::Find(absl::string_view name) const {
  for (const ZipEntry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

absl::StatusOr<std::string> ZipReader::Read(absl::string_view name) const {
  const ZipEntry* entry = Find(name);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat("'", path_, "' has no entry '",
                                            name, "'; export the model again"));
  }
  ASSIGN_OR_RETURN(std::string data,
                   ReadAt(path_, entry->data_offset, entry->size,
                          absl::StrCat("entry '", name, "'")));
  if (Crc32(data) != entry->crc32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path_, "': entry '", name,
        "' is corrupted (CRC-32 mismatch); export the model again"));
  }
  return data;
}

}  // namespace tandem
