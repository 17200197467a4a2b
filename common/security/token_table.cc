#include "common/security/token_table.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem {
namespace {

constexpr size_t kMinTokenBytes = 16;
constexpr size_t kMaxTokenBytes = 512;
constexpr size_t kMaxUserBytes = 128;
constexpr size_t kMaxFileBytes = 4 << 20;

bool ValidToken(absl::string_view t) {
  return t.size() >= kMinTokenBytes && t.size() <= kMaxTokenBytes &&
         std::all_of(t.begin(), t.end(),
                     [](char c) { return c > ' ' && c < 0x7f; });
}

bool ValidUser(absl::string_view u) {
  return !u.empty() && u.size() <= kMaxUserBytes &&
         std::all_of(u.begin(), u.end(), [](char c) {
           return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '@' ||
                  c == '-';
         });
}

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

std::optional<absl::string_view> BearerToken(absl::string_view authorization) {
  absl::string_view v = absl::StripAsciiWhitespace(authorization);
  constexpr absl::string_view kScheme = "bearer ";
  if (v.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(v.substr(0, kScheme.size()), kScheme)) {
    return std::nullopt;
  }
  absl::string_view token =
      absl::StripAsciiWhitespace(v.substr(kScheme.size()));
  if (token.empty()) return std::nullopt;
  return token;
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text,
                                             absl::string_view origin) {
  TokenTable table;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    const std::string where = absl::StrCat(origin, ":", line_no, ": ");
    if (fields.size() < 2 || fields.size() > 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "expected 'TOKEN USER' or 'TOKEN USER admin', got ",
          fields.size(), " field", fields.size() == 1 ? "" : "s"));
    }
    if (!ValidToken(fields[0])) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "a token must be ", kMinTokenBytes, "..", kMaxTokenBytes,
          " printable characters without spaces (this one has ",
          fields[0].size(), "); e.g. `openssl rand -hex 32`"));
    }
    if (!ValidUser(fields[1])) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "user '", fields[1].substr(0, 64),
                       "' must be 1..128 characters of A-Z a-z 0-9 . _ @ -"));
    }
    if (fields.size() == 3 && fields[2] != "admin") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "the third field may only be 'admin', got '",
                       fields[2].substr(0, 64), "'"));
    }
    for (const Entry& e : table.entries_) {
      if (ConstantTimeEquals(e.token, fields[0])) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "this token is already given to user '",
                         e.principal.user, "'; each token must be unique"));
      }
    }
    table.entries_.push_back(
        {std::string(fields[0]),
         Principal{std::string(fields[1]), fields.size() == 3}});
  }
  if (table.entries_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": no tokens; add lines 'TOKEN USER [admin]'"));
  }
  return table;
}

absl::StatusOr<TokenTable> TokenTable::ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the token file ", path,
                     ": it does not exist or is not readable"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().size() > kMaxFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the token file ", path, " is over 4 MiB"));
  }
  return Parse(text.str(), path);
}

absl::StatusOr<std::unique_ptr<TokenFile>> TokenFile::Open(std::string path) {
  std::unique_ptr<TokenFile> file(new TokenFile(std::move(path)));
  if (absl::Status s = file->Reload(); !s.ok()) return s;
  return file;
}

absl::Status TokenFile::Reload() {
  absl::StatusOr<TokenTable> table = TokenTable::ReadFile(path_);
  if (!table.ok()) return table.status();
  auto fresh = std::make_shared<const TokenTable>(*std::move(table));
  std::lock_guard<std::mutex> lock(mu_);
  table_ = std::move(fresh);
  return absl::OkStatus();
}

std::optional<Principal> TokenFile::Find(absl::string_view token) const {
  std::shared_ptr<const TokenTable> table;
  {
    std::lock_guard<std::mutex> lock(mu_);
    table = table_;
  }
  return table == nullptr ? std::nullopt : table->Find(token);
}

size_t TokenFile::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_ == nullptr ? 0 : table_->size();
}

std::optional<Principal> TokenTable::Find(absl::string_view token) const {
  std::optional<Principal> found;
  for (const Entry& e : entries_) {
    // No early exit: every entry costs the same.
    if (ConstantTimeEquals(e.token, token) && !found) found = e.principal;
  }
  return found;
}

}  // namespace tandem
