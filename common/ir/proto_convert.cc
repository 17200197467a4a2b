#include "common/ir/proto_convert.h"

#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/ir/profile_fields.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace tandem {
namespace {

template <typename Repeated>
std::vector<int32_t> Ids(const Repeated& ids) {
  return std::vector<int32_t>(ids.begin(), ids.end());
}

template <typename Vec, typename Repeated>
void SetIds(const Vec& ids, Repeated* out) {
  out->Reserve(static_cast<int>(ids.size()));
  for (auto id : ids) out->Add(id);
}

// The measured fields (profile_fields.h) by reflection: each table's
// descriptors are looked up once. A table entry without its proto field
// (caught by profile_fields_test) is skipped.
template <typename Record>
const std::vector<const google::protobuf::FieldDescriptor*>& FieldDescriptors(
    absl::Span<const ProfileField<Record>> fields,
    const google::protobuf::Descriptor* type) {
  static const auto* const resolved = [&] {
    auto* out = new std::vector<const google::protobuf::FieldDescriptor*>;
    for (const ProfileField<Record>& f : fields) {
      out->push_back(type->FindFieldByName(std::string(f.proto_name)));
    }
    return out;
  }();
  return *resolved;
}

template <typename Record>
void FieldsToProto(const Record& record,
                   absl::Span<const ProfileField<Record>> fields,
                   google::protobuf::Message* out) {
  const auto& descriptors = FieldDescriptors(fields, out->GetDescriptor());
  const google::protobuf::Reflection* reflection = out->GetReflection();
  for (size_t i = 0; i < fields.size(); ++i) {
    const google::protobuf::FieldDescriptor* d = descriptors[i];
    if (d == nullptr) continue;
    std::visit(
        [&](auto member) {
          using T = std::remove_cv_t<
              std::remove_reference_t<decltype(record.*member)>>;
          if constexpr (std::is_same_v<T, int32_t>) {
            reflection->SetInt32(out, d, record.*member);
          } else if constexpr (std::is_same_v<T, int64_t>) {
            reflection->SetInt64(out, d, record.*member);
          } else {
            reflection->SetDouble(out, d, record.*member);
          }
        },
        fields[i].member);
  }
}

template <typename Record>
void FieldsFromProto(const google::protobuf::Message& proto,
                     absl::Span<const ProfileField<Record>> fields,
                     Record* record) {
  const auto& descriptors = FieldDescriptors(fields, proto.GetDescriptor());
  const google::protobuf::Reflection* reflection = proto.GetReflection();
  for (size_t i = 0; i < fields.size(); ++i) {
    const google::protobuf::FieldDescriptor* d = descriptors[i];
    if (d == nullptr) continue;
    std::visit(
        [&](auto member) {
          using T = std::remove_reference_t<decltype(record->*member)>;
          if constexpr (std::is_same_v<T, int32_t>) {
            record->*member = reflection->GetInt32(proto, d);
          } else if constexpr (std::is_same_v<T, int64_t>) {
            record->*member = reflection->GetInt64(proto, d);
          } else {
            record->*member = reflection->GetDouble(proto, d);
          }
        },
        fields[i].member);
  }
}

v1::DType ToProtoDType(DType d) {
  switch (d) {
    case DType::kF32:
      return v1::DTYPE_F32;
    case DType::kBF16:
      return v1::DTYPE_BF16;
    case DType::kF16:
      return v1::DTYPE_F16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

v1::Phase ToProtoPhase(Phase p) {
  switch (p) {
    case Phase::kForward:
      return v1::PHASE_FORWARD;
    case Phase::kBackward:
      return v1::PHASE_BACKWARD;
    case Phase::kOptimizer:
      return v1::PHASE_OPTIMIZER;
  }
  return v1::PHASE_UNSPECIFIED;
}

absl::StatusOr<Phase> FromProtoPhase(v1::Phase p, absl::string_view where) {
  switch (p) {
    case v1::PHASE_FORWARD:
      return Phase::kForward;
    case v1::PHASE_BACKWARD:
      return Phase::kBackward;
    case v1::PHASE_OPTIMIZER:
      return Phase::kOptimizer;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": phase is unspecified or unknown (", static_cast<int>(p),
          "); set PHASE_FORWARD, PHASE_BACKWARD or PHASE_OPTIMIZER"));
  }
}

v1::ActionKind ToProtoActionKind(ActionKind k) {
  switch (k) {
    case ActionKind::kAllGather:
      return v1::ACTION_KIND_ALLGATHER;
    case ActionKind::kWait:
      return v1::ACTION_KIND_WAIT;
    case ActionKind::kRelease:
      return v1::ACTION_KIND_RELEASE;
    case ActionKind::kReduceScatter:
      return v1::ACTION_KIND_REDUCE_SCATTER;
    case ActionKind::kOffload:
      return v1::ACTION_KIND_OFFLOAD;
    case ActionKind::kReload:
      return v1::ACTION_KIND_RELOAD;
  }
  return v1::ACTION_KIND_UNSPECIFIED;
}

absl::StatusOr<ActionKind> FromProtoActionKind(v1::ActionKind k, int index) {
  switch (k) {
    case v1::ACTION_KIND_ALLGATHER:
      return ActionKind::kAllGather;
    case v1::ACTION_KIND_WAIT:
      return ActionKind::kWait;
    case v1::ACTION_KIND_RELEASE:
      return ActionKind::kRelease;
    case v1::ACTION_KIND_REDUCE_SCATTER:
      return ActionKind::kReduceScatter;
    case v1::ACTION_KIND_OFFLOAD:
      return ActionKind::kOffload;
    case v1::ACTION_KIND_RELOAD:
      return ActionKind::kReload;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "action ", index, ": kind is unspecified or unknown (", k, ")"));
  }
}

