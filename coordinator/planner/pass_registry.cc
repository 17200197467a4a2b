#include "coordinator/planner/pass_registry.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/bytes.h"
#include "common/status_macros.h"
#include "coordinator/passes/gradient_reduction_pass.h"
#include "coordinator/passes/offload_pass.h"
#include "coordinator/passes/offload_unshard_search_pass.h"
#include "coordinator/passes/prefetch_pass.h"
#include "coordinator/passes/unshard_pass.h"
#include "coordinator/passes/zero1_pass.h"
#include "coordinator/passes/zero3_insert_pass.h"
#include "coordinator/policies/deepspeed_persistence_pass.h"
#include "coordinator/policies/deepspeed_prefetch_pass.h"
#include "coordinator/policies/fsdp_prefetch_pass.h"
#include "coordinator/policies/greedy_prefetch_pass.h"
#include "coordinator/policies/greedy_unshard_pass.h"
#include "coordinator/policies/memory_only_offload_pass.h"
#include "coordinator/policies/split_gather_groups_pass.h"

namespace tandem {
namespace {

template <typename T, typename... Args>
std::function<std::unique_ptr<PlanningPass>(const PassArgs&)> Plain(
    Args... args) {
  return [=](const PassArgs&) -> std::unique_ptr<PlanningPass> {
    return std::make_unique<T>(args...);
  };
}

PassParam Count(std::string key, int64_t default_value, std::string help) {
  return {std::move(key),
          PassParam::Kind::kCount,
          absl::StrCat(default_value),
          {},
          std::move(help)};
}

PassParam Bytes(std::string key, int64_t default_value, std::string help) {
  return {std::move(key),
          PassParam::Kind::kBytes,
          absl::StrCat(default_value),
          {},
          std::move(help)};
}

}  // namespace

int64_t PassArgs::Int(absl::string_view key) const {
  auto it = ints_.find(key);
  return it == ints_.end() ? 0 : it->second;
}

const std::string& PassArgs::Text(absl::string_view key) const {
  static const std::string* const kEmpty = new std::string();
  auto it = text_.find(key);
  return it == text_.end() ? *kEmpty : it->second;
}

PassRegistry::PassRegistry() {
  passes_ = {
      // Tandem's passes (coordinator/passes/README.md).
      {"zero3-insert",
       "ZeRO-3 baseline: gather before each use, release after the last use "
       "in each phase, reduce-scatter each gradient once complete",
       {{"grouping",
         PassParam::Kind::kChoice,
         "node",
         {"node", "unit"},
         "one gather group per forward node, or per wrapping unit (FSDP)"},
        {"reduce",
         PassParam::Kind::kChoice,
         "once",
         {"once", "micro-batch"},
         "with grad_accum > 1: accumulate gradients unsharded and reduce "
         "once, or reduce-scatter every micro-batch into sharded "
         "accumulators (FSDP, DeepSpeed)"}},
       [](const PassArgs& args) -> std::unique_ptr<PlanningPass> {
         return std::make_unique<Zero3InsertPass>(
             args.Text("grouping") == "unit" ? GatherGrouping::kPerUnit
                                             : GatherGrouping::kPerNode,
             args.Text("reduce") == "micro-batch"
                 ? GradientReduction::kPerMicroBatch
                 : GradientReduction::kOnce);
       }},
      {"prefetch",
       "issue each gather just early enough to hide it, fusing neighbours "
       "when one collective is cheaper",
       {},
       Plain<PrefetchPass>()},
      {"unshard",
       "keep the groups that save the most exposed communication per byte "
       "gathered across phases (a knapsack under the memory headroom)",
       {{"arrangement",
         PassParam::Kind::kChoice,
         "spread",
         {"spread", "backward-first"},
         "which of equally valued groups to keep: spread over the model, or "
         "the ones the backward uses first"}},
       [](const PassArgs& args) -> std::unique_ptr<PlanningPass> {
         return std::make_unique<UnshardPass>(
             args.Text("arrangement") == "backward-first"
                 ? UnshardPass::Arrangement::kBackwardFirst
                 : UnshardPass::Arrangement::kSpread);
       }},
      {"offload-unshard-search",
       "plan offload-lend through the final prefetch for several lend levels "
       "and unshard arrangements, keeping the fastest plan (never slower "
       "than the fixed order)",
       {},
       Plain<OffloadUnshardSearchPass>()},
      {"offload",
       "move just enough optimizer state to the host tier for the plan to "
       "fit, copies overlapped with compute",
       {},
       Plain<OffloadPass>(OffloadPass::Role::kFit)},
      {"offload-lend",
       "on a communication-bound plan, lend every optimizer state's memory to "
       "unshard between forward and backward",
       {},
       Plain<OffloadPass>(OffloadPass::Role::kLend)},
      {"offload-all",
       "move every param's optimizer states to the host tier whatever the "
       "budget (ZeRO-Offload's policy), copied out after the first node and "
       "back during backward as offload-lend does",
       {},
       [](const PassArgs&) -> std::unique_ptr<PlanningPass> {
         return std::make_unique<OffloadPass>(
             OffloadPass::Role::kLend,
             OffloadPass::LendOptions{/*fraction=*/1,
                                      /*only_when_it_pays=*/false});
       }},
      {"offload-return",
       "after unshard, take back the lent states it did not need",
       {},
       Plain<OffloadPass>(OffloadPass::Role::kReturn)},
      {"micro-batch-reduce",
       "with grad_accum > 1 and a plan over budget: reduce-scatter the "
       "fewest gradients every micro-batch (into sharded accumulators) that "
       "make it fit, most bytes saved per extra link second first",
       {},
       Plain<GradientReductionPass>(GradientReductionPass::Role::kFit)},
      {"micro-batch-reduce-lend",
       "with grad_accum > 1 on a communication-bound plan: reduce every "
       "gradient per micro-batch, lending its memory to unshard",
       {},
       Plain<GradientReductionPass>(GradientReductionPass::Role::kLend)},
      {"micro-batch-reduce-return",
       "after unshard: accumulate the gradients that still fit unsharded and "
       "reduce them once, most link seconds saved per byte first",
       {},
       Plain<GradientReductionPass>(GradientReductionPass::Role::kReturn)},
      {"zero1",
       "ZeRO-1: params replicated, gradients reduce-scattered in buckets "
       "during backward, updated params all-gathered after the optimizer",
       {Bytes("bucket_bytes", Zero1Pass::kDefaultBucketBytes,
              "gradient bytes per reduce-scatter bucket")},
       [](const PassArgs& args) -> std::unique_ptr<PlanningPass> {
         return std::make_unique<Zero1Pass>(args.Int("bucket_bytes"));
       }},
      // The reference policies' passes (coordinator/policies).
      {"deepspeed-persistence",
       "DeepSpeed: params below a size stay gathered (persistent)",
       {Count("threshold_numel",
              DeepSpeedPersistencePass::kDefaultThresholdNumel,
              "stage3_param_persistence_threshold, elements")},
       [](const PassArgs& args) -> std::unique_ptr<PlanningPass> {
         return std::make_unique<DeepSpeedPersistencePass>(
             args.Int("threshold_numel"));
       }},
      {"split-groups",
       "gather param by param, as DeepSpeed and DeepCompile do",
       {},
       Plain<SplitGatherGroupsPass>()},
      {"deepspeed-prefetch",
       "DeepSpeed: prefetch buckets of the next params in trace order",
       {Count("bucket_numel", DeepSpeedPrefetchPass::kDefaultBucketNumel,
              "stage3_prefetch_bucket_size, elements"),
        Count("max_live_numel", DeepSpeedPrefetchPass::kDefaultMaxLiveNumel,
              "stage3_max_live_parameters, elements"),
        Count("max_reuse_numel", DeepSpeedPrefetchPass::kDefaultMaxReuseNumel,
              "stage3_max_reuse_distance, elements")},
       [](const PassArgs& args) -> std::unique_ptr<PlanningPass> {
         return std::make_unique<DeepSpeedPrefetchPass>(
             args.Int("bucket_numel"), args.Int("max_live_numel"),
             args.Int("max_reuse_numel"));
       }},
      {"fsdp-prefetch",
       "FSDP: backward prefetch one unit ahead, at most a few units gathered",
       {Count("max_gathered_units", FsdpPrefetchPass::kDefaultMaxGatheredUnits,
              "units gathered at once (FSDP's rate limiter)")},
       [](const PassArgs& args) -> std::unique_ptr<PlanningPass> {
         return std::make_unique<FsdpPrefetchPass>(
             static_cast<int>(args.Int("max_gathered_units")));
       }},
      {"memory-only-offload",
       "DeepCompile: offload optimizer states by memory alone",
       {},
       Plain<MemoryOnlyOffloadPass>()},
      {"greedy-prefetch",
       "DeepCompile: prefetch as early as memory allows",
       {},
       Plain<GreedyPrefetchPass>()},
      {"greedy-unshard",
       "DeepCompile: unshard by gather time per byte, stopping at the first "
       "misfit",
       {},
       Plain<GreedyUnshardPass>()},
  };
}

const PassRegistry& PassRegistry::Default() {
  static const PassRegistry* const kRegistry = new PassRegistry();
  return *kRegistry;
}

const RegisteredPass* PassRegistry::Find(absl::string_view name) const {
  for (const RegisteredPass& pass : passes_) {
    if (pass.name == name) return &pass;
  }
  return nullptr;
}

std::vector<std::string> PassRegistry::Names() const {
  std::vector<std::string> names;
  for (const RegisteredPass& pass : passes_) names.push_back(pass.name);
  return names;
}

absl::StatusOr<std::pair<const RegisteredPass*, PassArgs>> PassRegistry::Parse(
    absl::string_view spec) const {
  const std::pair<absl::string_view, absl::string_view> parts =
      absl::StrSplit(spec, absl::MaxSplits(':', 1));
  const absl::string_view name = absl::StripAsciiWhitespace(parts.first);
  const RegisteredPass* pass = Find(name);
  if (pass == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' is not a pass; use one of ",
                     absl::StrJoin(Names(), ", ")));
  }
  PassArgs args;
  for (const PassParam& param : pass->params) {
    args.text_[param.key] = param.default_value;
  }
  for (absl::string_view item :
       absl::StrSplit(parts.second, ',', absl::SkipWhitespace())) {
    const std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    const absl::string_view key = absl::StripAsciiWhitespace(kv.first);
    const absl::string_view value = absl::StripAsciiWhitespace(kv.second);
    auto it = args.text_.find(key);
    if (it == args.text_.end()) {
      std::vector<std::string> keys;
      for (const PassParam& p : pass->params) keys.push_back(p.key);
      return absl::InvalidArgumentError(absl::StrCat(
          "pass ", pass->name, " has no parameter '", key, "'",
          keys.empty() ? "; it takes none"
                       : absl::StrCat("; use ", absl::StrJoin(keys, ", "))));
    }
    if (value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pass ", pass->name, ": ", key, " needs a value (", key, "=...)"));
    }
    it->second = std::string(value);
  }
  for (const PassParam& param : pass->params) {
    const std::string& value = args.text_[param.key];
    const std::string where =
        absl::StrCat("pass ", pass->name, ": ", param.key);
    switch (param.kind) {
      case PassParam::Kind::kCount: {
        int64_t n = 0;
        if (!absl::SimpleAtoi(value, &n) || n < 1) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "='", value, "': expected an integer >= 1"));
        }
        args.ints_[param.key] = n;
        break;
      }
      case PassParam::Kind::kBytes: {
        ASSIGN_OR_RETURN(args.ints_[param.key], ParseByteCount(value, where));
        break;
      }
      case PassParam::Kind::kChoice: {
        bool known = false;
        for (const std::string& c : param.choices) known = known || c == value;
        if (!known) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "='", value, "': expected one of ",
                           absl::StrJoin(param.choices, ", ")));
        }
        break;
      }
    }
  }
  return std::make_pair(pass, std::move(args));
}

absl::StatusOr<std::unique_ptr<PlanningPass>> PassRegistry::Make(
    absl::string_view spec) const {
  ASSIGN_OR_RETURN(auto parsed, Parse(spec));
  return parsed.first->make(parsed.second);
}

absl::Status PassRegistry::Check(absl::string_view spec) const {
  return Parse(spec).status();
}

absl::Status PassRegistry::AddTo(absl::Span<const std::string> specs,
                                 PassPipeline& pipeline) const {
  for (const std::string& spec : specs) {
    ASSIGN_OR_RETURN(std::unique_ptr<PlanningPass> pass, Make(spec));
    pipeline.AddPass(std::move(pass));
  }
  return absl::OkStatus();
}

std::string PassRegistry::Describe() const {
  std::string out;
  for (const RegisteredPass& pass : passes_) {
    absl::StrAppend(&out, "  ", pass.name, "\n      ", pass.summary, "\n");
    for (const PassParam& p : pass.params) {
      absl::StrAppend(
          &out, "      ", p.key, "=", p.default_value, "  ", p.help,
          p.choices.empty()
              ? ""
              : absl::StrCat(" (", absl::StrJoin(p.choices, "|"), ")"),
          "\n");
    }
  }
  return out;
}

}  // namespace tandem
