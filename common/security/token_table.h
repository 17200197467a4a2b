// Who may call: bearer tokens mapped to users, read from a token file
// (`--auth-tokens FILE`; common/README.md, "Security"). One entry per line:
//
//   TOKEN USER [admin]
//
// '#' starts a comment; blank lines are skipped. A token is 16..512
// printable characters without spaces; a user is 1..128 of [A-Za-z0-9._@-].
// A token may appear once. Users may have several tokens (rotation: add the
// new one, SIGHUP, retire the old one).
#ifndef TANDEM_COMMON_SECURITY_TOKEN_TABLE_H_
#define TANDEM_COMMON_SECURITY_TOKEN_TABLE_H_

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// An authenticated caller.
struct Principal {
  std::string user;
  bool admin = false;
};

class TokenTable {
 public:
  // Errors name `origin` (the file) and the line, and say what is expected.
  static absl::StatusOr<TokenTable> Parse(absl::string_view text,
                                          absl::string_view origin);
  // Reads and parses `path`; NotFound / PermissionDenied / InvalidArgument
  // name the file.
  static absl::StatusOr<TokenTable> ReadFile(const std::string& path);

  // The token's principal; every entry is compared in constant time, so
  // the answer's timing does not tell how much of a token matched.
  std::optional<Principal> Find(absl::string_view token) const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string token;
    Principal principal;
  };
  std::vector<Entry> entries_;
};

// A token file that can be re-read while the process serves (SIGHUP):
// thread-safe; a reload that fails keeps the table it had.
class TokenFile {
 public:
  static absl::StatusOr<std::unique_ptr<TokenFile>> Open(std::string path);

  // Re-reads the file. On error the previous table stays in force and the
  // error says why the new one was refused.
  absl::Status Reload();
  std::optional<Principal> Find(absl::string_view token) const;
  const std::string& path() const { return path_; }
  size_t size() const;

 private:
  explicit TokenFile(std::string path) : path_(std::move(path)) {}

  const std::string path_;
  mutable std::mutex mu_;
  std::shared_ptr<const TokenTable> table_;
};

// The token in an HTTP/gRPC `authorization` value "Bearer TOKEN" (scheme
// case-insensitive); nullopt for any other form.
std::optional<absl::string_view> BearerToken(absl::string_view authorization);

// Equal contents, in time that depends only on the lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace tandem

#endif  // TANDEM_COMMON_SECURITY_TOKEN_TABLE_H_
