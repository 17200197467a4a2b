#include "common/flags/launcher_environment.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// `name`'s value as an integer >= `min`; nullopt when unset.
absl::StatusOr<std::optional<Sourced<int>>> IntVariable(
    const Environment& env, absl::string_view name, int min,
    absl::string_view meaning, absl::string_view flag) {
  const std::optional<std::string> text = env.Get(name);
  if (!text.has_value()) return std::nullopt;
  int value = 0;
  if (!absl::SimpleAtoi(*text, &value) || value < min) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", *text, "' is not an integer >= ", min,
                     " (the launcher sets ", name, " to ", meaning,
                     "); fix or unset it, or pass ", flag));
  }
  return Sourced<int>{value, std::string(name)};
}

}  // namespace

Environment Environment::Process() { return Environment(); }

Environment::Environment(absl::flat_hash_map<std::string, std::string> fixed)
    : fixed_(std::move(fixed)) {}

std::optional<std::string> Environment::Get(absl::string_view name) const {
  if (fixed_.has_value()) {
    auto it = fixed_->find(name);
    if (it == fixed_->end() || it->second.empty()) return std::nullopt;
    return it->second;
  }
  const char* value = std::getenv(std::string(name).c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

absl::StatusOr<std::optional<Sourced<int>>> RankFromEnvironment(
    const Environment& env) {
  if (env.Get("RANK").has_value()) {
    return IntVariable(env, "RANK", 0, "this process's rank", "--rank");
  }
  return IntVariable(env, "SLURM_PROCID", 0, "this task's rank", "--rank");
}

absl::StatusOr<std::optional<Sourced<int>>> WorldSizeFromEnvironment(
    const Environment& env) {
  if (env.Get("WORLD_SIZE").has_value()) {
    return IntVariable(env, "WORLD_SIZE", 1, "the number of processes",
                       "--world");
  }
  if (!env.Get("SLURM_PROCID").has_value()) return std::nullopt;
  return IntVariable(env, "SLURM_NTASKS", 1, "the number of tasks", "--world");
}

absl::StatusOr<std::optional<Sourced<std::string>>> RendezvousFromEnvironment(
    const Environment& env) {
  const std::optional<std::string> addr = env.Get("MASTER_ADDR");
  const std::optional<std::string> port_text = env.Get("MASTER_PORT");
  if (!addr.has_value() && !port_text.has_value()) return std::nullopt;
  if (!addr.has_value() || !port_text.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        addr.has_value() ? "MASTER_ADDR" : "MASTER_PORT", " is set but ",
        addr.has_value() ? "MASTER_PORT" : "MASTER_ADDR",
        " is not; set both (rank 0 hosts the rendezvous store at "
        "MASTER_ADDR:MASTER_PORT) or pass --rendezvous HOST:PORT"));
  }
  int port = 0;
  if (!absl::SimpleAtoi(*port_text, &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MASTER_PORT='", *port_text,
        "' is not a port in 1..65535; fix it or pass --rendezvous HOST:PORT"));
  }
  if (env.Get("TORCHELASTIC_USE_AGENT_STORE") == "True") {
    return absl::FailedPreconditionError(absl::StrCat(
        "torchrun's static rendezvous serves its own store on MASTER_PORT ",
        port,
        ", where rank 0 would host the rendezvous: run torchrun with "
        "--rdzv-backend=c10d (or --standalone), or pass --rendezvous "
        "HOST:PORT with a free port"));
  }
  return Sourced<std::string>{absl::StrCat(*addr, ":", port),
                              "MASTER_ADDR:MASTER_PORT"};
}

absl::StatusOr<std::string> ReadJoinSecret(const std::string& file,
                                           const Environment& env) {
  std::string secret;
  std::string source;
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("--join-secret-file: cannot read ", file,
                       ": it does not exist or is not readable"));
    }
    std::ostringstream text;
    text << in.rdbuf();
    secret = std::string(absl::StripAsciiWhitespace(text.str()));
    source = absl::StrCat("--join-secret-file ", file);
  } else if (std::optional<std::string> v = env.Get("TANDEM_JOIN_SECRET")) {
    secret = std::string(absl::StripAsciiWhitespace(*v));
    source = "$TANDEM_JOIN_SECRET";
  } else {
    return std::string();
  }
  const bool printable = std::all_of(
      secret.begin(), secret.end(), [](char c) { return c > ' ' && c < 0x7f; });
  if (secret.empty() || secret.size() > 512 || !printable) {
    return absl::InvalidArgumentError(absl::StrCat(
        source,
        ": a join secret is 1..512 printable characters without spaces, as "
        "`tandem join-secret JOB` prints it"));
  }
  return secret;
}

}  // namespace tandem