v1::CollectiveKind ToProtoCollectiveKind(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllGather:
      return v1::COLLECTIVE_KIND_ALLGATHER;
    case CollectiveKind::kReduceScatter:
      return v1::COLLECTIVE_KIND_REDUCE_SCATTER;
    case CollectiveKind::kAllReduce:
      return v1::COLLECTIVE_KIND_ALLREDUCE;
  }
  return v1::COLLECTIVE_KIND_UNSPECIFIED;
}

absl::StatusOr<CollectiveKind> FromProtoCollectiveKind(v1::CollectiveKind k,
                                                       int index) {
  switch (k) {
    case v1::COLLECTIVE_KIND_ALLGATHER:
      return CollectiveKind::kAllGather;
    case v1::COLLECTIVE_KIND_REDUCE_SCATTER:
      return CollectiveKind::kReduceScatter;
    case v1::COLLECTIVE_KIND_ALLREDUCE:
      return CollectiveKind::kAllReduce;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "collective ", index, ": kind is unspecified or unknown (",
          static_cast<int>(k), ")"));
  }
}

}  // namespace

absl::StatusOr<DType> FromProtoDType(v1::DType d, absl::string_view where) {
  switch (d) {
    case v1::DTYPE_F32:
      return DType::kF32;
    case v1::DTYPE_BF16:
      return DType::kBF16;
    case v1::DTYPE_F16:
      return DType::kF16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": dtype is unspecified or unknown (", static_cast<int>(d),
          "); set DTYPE_F32, DTYPE_BF16 or DTYPE_F16"));
  }
}

