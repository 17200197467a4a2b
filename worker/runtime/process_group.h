// Creating the c10d process group a worker's collectives run on: Gloo on CPU
// (always built), NCCL on CUDA when this build has it (TANDEM_WITH_NCCL).
// Standalone ranks meet over a c10d TCPStore hosted by rank 0; in agent mode
// the coordinator's key-value store is the store (CreateProcessGroupFromStore).
#ifndef TANDEM_WORKER_RUNTIME_PROCESS_GROUP_H_
#define TANDEM_WORKER_RUNTIME_PROCESS_GROUP_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "c10/core/DeviceType.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace tandem {

enum class CollectiveBackend { kGloo, kNccl };

// "gloo" or "nccl".
absl::string_view CollectiveBackendName(CollectiveBackend backend);

// The backend for tensors on `device_type`: NCCL moves CUDA memory only, Gloo
// is the CPU one.
CollectiveBackend BackendForDevice(c10::DeviceType device_type);

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
