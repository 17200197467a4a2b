// tandem-graph: builds the iteration graph of a built-in model and prints a
// summary of it, or the graph itself in text form.
//
//   tandem-graph [--preset NAME] [--model "key=value ..."] [--text]
//
// The model starts from --preset (default tiny-llama); --model overrides
// fields (keys as in ParseModelConfig; a preset= key there replaces the
// base). Exit status: 0 on success, 2 on bad arguments or an invalid config.
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/flags/command_line.h"
#include "common/ir/graph.h"
#include "common/ir/text_format.h"
#include "common/models/graph_builder.h"
#include "common/models/model_config.h"

ABSL_FLAG(std::string, preset, "tiny-llama", "base model");
ABSL_FLAG(std::string, model, "",
          "overrides, e.g. \"layers=8 seq_len=1024 world=32 "
          "checkpointing=true\"; keys: preset arch layers d_model heads "
          "kv_heads ffn vocab experts top_k seq_len micro_batch grad_accum "
          "dtype checkpointing world device_flops device_bytes_per_s name");
ABSL_FLAG(bool, text, false,
          "print the graph in text form instead of a summary");

namespace tandem {
namespace {

constexpr int kExitUsage = 2;

constexpr char kUsage[] =
    "usage: tandem-graph [--preset NAME] [--model \"key=value ...\"] "
    "[--text]\n"
    "Builds the iteration graph of a built-in model and prints a summary of "
    "it, or the\ngraph in text form.\n";

int Fail(absl::string_view message) {
  std::fprintf(stderr, "tandem-graph: %.*s\n", static_cast<int>(message.size()),
               message.data());
  return kExitUsage;
}

std::string Count(double n) {
  if (n >= 1e9) return absl::StrFormat("%.2f B", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.2f M", n / 1e6);
  if (n >= 1e3) return absl::StrFormat("%.2f K", n / 1e3);
  return absl::StrFormat("%.0f", n);
}

std::string Bytes(double n) {
  if (n >= 1024.0 * 1024 * 1024) {
    return absl::StrFormat("%.2f GiB", n / (1024.0 * 1024 * 1024));
  }
  if (n >= 1024.0 * 1024) return absl::StrFormat("%.2f MiB", n / 1048576.0);
  if (n >= 1024.0) return absl::StrFormat("%.2f KiB", n / 1024.0);
  return absl::StrFormat("%.0f B", n);
}

std::string Flops(double n) {
  if (n >= 1e12) return absl::StrFormat("%.3f TFLOP", n / 1e12);
  if (n >= 1e9) return absl::StrFormat("%.3f GFLOP", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.3f MFLOP", n / 1e6);
  return absl::StrFormat("%.0f FLOP", n);
}

std::string Seconds(double s) {
  if (s >= 1) return absl::StrFormat("%.3f s", s);
  if (s >= 1e-3) return absl::StrFormat("%.3f ms", s * 1e3);
  return absl::StrFormat("%.3f us", s * 1e6);
}

void PrintSummary(const ModelConfig& c, const Graph& graph) {
  const GraphSummary s = SummarizeGraph(graph);
  int counts[3] = {0, 0, 0};
  for (const Node& n : graph.nodes) ++counts[static_cast<int>(n.phase)];
  const bool moe = c.arch == ModelArch::kMoe;

  absl::PrintF("model        %s (%s, %s)\n", graph.name, moe ? "moe" : "llama",
               DTypeName(c.dtype));
  absl::PrintF(
      "shape        layers %d, d_model %d, heads %d, kv_heads %d, ffn %d, "
      "vocab %d",
      c.layers, c.d_model, c.heads, c.kv_heads, c.ffn, c.vocab);
  if (moe) absl::PrintF(", experts %d, top_k %d", c.experts, c.top_k);
  absl::PrintF("\n");
  absl::PrintF("params       %s (%s) in %d tensors\n",
               Count(static_cast<double>(s.params)),
               Bytes(static_cast<double>(s.param_bytes)),
               static_cast<int>(graph.params.size()));
  absl::PrintF(
      "batch        %d x %d = %d tokens per rank and micro-batch, grad_accum "
      "%d, world %d%s\n",
      c.micro_batch, c.seq_len, graph.tokens_per_micro_batch, c.grad_accum,
      c.world_size,
      c.activation_checkpointing ? ", activation checkpointing" : "");
  absl::PrintF("nodes        %d (%d forward, %d backward, %d optimizer)\n",
               s.nodes, counts[0], counts[1], counts[2]);
  absl::PrintF("flops        forward %s, backward %s, optimizer %s\n",
               Flops(s.forward_flops), Flops(s.backward_flops),
               Flops(s.optimizer_flops));
  absl::PrintF("activations  forward %s saved, max workspace %s\n",
               Bytes(static_cast<double>(s.forward_activation_bytes)),
               Bytes(static_cast<double>(s.max_workspace_bytes)));
  absl::PrintF(
      "time         forward %s, backward %s, optimizer %s, total %s (at %.0f "
      "TFLOP/s, %.0f GB/s)\n",
      Seconds(s.forward_time_s), Seconds(s.backward_time_s),
      Seconds(s.optimizer_time_s),
      Seconds(s.forward_time_s + s.backward_time_s + s.optimizer_time_s),
      c.device_flops / 1e12, c.device_bytes_per_s / 1e9);
  absl::PrintF("hash         %s\n", graph.StructuralHash());
}

int Main(int argc, char** argv) {
  ParseCommandLineOrExit({"tandem-graph", kUsage}, argc, argv);
  absl::StatusOr<ModelConfig> base = ModelPreset(absl::GetFlag(FLAGS_preset));
  if (!base.ok()) return Fail(base.status().message());
  absl::StatusOr<ModelConfig> config =
      ParseModelConfig(absl::GetFlag(FLAGS_model), *base);
  if (!config.ok()) return Fail(config.status().message());
  absl::StatusOr<Graph> graph = BuildModelGraph(*config);
  if (!graph.ok()) return Fail(graph.status().message());
  if (absl::GetFlag(FLAGS_text)) {
    std::fputs(PrintGraph(*graph).c_str(), stdout);
  } else {
    PrintSummary(*config, *graph);
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