v1::Graph ToProto(const Graph& graph) {
  v1::Graph out;
  out.set_name(graph.name);
  out.set_world_size(graph.world_size);
  out.set_micro_batches(graph.micro_batches);
  out.set_tokens_per_micro_batch(graph.tokens_per_micro_batch);
  if (graph.reduce_dtype.has_value()) {
    out.set_reduce_dtype(ToProtoDType(*graph.reduce_dtype));
  }
  out.mutable_params()->Reserve(static_cast<int>(graph.params.size()));
  for (const Param& p : graph.params) {
    v1::Param* q = out.add_params();
    q->set_id(p.id);
    q->set_name(p.name);
    SetIds(p.shape, q->mutable_shape());
    q->set_dtype(ToProtoDType(p.dtype));
    q->set_numel(p.numel());
    q->set_shard_numel(p.shard_numel(graph.world_size));
    q->set_unit(p.unit);
    q->set_frozen(!p.trainable);
  }
  out.mutable_nodes()->Reserve(static_cast<int>(graph.nodes.size()));
  for (const Node& n : graph.nodes) {
    v1::Node* q = out.add_nodes();
    q->set_id(n.id);
    q->set_name(n.name);
    q->set_phase(ToProtoPhase(n.phase));
    q->set_micro_batch(n.micro_batch);
    // Proto3 has no presence for scalars: -1 stands for "no twin".
    q->set_forward_id(n.forward_id.value_or(-1));
    q->set_recompute(n.recompute);
    SetIds(n.param_ids, q->mutable_param_ids());
    q->set_flops(n.flops);
    q->set_time_s(n.time_s);
    q->set_activation_bytes(n.activation_bytes);
    q->set_workspace_bytes(n.workspace_bytes);
  }
  out.set_hash(graph.StructuralHash());
  return out;
}

absl::StatusOr<Graph> FromProto(const v1::Graph& proto) {
  Graph g;
  g.name = proto.name();
  g.world_size = proto.world_size();
  g.micro_batches = proto.micro_batches();
  g.tokens_per_micro_batch = proto.tokens_per_micro_batch();
  if (proto.reduce_dtype() != v1::DTYPE_UNSPECIFIED) {
    auto reduce = FromProtoDType(proto.reduce_dtype(), "graph reduce_dtype");
    if (!reduce.ok()) return reduce.status();
    g.reduce_dtype = *reduce;
  }
  g.params.reserve(proto.params_size());
  for (const v1::Param& q : proto.params()) {
    Param p;
    p.id = q.id();
    p.name = q.name();
    p.shape.assign(q.shape().begin(), q.shape().end());
    auto dtype = FromProtoDType(q.dtype(), absl::StrCat("param p", q.id()));
    if (!dtype.ok()) return dtype.status();
    p.dtype = *dtype;
    p.unit = q.unit();
    p.trainable = !q.frozen();
    if (q.numel() != 0 && q.numel() != p.numel()) {
      return absl::InvalidArgumentError(
          absl::StrCat("param p", q.id(), " '", q.name(), "': numel ",
                       q.numel(), " does not match its shape (", p.numel(),
                       "); send the shape and leave numel derived"));
    }
    g.params.push_back(std::move(p));
  }
  g.nodes.reserve(proto.nodes_size());
  for (const v1::Node& q : proto.nodes()) {
    Node n;
    n.id = q.id();
    n.name = q.name();
    auto phase = FromProtoPhase(q.phase(), absl::StrCat("node n", q.id()));
    if (!phase.ok()) return phase.status();
    n.phase = *phase;
    n.micro_batch = q.micro_batch();
    if (n.phase == Phase::kBackward && q.forward_id() >= 0) {
      n.forward_id = q.forward_id();
    }
    n.recompute = q.recompute();
    n.param_ids = Ids(q.param_ids());
    n.flops = q.flops();
    n.time_s = q.time_s();
    n.activation_bytes = q.activation_bytes();
    n.workspace_bytes = q.workspace_bytes();
    g.nodes.push_back(std::move(n));
  }
  if (!proto.hash().empty() && proto.hash() != g.StructuralHash()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "graph hash ", proto.hash(), " does not match its structure (",
        g.StructuralHash(),
        "); the graph was altered after hashing, or leave hash empty"));
  }
  return g;
}

