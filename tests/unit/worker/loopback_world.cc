#include "tests/unit/worker/loopback_world.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"
#include "worker/runtime/process_group.h"

namespace tandem {
namespace {

c10::intrusive_ptr<c10d::TCPStore>& Server() {
  static auto* server = [] {
    c10d::TCPStoreOptions opts;
    opts.port = 0;  // any free port
    opts.isServer = true;
    opts.waitWorkers = false;
    opts.timeout = std::chrono::seconds(60);
    return new c10::intrusive_ptr<c10d::TCPStore>(
        c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts));
  }();
  return *server;
}

}  // namespace

void RunLoopbackWorld(
    int world, const std::function<void(int rank, Communicator& comm)>& body,
    CommOptions options) {
  static std::atomic<int> run{0};
  const std::string prefix = absl::StrCat("run", run++);
  const uint16_t port = Server()->getPort();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      c10d::TCPStoreOptions opts;
      opts.port = port;
      opts.isServer = false;
      opts.timeout = std::chrono::seconds(60);
      c10::intrusive_ptr<c10d::Store> client =
          c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
      auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, client);
      auto group = CreateProcessGroupFromStore(
          store, r, world, CollectiveBackend::kGloo, std::chrono::seconds(60));
      if (!group.ok()) {
        ADD_FAILURE() << "rank " << r << ": " << group.status();
        return;
      }
      Communicator comm(*group, options);
      body(r, comm);
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace tandem
