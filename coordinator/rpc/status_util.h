// absl::Status <-> grpc::Status. The numeric codes are the same by design.
#ifndef TANDEM_COORDINATOR_RPC_STATUS_UTIL_H_
#define TANDEM_COORDINATOR_RPC_STATUS_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"

namespace tandem {

inline grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

inline absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace tandem

#endif  // TANDEM_COORDINATOR_RPC_STATUS_UTIL_H_
