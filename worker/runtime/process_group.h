// Creating the c10d process group a worker's collectives run on: Gloo on CPU
// (always built), NCCL when this build has CUDA (TANDEM_WITH_NCCL). Rendezvous
// in this issue is a c10d TCPStore hosted by rank 0; the coordinator's
// key-value store replaces it with the agent.
#ifndef TANDEM_WORKER_RUNTIME_PROCESS_GROUP_H_
#define TANDEM_WORKER_RUNTIME_PROCESS_GROUP_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace tandem {

enum class CollectiveBackend { kGloo, kNccl };

struct RendezvousOptions {
  // The TCPStore: rank 0 listens on host:port, the others connect to it.
  std::string host = "127.0.0.1";
  int port = 29500;
  int rank = 0;
  int world_size = 1;
  CollectiveBackend backend = CollectiveBackend::kGloo;
  // Bounds rendezvous and every collective.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

// Parses "HOST:PORT" into `options` (host and port only).
absl::Status ParseRendezvousAddress(const std::string& address,
                                    RendezvousOptions* options);

// Connects to (rank 0: hosts) the TCPStore and creates the process group.
// Errors: InvalidArgument for a bad rank/world/backend, Unavailable when the
// store or a peer cannot be reached within the timeout.
absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> CreateProcessGroup(
    const RendezvousOptions& options);

// The same over an existing store (tests share one TCPStore server and give
// each group its own key prefix). `local_host` is the address Gloo binds.
absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>>
CreateProcessGroupFromStore(c10::intrusive_ptr<c10d::Store> store, int rank,
                            int world_size, CollectiveBackend backend,
                            std::chrono::milliseconds timeout,
                            const std::string& local_host = "127.0.0.1");

// Whether this build can create `backend`.
bool BackendAvailable(CollectiveBackend backend);

}  // namespace tandem

#endif  // TANDEM_WORKER_RUNTIME_PROCESS_GROUP_H_