namespace {

// Explanation: the v1 enums list the kinds in the C++ order, from 1.
void ExplanationToProto(const Explanation& e, v1::Explanation* out) {
  out->set_baseline_iteration_s(e.baseline_iteration_s);
  out->set_baseline_exposed_comm_s(e.baseline_exposed_comm_s);
  out->set_baseline_peak_bytes(e.baseline_peak_bytes);
  for (const Decision& d : e.decisions) {
    v1::Decision* q = out->add_decisions();
    q->set_kind(static_cast<v1::DecisionKind>(static_cast<int>(d.kind) + 1));
    q->set_pass(d.pass);
    q->set_what(d.what);
    SetIds(d.group_ids, q->mutable_group_ids());
    SetIds(d.param_ids, q->mutable_param_ids());
    SetIds(d.offload_ids, q->mutable_offload_ids());
    if (d.node_id.has_value()) q->set_node_id(*d.node_id);
    q->set_gain_s(d.gain_s);
    q->set_exposed_gain_s(d.exposed_gain_s);
    q->set_held_bytes(d.held_bytes);
    q->set_peak_delta_bytes(d.peak_delta_bytes);
    v1::Binding* b = q->mutable_binding();
    b->set_kind(
        static_cast<v1::BindingKind>(static_cast<int>(d.binding.kind) + 1));
    if (d.binding.node_id.has_value()) b->set_node_id(*d.binding.node_id);
    b->set_bytes(d.binding.bytes);
    b->set_limit_bytes(d.binding.limit_bytes);
  }
}

absl::StatusOr<Explanation> ExplanationFromProto(const v1::Explanation& proto) {
  Explanation e;
  e.baseline_iteration_s = proto.baseline_iteration_s();
  e.baseline_exposed_comm_s = proto.baseline_exposed_comm_s();
  e.baseline_peak_bytes = proto.baseline_peak_bytes();
  for (int i = 0; i < proto.decisions_size(); ++i) {
    const v1::Decision& q = proto.decisions(i);
    Decision d;
    if (q.kind() <= v1::DECISION_KIND_UNSPECIFIED ||
        q.kind() > v1::DecisionKind_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          "explanation decision ", i, ": kind is unspecified or unknown (",
          static_cast<int>(q.kind()), "); set a DECISION_KIND_* value"));
    }
    d.kind = static_cast<DecisionKind>(static_cast<int>(q.kind()) - 1);
    d.pass = q.pass();
    d.what = q.what();
    d.group_ids = Ids(q.group_ids());
    d.param_ids = Ids(q.param_ids());
    d.offload_ids = Ids(q.offload_ids());
    if (q.has_node_id()) d.node_id = q.node_id();
    d.gain_s = q.gain_s();
    d.exposed_gain_s = q.exposed_gain_s();
    d.held_bytes = q.held_bytes();
    d.peak_delta_bytes = q.peak_delta_bytes();
    const v1::Binding& b = q.binding();
    if (b.kind() == v1::BINDING_KIND_UNSPECIFIED) {
      d.binding.kind = BindingKind::kNone;
    } else if (b.kind() > v1::BindingKind_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          "explanation decision ", i, ": unknown binding kind (",
          static_cast<int>(b.kind()), "); set a BINDING_KIND_* value"));
    } else {
      d.binding.kind = static_cast<BindingKind>(static_cast<int>(b.kind()) - 1);
    }
    if (b.has_node_id()) d.binding.node_id = b.node_id();
    d.binding.bytes = b.bytes();
    d.binding.limit_bytes = b.limit_bytes();
    e.decisions.push_back(std::move(d));
  }
  return e;
}

}  // namespace

