// Conversion between the IR and tandem.v1 messages. FromProto rejects what
// the proto allows but the IR cannot hold (unspecified enums, out-of-range
// values) with InvalidArgument; run validate.h for the semantic rules.
#ifndef TANDEM_COMMON_IR_PROTO_CONVERT_H_
#define TANDEM_COMMON_IR_PROTO_CONVERT_H_

#include "absl/status/statusor.h"
#include "common/ir/graph.h"
#include "common/ir/profile.h"
#include "common/ir/schedule.h"
#include "tandem/v1/graph.pb.h"
#include "tandem/v1/profile.pb.h"
#include "tandem/v1/schedule.pb.h"

namespace tandem {

// The IR dtype of a proto dtype; InvalidArgument naming `where` for an
// unspecified or unknown one.
absl::StatusOr<DType> FromProtoDType(v1::DType dtype, absl::string_view where);

// Fills the derived fields too (numel, shard_numel, the structural hash).
v1::Graph ToProto(const Graph& graph);
absl::StatusOr<Graph> FromProto(const v1::Graph& proto);

v1::Schedule ToProto(const Schedule& schedule);
absl::StatusOr<Schedule> FromProto(const v1::Schedule& proto);

v1::Profile ToProto(const Profile& profile);
absl::StatusOr<Profile> FromProto(const v1::Profile& proto);

}  // namespace tandem

#endif  // TANDEM_COMMON_IR_PROTO_CONVERT_H_
