#include "worker/runtime/process_group.h"

#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"
#include "torch/version.h"
#include "worker/runtime/torch_status.h"

#if TORCH_VERSION_MAJOR >= 2
#define TANDEM_TORCH_2 1
#else
#define TANDEM_TORCH_2 0
#endif

#ifdef TANDEM_WITH_NCCL
#include "torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"
#endif

namespace tandem {
namespace {

std::shared_ptr<::gloo::transport::Device> GlooDevice(
    const std::string& local_host) {
  // An explicit interface wins (multi-host runs); loopback runs bind to the
  // rendezvous address itself.
  for (const char* var : {"TANDEM_GLOO_IFNAME", "GLOO_SOCKET_IFNAME"}) {
    const char* ifname = std::getenv(var);
    if (ifname != nullptr && *ifname != '\0') {
      return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    }
  }
  if (local_host == "127.0.0.1" || local_host == "localhost" ||
      local_host == "::1") {
    return c10d::ProcessGroupGloo::createDeviceForHostname(local_host);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// libtorch 2.x keeps a process-wide "flight recorder" of collectives for
// post-mortem dumps, which Tandem never reads (the profiler and the events
// say what ran). With libtorch 2.11 its Gloo recording corrupted the
// recorder's map when several process groups in one process recorded at
// once (the loopback tests run each rank as a thread), and the test binary
// crashed in 2 of 4 runs on a CUDA machine. The recorder reads its size once,
// when the first group is created: 0 turns it off. A value the user set
// (TORCH_FR_BUFFER_SIZE or its older name) is kept. libtorch 1.x has none.
// Runs once per process (a static's initializer: threads creating groups at
// the same time wait for it), so setenv never races a getenv of ours.
void DisableFlightRecorder() {
  static const bool done = [] {
    if (std::getenv("TORCH_NCCL_TRACE_BUFFER_SIZE") == nullptr) {
      setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0);
    }
    return true;
  }();
  (void)done;
}

// libtorch 1.x: ProcessGroupGloo and ProcessGroupNCCL are process groups.
// libtorch 2.x: they are c10d::Backends, and a ProcessGroup dispatches each
// collective to the backend registered for its tensors' device type, as
// torch.distributed.init_process_group builds it.
#if TANDEM_TORCH_2
template <typename BackendImpl>
c10::intrusive_ptr<c10d::ProcessGroup> WrapBackend(
    c10::intrusive_ptr<BackendImpl> impl,
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    CollectiveBackend backend, std::chrono::milliseconds timeout) {
  const bool nccl = backend == CollectiveBackend::kNccl;
  const auto type = nccl ? c10d::ProcessGroup::BackendType::NCCL
                         : c10d::ProcessGroup::BackendType::GLOO;
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 6
  // 2.6 dropped ProcessGroup::Options: the default backend is set instead.
  (void)timeout;
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world_size);
  group->setDefaultBackend(type);
#else
  auto group = c10::make_intrusive<c10d::ProcessGroup>(
      store, rank, world_size,
      c10::make_intrusive<c10d::ProcessGroup::Options>(
          std::string(CollectiveBackendName(backend)), timeout));
#endif
  const c10::intrusive_ptr<c10d::Backend> as_backend = std::move(impl);
  group->setBackend(nccl ? c10::DeviceType::CUDA : c10::DeviceType::CPU, type,
                    as_backend);
  return group;
}
#else
template <typename BackendImpl>
c10::intrusive_ptr<c10d::ProcessGroup> WrapBackend(
    c10::intrusive_ptr<BackendImpl> impl,
    const c10::intrusive_ptr<c10d::Store>& /*store*/, int /*rank*/,
    int /*world_size*/, CollectiveBackend /*backend*/,
    std::chrono::milliseconds /*timeout*/) {
  return c10::intrusive_ptr<c10d::ProcessGroup>(std::move(impl));
}
#endif

}  // namespace

absl::string_view CollectiveBackendName(CollectiveBackend backend) {
  switch (backend) {
    case CollectiveBackend::kGloo:
      return "gloo";
    case CollectiveBackend::kNccl:
      return "nccl";
  }
  return "unknown";
}

CollectiveBackend BackendForDevice(c10::DeviceType device_type) {
  return device_type == c10::DeviceType::CUDA ? CollectiveBackend::kNccl
                                              : CollectiveBackend::kGloo;
}

bool BackendAvailable(CollectiveBackend backend) {
  switch (backend) {
    case CollectiveBackend::kGloo:
      return true;
    case CollectiveBackend::kNccl:
#ifdef TANDEM_WITH_NCCL
      return true;
#else
      return false;
#endif
  }
  return false;
}

absl::Status ParseRendezvousAddress(const std::string& address,
                                    RendezvousOptions* options) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port <= 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rendezvous: expected HOST:PORT with a port in 1..65535, got '",
        address, "' (e.g. 127.0.0.1:29500)"));
  }
  options->host = address.substr(0, colon);
  options->port = port;
  return absl::OkStatus();
}

absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>>
CreateProcessGroupFromStore(c10::intrusive_ptr<c10d::Store> store, int rank,
                            int world_size, CollectiveBackend backend,
                            std::chrono::milliseconds timeout,
                            const std::string& local_host) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside world size ", world_size,
                     "; pass --rank in [0, --world)"));
  }
  if (!BackendAvailable(backend)) {
    return absl::InvalidArgumentError(
        "the NCCL backend needs a build against a CUDA libtorch with "
        "-DTANDEM_WITH_NCCL=ON; this build has Gloo only (--device cpu)");
  }
  DisableFlightRecorder();
  absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> group =
      TorchCallOr<c10::intrusive_ptr<c10d::ProcessGroup>>(
          "creating the process group",
          [&]() -> c10::intrusive_ptr<c10d::ProcessGroup> {
#ifdef TANDEM_WITH_NCCL
            if (backend == CollectiveBackend::kNccl) {
              auto opts = c10d::ProcessGroupNCCL::Options::create();
              opts->timeout = timeout;
              return WrapBackend(c10::make_intrusive<c10d::ProcessGroupNCCL>(
                                     store, rank, world_size, opts),
                                 store, rank, world_size, backend, timeout);
            }
#endif
            auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
            opts->devices.push_back(GlooDevice(local_host));
            // Gloo's own worker threads; the executor already issues from a
            // dedicated communication thread, one collective at a time.
            opts->threads = 1;
            return WrapBackend(c10::make_intrusive<c10d::ProcessGroupGloo>(
                                   store, rank, world_size, opts),
                               store, rank, world_size, backend, timeout);
          });
  if (!group.ok()) {
    return absl::UnavailableError(absl::StrCat(
        group.status().message(),
        " (check that every rank started with the same --rendezvous and "
        "--world, and that rank 0 is reachable)"));
  }
  return group;
}

absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> CreateProcessGroup(
    const RendezvousOptions& options) {
  if (options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is outside world size ",
                     options.world_size, "; pass --rank in [0, --world)"));
  }
  absl::StatusOr<c10::intrusive_ptr<c10d::Store>> store =
      TorchCallOr<c10::intrusive_ptr<c10d::Store>>(
          "connecting to the rendezvous store",
          [&]() -> c10::intrusive_ptr<c10d::Store> {
            c10d::TCPStoreOptions opts;
            opts.port = static_cast<uint16_t>(options.port);
            opts.isServer = options.rank == 0;
            opts.numWorkers = options.world_size;
            opts.waitWorkers = false;
            opts.timeout = options.timeout;
            return c10::make_intrusive<c10d::TCPStore>(options.host, opts);
          });
  if (!store.ok()) {
    return absl::UnavailableError(absl::StrCat(
        store.status().message(), " (rendezvous ", options.host, ":",
        options.port, "; rank 0 must be able to listen there)"));
  }
  return CreateProcessGroupFromStore(*std::move(store), options.rank,
                                     options.world_size, options.backend,
                                     options.timeout, options.host);
}

}  // namespace tandem