v1::Schedule ToProto(const Schedule& schedule) {
  v1::Schedule out;
  out.set_graph_hash(schedule.graph_hash);
  out.set_version(schedule.version);
  out.set_mode(schedule.mode == ShardingMode::kZero3 ? v1::SHARDING_MODE_ZERO3
                                                     : v1::SHARDING_MODE_ZERO1);
  for (const GatherGroup& g : schedule.groups) {
    v1::GatherGroup* q = out.add_groups();
    q->set_id(g.id);
    SetIds(g.param_ids, q->mutable_param_ids());
  }
  SetIds(schedule.persistent_param_ids, out.mutable_persistent_param_ids());
  for (const OffloadEntry& o : schedule.offloads) {
    v1::OffloadEntry* q = out.add_offloads();
    q->set_id(o.id);
    SetIds(o.param_ids, q->mutable_param_ids());
    q->set_bytes(o.bytes);
  }
  out.mutable_actions()->Reserve(static_cast<int>(schedule.actions.size()));
  for (const Action& a : schedule.actions) {
    v1::Action* q = out.add_actions();
    q->set_kind(ToProtoActionKind(a.kind));
    q->set_node_id(a.node_id);
    q->set_position(a.position == AnchorPosition::kBefore
                        ? v1::ANCHOR_POSITION_BEFORE
                        : v1::ANCHOR_POSITION_AFTER);
    q->set_group_id(a.group_id);
    SetIds(a.param_ids, q->mutable_param_ids());
    q->set_offload_id(a.offload_id);
  }
  v1::Prediction* p = out.mutable_prediction();
  p->set_iteration_s(schedule.prediction.iteration_s);
  p->set_compute_s(schedule.prediction.compute_s);
  p->set_comm_s(schedule.prediction.comm_s);
  p->set_exposed_comm_s(schedule.prediction.exposed_comm_s);
  p->set_copy_s(schedule.prediction.copy_s);
  p->set_peak_bytes(schedule.prediction.peak_bytes);
  p->set_work(schedule.prediction.work);
  v1::Provenance* v = out.mutable_provenance();
  for (const std::string& pass : schedule.provenance.passes) {
    v->add_passes(pass);
  }
  v->set_window_first_iteration(schedule.provenance.window_first_iteration);
  v->set_window_last_iteration(schedule.provenance.window_last_iteration);
  v->set_plan_wall_s(schedule.provenance.plan_wall_s);
  v->set_reason(schedule.provenance.reason);
  out.set_budget_bytes(schedule.budget_bytes);
  if (!schedule.explanation.empty() ||
      schedule.explanation.baseline_iteration_s != 0) {
    ExplanationToProto(schedule.explanation, out.mutable_explanation());
  }
  return out;
}

absl::StatusOr<Schedule> FromProto(const v1::Schedule& proto) {
  Schedule s;
  s.graph_hash = proto.graph_hash();
  s.version = proto.version();
  switch (proto.mode()) {
    case v1::SHARDING_MODE_ZERO3:
      s.mode = ShardingMode::kZero3;
      break;
    case v1::SHARDING_MODE_ZERO1:
      s.mode = ShardingMode::kZero1;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("schedule mode is unspecified or unknown (",
                       static_cast<int>(proto.mode()),
                       "); set SHARDING_MODE_ZERO3 or SHARDING_MODE_ZERO1"));
  }
  for (const v1::GatherGroup& q : proto.groups()) {
    s.groups.push_back({q.id(), Ids(q.param_ids())});
  }
  s.persistent_param_ids = Ids(proto.persistent_param_ids());
  for (const v1::OffloadEntry& q : proto.offloads()) {
    s.offloads.push_back({q.id(), Ids(q.param_ids()), q.bytes()});
  }
  s.actions.reserve(proto.actions_size());
  for (int i = 0; i < proto.actions_size(); ++i) {
    const v1::Action& q = proto.actions(i);
    Action a;
    auto kind = FromProtoActionKind(q.kind(), i);
    if (!kind.ok()) return kind.status();
    a.kind = *kind;
    a.node_id = q.node_id();
    switch (q.position()) {
      case v1::ANCHOR_POSITION_BEFORE:
        a.position = AnchorPosition::kBefore;
        break;
      case v1::ANCHOR_POSITION_AFTER:
        a.position = AnchorPosition::kAfter;
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "action ", i, ": position is unspecified or unknown (",
            q.position(), "); set ANCHOR_POSITION_BEFORE or _AFTER"));
    }
    a.group_id = q.group_id();
    a.param_ids = Ids(q.param_ids());
    a.offload_id = q.offload_id();
    s.actions.push_back(std::move(a));
  }
  const v1::Prediction& p = proto.prediction();
  s.prediction = {
      p.iteration_s(), p.compute_s(),  p.comm_s(), p.exposed_comm_s(),
      p.copy_s(),      p.peak_bytes(), p.work()};
  const v1::Provenance& v = proto.provenance();
  s.provenance.passes.assign(v.passes().begin(), v.passes().end());
  s.provenance.window_first_iteration = v.window_first_iteration();
  s.provenance.window_last_iteration = v.window_last_iteration();
  s.provenance.plan_wall_s = v.plan_wall_s();
  s.provenance.reason = v.reason();
  s.budget_bytes = proto.budget_bytes();
  if (proto.has_explanation()) {
    absl::StatusOr<Explanation> explanation =
        ExplanationFromProto(proto.explanation());
    if (!explanation.ok()) return explanation.status();
    s.explanation = *std::move(explanation);
  }
  return s;
}

