// What a launcher tells the process it starts, as defaults for the flags
// that say the same: torchrun's RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT, and a Slurm task's SLURM_PROCID and SLURM_NTASKS. A flag on
// the command line always wins; each function here is called only for a
// flag that was not given. The local rank (LOCAL_RANK, SLURM_LOCALID) is
// the worker's device choice: worker/trainer/runtime_options.h.
//
//   rank        RANK, else SLURM_PROCID
//   world size  WORLD_SIZE, else SLURM_NTASKS inside a Slurm task (where
//               SLURM_PROCID is set: an salloc or sbatch shell has
//               SLURM_NTASKS without being one of the tasks)
//   rendezvous  MASTER_ADDR:MASTER_PORT (both set), unless torchrun's agent
//               holds that port for its own store
//
// A variable that is set to an empty string counts as unset.
#ifndef TANDEM_COMMON_FLAGS_LAUNCHER_ENVIRONMENT_H_
#define TANDEM_COMMON_FLAGS_LAUNCHER_ENVIRONMENT_H_

#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// Environment variables: the process's, or a fixed set for tests.
class Environment {
 public:
  // The process's (std::getenv).
  static Environment Process();
  explicit Environment(absl::flat_hash_map<std::string, std::string> fixed);

  // The variable's value; nullopt when it is unset or empty.
  std::optional<std::string> Get(absl::string_view name) const;

 private:
  Environment() = default;
  std::optional<absl::flat_hash_map<std::string, std::string>> fixed_;
};

// A value and where it came from, for messages: "RANK", "SLURM_PROCID",
// "MASTER_ADDR:MASTER_PORT" (or the flag, "--rank", when the caller fills
// it from one).
template <typename T>
struct Sourced {
  T value;
  std::string source;
};

// The rank: RANK, else SLURM_PROCID; nullopt when neither is set.
// InvalidArgument naming the variable when it is not an integer >= 0.
absl::StatusOr<std::optional<Sourced<int>>> RankFromEnvironment(
    const Environment& env);

// The world size: WORLD_SIZE, else SLURM_NTASKS in a Slurm task; nullopt
// when neither applies. InvalidArgument naming the variable when it is not
// an integer >= 1.
absl::StatusOr<std::optional<Sourced<int>>> WorldSizeFromEnvironment(
    const Environment& env);

// The rendezvous HOST:PORT: MASTER_ADDR:MASTER_PORT; nullopt when neither
// is set. InvalidArgument when only one is set, when MASTER_PORT is not a
// port in 1..65535, or when torchrun's static rendezvous set them
// (TORCHELASTIC_USE_AGENT_STORE=True: its agent already serves a store on
// MASTER_PORT, where rank 0 would host its own); each says what to do.
absl::StatusOr<std::optional<Sourced<std::string>>> RendezvousFromEnvironment(
    const Environment& env);

// The job's join secret for an authenticating coordinator: the contents of
// `file` (--join-secret-file; surrounding whitespace dropped) when given,
// else $TANDEM_JOIN_SECRET, else "" (none). InvalidArgument naming the
// file or variable when it is unreadable or not 1..512 printable
// characters.
absl::StatusOr<std::string> ReadJoinSecret(const std::string& file,
                                           const Environment& env);

}  // namespace tandem

#endif  // TANDEM_COMMON_FLAGS_LAUNCHER_ENVIRONMENT_H_
