// Agent mode where the worker is built without gRPC: the standalone-only
// build (TANDEM_WORKER_STANDALONE_ONLY) has no coordinator client.
#include <cstdio>

#include "worker/agent_mode.h"

namespace tandem {

bool AgentModeBuilt() { return false; }

int RunAgentMode(const AgentModeFlags& /*flags*/,
                 const RuntimeOptions& /*runtime*/,
                 IterationObserver* /*observer*/) {
  std::fprintf(stderr,
               "tandem-worker: this build has no agent mode (built with "
               "TANDEM_WORKER_STANDALONE_ONLY); use --standalone, or build "
               "with gRPC for --coordinator\n");
  return 2;
}

}  // namespace tandem