v1::Profile ToProto(const Profile& profile) {
  v1::Profile out;
  out.set_graph_hash(profile.graph_hash);
  out.set_rank(profile.rank);
  out.set_schedule_version(profile.schedule_version);
  out.set_first_iteration(profile.first_iteration);
  out.set_last_iteration(profile.last_iteration);
  FieldsToProto(profile, ProfileHeaderFields(), &out);
  out.mutable_allgather_scratch()->set_copies(profile.allgather_scratch.copies);
  out.mutable_allgather_scratch()->set_cap_bytes(
      profile.allgather_scratch.cap_bytes);
  out.mutable_reduce_scatter_scratch()->set_copies(
      profile.reduce_scatter_scratch.copies);
  out.mutable_reduce_scatter_scratch()->set_cap_bytes(
      profile.reduce_scatter_scratch.cap_bytes);
  out.mutable_nodes()->Reserve(static_cast<int>(profile.nodes.size()));
  for (const NodeTiming& t : profile.nodes) {
    v1::NodeTiming* q = out.add_nodes();
    q->set_node_id(t.node_id);
    FieldsToProto(t, NodeTimingFields(), q);
  }
  for (const CollectiveTiming& c : profile.collectives) {
    v1::CollectiveTiming* q = out.add_collectives();
    q->set_kind(ToProtoCollectiveKind(c.kind));
    q->set_group_id(c.group_id);
    SetIds(c.param_ids, q->mutable_param_ids());
    q->set_node_id(c.node_id);
    FieldsToProto(c, CollectiveTimingFields(), q);
  }
  out.mutable_memory()->Reserve(static_cast<int>(profile.memory.size()));
  for (const MemorySample& m : profile.memory) {
    v1::MemorySample* q = out.add_memory();
    q->set_node_id(m.node_id);
    FieldsToProto(m, MemorySampleFields(), q);
  }
  return out;
}

absl::StatusOr<Profile> FromProto(const v1::Profile& proto) {
  Profile p;
  p.graph_hash = proto.graph_hash();
  p.rank = proto.rank();
  p.schedule_version = proto.schedule_version();
  p.first_iteration = proto.first_iteration();
  p.last_iteration = proto.last_iteration();
  FieldsFromProto(proto, ProfileHeaderFields(), &p);
  p.allgather_scratch = {proto.allgather_scratch().copies(),
                         proto.allgather_scratch().cap_bytes()};
  p.reduce_scatter_scratch = {proto.reduce_scatter_scratch().copies(),
                              proto.reduce_scatter_scratch().cap_bytes()};
  p.nodes.reserve(proto.nodes_size());
  for (const v1::NodeTiming& q : proto.nodes()) {
    NodeTiming& t = p.nodes.emplace_back();
    t.node_id = q.node_id();
    FieldsFromProto(q, NodeTimingFields(), &t);
  }
  for (int i = 0; i < proto.collectives_size(); ++i) {
    const v1::CollectiveTiming& q = proto.collectives(i);
    auto kind = FromProtoCollectiveKind(q.kind(), i);
    if (!kind.ok()) return kind.status();
    CollectiveTiming& c = p.collectives.emplace_back();
    c.kind = *kind;
    c.group_id = q.group_id();
    c.param_ids = Ids(q.param_ids());
    c.node_id = q.node_id();
    FieldsFromProto(q, CollectiveTimingFields(), &c);
  }
  p.memory.reserve(proto.memory_size());
  for (const v1::MemorySample& q : proto.memory()) {
    MemorySample& m = p.memory.emplace_back();
    m.node_id = q.node_id();
    FieldsFromProto(q, MemorySampleFields(), &m);
  }
  return p;
}

}  // namespace tandem
