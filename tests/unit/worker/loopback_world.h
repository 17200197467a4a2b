// Runs a test body as W ranks in one process: one thread per rank, each with
// its own Gloo process group and Communicator, all meeting over one real
// c10d TCPStore on 127.0.0.1 (each run under its own key prefix).
#ifndef TANDEM_TESTS_UNIT_WORKER_LOOPBACK_WORLD_H_
#define TANDEM_TESTS_UNIT_WORKER_LOOPBACK_WORLD_H_

#include <functional>

#include "worker/runtime/communicator.h"

namespace tandem {

// Calls body(rank, comm) on `world` threads and joins them. Failures inside
// body are reported with gtest's ADD_FAILURE/EXPECT (thread-safe). Every
// rank's communicator gets `options`.
void RunLoopbackWorld(
    int world, const std::function<void(int rank, Communicator& comm)>& body,
    CommOptions options = {});

}  // namespace tandem

#endif  // TANDEM_TESTS_UNIT_WORKER_LOOPBACK_WORLD_H_
