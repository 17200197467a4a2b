#include "worker/runtime/program.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem {

bool HasNamedInputs(const Program& program) {
  return std::any_of(program.inputs.begin(), program.inputs.end(),
                     [](const ProgramInput& in) { return in.role.empty(); });
}

absl::StatusOr<ProgramFlow> AnalyzeProgramFlow(const Program& program) {
  ProgramFlow flow;
  absl::flat_hash_map<std::string, int32_t> ids;
  auto define = [&](const std::string& name, absl::string_view by) {
    const int32_t id = static_cast<int32_t>(flow.values.size());
    if (name.empty() || !ids.emplace(name, id).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "program '", program.name, "': value '", name, "' (", by,
          ") is empty or defined twice; every value needs a unique name"));
    }
    flow.values.push_back(name);
    flow.last_reader.push_back(-1);
    return absl::OkStatus();
  };
  // Reads `name` at node `at` on behalf of `who`.
  auto read = [&](const std::string& name, int32_t at,
                  absl::string_view who) -> absl::StatusOr<int32_t> {
    auto it = ids.find(name);
    if (it == ids.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "program '", program.name, "': ", who, " reads '", name,
          "', which is neither a batch input nor an output of an earlier "
          "node"));
    }
    flow.last_reader[it->second] = at;
    return it->second;
  };
  for (const ProgramInput& in : program.inputs) {
    RETURN_IF_ERROR(define(in.name, "a batch input"));
  }
  if (program.nodes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("program '", program.name, "' has no nodes"));
  }
  const int32_t n = static_cast<int32_t>(program.nodes.size());
  flow.glue_of.assign(n, -1);
  int32_t covered_to = 0;
  for (size_t g = 0; g < program.glues.size(); ++g) {
    const ProgramGlue& glue = program.glues[g];
    if (glue.count < 1 || glue.first < covered_to ||
        glue.first + glue.count > n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "program '", program.name, "': glue '", glue.name, "' covers nodes ",
          glue.first, "..", glue.first + glue.count - 1, " of ", n,
          "; glues cover disjoint runs of nodes, in order"));
    }
    for (int32_t i = glue.first; i < glue.first + glue.count; ++i) {
      flow.glue_of[i] = static_cast<int32_t>(g);
    }
    covered_to = glue.first + glue.count;
  }
  flow.glue_inputs.resize(program.glues.size());
  flow.glue_outputs.resize(program.glues.size());
  for (int32_t i = 0; i < n; ++i) {
    const ProgramNode& node = program.nodes[i];
    std::vector<int32_t>& reads = flow.node_inputs.emplace_back();
    std::vector<int32_t>& writes = flow.node_outputs.emplace_back();
    if (node.outputs.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("program '", program.name,
                                                     "': node '", node.name,
                                                     "' has no outputs"));
    }
    const int32_t g = flow.glue_of[i];
    if (g < 0) {
      for (const std::string& name : node.inputs) {
        ASSIGN_OR_RETURN(int32_t v,
                         read(name, i, absl::StrCat("node '", node.name, "'")));
        reads.push_back(v);
      }
      for (const std::string& name : node.outputs) {
        writes.push_back(static_cast<int32_t>(flow.values.size()));
        RETURN_IF_ERROR(define(name, absl::StrCat("output of ", node.name)));
      }
      continue;
    }
    const ProgramGlue& glue = program.glues[g];
    const int32_t last = glue.first + glue.count - 1;
    if (i == glue.first) {
      for (const std::string& name : glue.inputs) {
        ASSIGN_OR_RETURN(
            int32_t v,
            read(name, last, absl::StrCat("glue '", glue.name, "'")));
        flow.glue_inputs[g].push_back(v);
      }
    }
    if (i == last) {
      if (glue.outputs.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("program '", program.name, "': glue '", glue.name,
                         "' has no outputs"));
      }
      for (const std::string& name : glue.outputs) {
        flow.glue_outputs[g].push_back(
            static_cast<int32_t>(flow.values.size()));
        RETURN_IF_ERROR(define(name, absl::StrCat("output of ", glue.name)));
      }
    }
  }
  // The loss: an output of the last node, or of the glue covering it.
  const int32_t last_glue = flow.glue_of.back();
  const std::vector<std::string>& outputs =
      last_glue >= 0 ? program.glues[last_glue].outputs
                     : program.nodes.back().outputs;
  const std::vector<int32_t>& output_ids =
      last_glue >= 0 ? flow.glue_outputs[last_glue] : flow.node_outputs.back();
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (outputs[o] == program.loss) flow.loss = output_ids[o];
  }
  if (flow.loss < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "program '", program.name, "': the loss '", program.loss,
        "' is not an output of the last node '", program.nodes.back().name, "'",
        last_glue >= 0 ? " or of the glue covering it" : ""));
  }
  return flow;
}

absl::StatusOr<Graph> DeriveGraph(const Program& program, int32_t world_size,
                                  int32_t micro_batches,
                                  int64_t tokens_per_micro_batch) {
  if (micro_batches < 1 || world_size < 1) {
    return absl::InvalidArgumentError(
        "world size and micro-batches must be >= 1");
  }
  Graph graph;
  graph.name = program.name;
  graph.world_size = world_size;
  graph.micro_batches = micro_batches;
  graph.tokens_per_micro_batch = tokens_per_micro_batch;
  if (program.reduce_dtype != program.dtype) {
    graph.reduce_dtype = program.reduce_dtype;
  }
  absl::flat_hash_set<std::string> names;
  for (const ProgramParam& p : program.params) {
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("program param '", p.name, "' is declared twice"));
    }
    Param param;
    param.id = static_cast<int32_t>(graph.params.size());
    param.name = p.name;
    param.shape = p.shape;
    param.dtype = program.dtype;
    param.unit = p.unit;
    param.trainable = p.trainable;
    graph.params.push_back(std::move(param));
  }
  RETURN_IF_ERROR(AnalyzeProgramFlow(program).status());
  for (const ProgramNode& node : program.nodes) {
    for (int32_t id : node.param_ids) {
      if (id < 0 || id >= static_cast<int32_t>(program.params.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "program node '", node.name, "' uses unknown param ", id));
      }
    }
  }
  std::vector<IterationUnit> units(program.nodes.size());
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    units[i].name = program.nodes[i].name;
    units[i].param_ids = program.nodes[i].param_ids;
    units[i].recompute = program.nodes[i].recompute;
  }
  AppendIterationNodes(units, graph);
  return graph;
}

absl::Status AnnotateEstimates(const Graph& estimates, Graph& graph) {
  if (estimates.StructuralHash() != graph.StructuralHash() ||
      estimates.nodes.size() != graph.nodes.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "graph '", graph.name, "' (hash ", graph.StructuralHash(),
        ") differs from the estimates' graph (hash ",
        estimates.StructuralHash(), "); rebuild both from one model config"));
  }
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    Node& n = graph.nodes[i];
    const Node& e = estimates.nodes[i];
    n.flops = e.flops;
    n.time_s = e.time_s;
    n.activation_bytes = e.activation_bytes;
    n.workspace_bytes = e.workspace_bytes;
  }
  return absl::OkStatus();
}

}  // namespace tandem
