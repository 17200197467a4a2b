#include "common/job/job_spec.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/archive/model_archive.h"
#include "common/archive/tensor_data.h"
#include "common/archive/weights_file.h"
#include "common/did_you_mean.h"
#include "common/ir/proto_convert.h"
#include "common/job/lr_schedule.h"
#include "common/models/hf_names.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

constexpr size_t kMaxListed = 8;
constexpr int32_t kMaxWorldSize = 4096;

bool IsNamedPreset(const std::string& preset) {
  return preset != "llama" && preset != "moe" && ModelPreset(preset).ok();
}

class FieldErrors {
 public:
  template <typename... Args>
  void Add(const Args&... args) {
    if (items_.size() < kMaxListed) items_.push_back(absl::StrCat(args...));
    ++count_;
  }
  absl::Status ToStatus() const {
    if (count_ == 0) return absl::OkStatus();
    std::string msg =
        absl::StrCat("invalid job spec: ", absl::StrJoin(items_, "; "));
    if (count_ > items_.size()) {
      absl::StrAppend(&msg, "; and ", count_ - items_.size(), " more");
    }
    return absl::InvalidArgumentError(msg);
  }

 private:
  std::vector<std::string> items_;
  size_t count_ = 0;
};

template <typename T>
void AtLeast(FieldErrors& errors, const char* path, T value, T min) {
  if (value < min) errors.Add(path, " must be >= ", min, ", got ", value);
}

template <typename T>
void AtMost(FieldErrors& errors, const char* path, T value, T max,
            const char* why) {
  if (value > max) {
    errors.Add(path, " must be <= ", max, " (", why, "), got ", value);
  }
}

// Why a job may not use `path`, or nullopt. A job reads its data and
// weights and writes its checkpoints; none of them lives among the
// machine's system files, and `writes` also keeps it out of the system's
// program and library trees. Judged on the path as written, made lexically
// normal ("/tmp/../etc" is /etc); a relative path is the worker's business.
std::optional<std::string> SystemPathReason(const std::string& path,
                                            bool writes) {
  if (path.empty() || path[0] != '/') return std::nullopt;
  const std::string normal =
      std::filesystem::path(path).lexically_normal().generic_string();
  static constexpr const char* kNeverRead[] = {"/etc", "/proc", "/sys",
                                               "/dev", "/boot", "/run"};
  static constexpr const char* kNeverWritten[] = {
      "/bin", "/sbin", "/lib", "/lib64", "/usr", "/var/lib"};
  auto under = [&normal](absl::string_view dir) {
    return normal == dir || absl::StartsWith(normal, absl::StrCat(dir, "/"));
  };
  if (normal == "/") return std::string("the root directory");
  for (const char* dir : kNeverRead) {
    if (under(dir)) return absl::StrCat("under ", dir, ", a system directory");
  }
  if (writes) {
    for (const char* dir : kNeverWritten) {
      if (under(dir))
        return absl::StrCat("under ", dir, ", a system directory");
    }
  }
  return std::nullopt;
}

void CheckJobPath(FieldErrors& errors, const char* field,
                  const std::string& path, bool writes) {
  if (std::optional<std::string> why = SystemPathReason(path, writes)) {
    errors.Add(field, " '", path, "' is ", *why, "; point it at the job's ",
               writes ? "own directory (e.g. /shared/ckpt/my-run)"
                      : "own files (e.g. /shared/data/...)");
  }
}

// train.lr_schedule, warmup_steps and min_lr (common/job/lr_schedule.h).
void ValidateLrSchedule(const v1::TrainSpec& t, FieldErrors& errors) {
  const std::string& kind = t.lr_schedule();
  if (std::find(kLrScheduleNames.begin(), kLrScheduleNames.end(), kind) ==
      kLrScheduleNames.end()) {
    errors.Add("train.lr_schedule must be one of ",
               absl::StrJoin(kLrScheduleNames, ", "), ", got '", kind, "'");
  }
  if (t.warmup_steps() < 0) {
    errors.Add("train.warmup_steps must be >= 0 (0: no warm-up), got ",
               t.warmup_steps());
  } else if (t.steps() >= 1 && t.warmup_steps() >= t.steps()) {
    errors.Add("train.warmup_steps must be < train.steps (", t.steps(),
               ") so that the run reaches train.lr, got ", t.warmup_steps());
  }
  if (!(std::isfinite(t.min_lr()) && t.min_lr() >= 0)) {
    errors.Add("train.min_lr must be >= 0, got ", t.min_lr());
  } else if (kind == "constant" && t.min_lr() != 0) {
    errors.Add(
        "train.min_lr is the floor of a decaying schedule, unused by "
        "train.lr_schedule constant: set lr_schedule to cosine or "
        "linear, or remove min_lr (got ",
        t.min_lr(), ")");
  } else if (t.lr() > 0 && t.min_lr() > t.lr()) {
    errors.Add("train.min_lr must be <= train.lr (", t.lr(),
               "), the peak it decays from, got ", t.min_lr());
  }
}

// data.kind tensors: the file at data.path (OpenTensorDataFile) holds an
// array for every input of the archive, with its dtype and fixed dims.
void ValidateTensorData(const v1::JobSpec& spec,
                        const v1::ArchiveManifest& manifest,
                        FieldErrors& errors) {
  absl::StatusOr<TensorDataFile> file = OpenTensorDataFile(spec.data().path());
  if (!file.ok()) {
    errors.Add("data.path: ", file.status().message());
    return;
  }
  const std::vector<v1::ArchiveInput> inputs(manifest.inputs().begin(),
                                             manifest.inputs().end());
  for (const std::string& problem : TensorDataProblems(*file, inputs)) {
    errors.Add("data.path: ", problem);
  }
}

// model.init_from: a weight file holding exactly `params`.
void ValidateInitFrom(const std::string& path,
                      absl::Span<const WeightTensor> params,
                      FieldErrors& errors) {
  if (path.empty()) return;
  absl::StatusOr<SafetensorsFile> file = OpenSafetensorsFile(
      path, "point it at a weights file (tandem export-weights -o FILE)",
      "write it with safetensors or tandem export-weights");
  if (!file.ok()) {
    errors.Add("model.init_from: ", file.status().message());
    return;
  }
  absl::StatusOr<std::vector<std::vector<WeightPiece>>> matched =
      MatchWeights(file->header, params, absl::StrCat("'", path, "'"));
  if (!matched.ok()) {
    errors.Add("model.init_from: ", matched.status().message());
  }
}

// model.dtype bf16 for an archive: the exporter ran its units in bf16
// (ArchiveManifest.precision_checks) and they worked. f32 always runs;
// ValidatePrecision reports the dtypes no model runs in.
void ValidateArchivePrecision(const v1::ModelSpec& m,
                              const v1::ArchiveManifest& manifest,
                              FieldErrors& errors) {
  if (m.dtype() != v1::DTYPE_BF16) return;
  const std::string torch_name = "bfloat16";
  for (const v1::ArchivePrecisionCheck& check : manifest.precision_checks()) {
    if (check.dtype() != torch_name) continue;
    if (!check.error().empty()) {
      errors.Add("model.dtype bf16: the model does not run in bfloat16 ('",
                 m.path(), "' was checked at export: ", check.error(),
                 "); make its forward follow its params' dtype, or use f32");
    }
    return;
  }
  errors.Add("model.dtype bf16: '", m.path(),
             "' was exported without a bfloat16 check (by an earlier tandem "
             "export); export the model again, or use f32");
}

// model.kind torchscript: no builtin fields, and an archive that reads
// (ReadArchiveManifest) and that the data source can feed: the token
// sources feed inputs of roles tokens and targets, data.kind tensors every
// input by name, and data.kind synthetic the others from their archive's
// synthetic description.
void ValidateArchiveModel(const v1::JobSpec& spec, FieldErrors& errors) {
  const v1::ModelSpec& m = spec.model();
  const std::pair<const char*, bool> builtin_fields[] = {
      {"preset", !m.preset().empty()}, {"layers", m.layers() != 0},
      {"d_model", m.d_model() != 0},   {"heads", m.heads() != 0},
      {"kv_heads", m.kv_heads() != 0}, {"ffn", m.ffn() != 0},
      {"experts", m.experts() != 0},   {"top_k", m.top_k() != 0}};
  for (const auto& [field, set] : builtin_fields) {
    if (set) {
      errors.Add("model.", field,
                 " is a builtin model field; a torchscript model's shapes "
                 "come from its archive: remove it");
    }
  }
  if (m.path().empty()) {
    errors.Add(
        "model.path must name the archive (tandem export -o FILE) "
        "when model.kind is torchscript");
    return;
  }
  absl::StatusOr<v1::ArchiveManifest> manifest = ReadArchiveManifest(m.path());
  if (!manifest.ok()) {
    errors.Add("model.path: ", manifest.status().message());
    return;
  }
  ValidateInitFrom(m.init_from(), ArchiveWeightTensors(*manifest), errors);
  ValidateArchivePrecision(m, *manifest, errors);
  if (spec.data().kind() == "tensors") {
    if (!spec.data().path().empty()) {
      ValidateTensorData(spec, *manifest, errors);
    }
    return;
  }
  if (spec.data().kind() == "synthetic") {
    // Inputs of no role are drawn from their archive's description; those
    // of a role from the token stream, which needs a vocabulary and a length.
    const std::vector<v1::ArchiveInput> inputs(manifest->inputs().begin(),
                                               manifest->inputs().end());
    for (const std::string& problem : SyntheticDataProblems(inputs)) {
      errors.Add("model.path: ", problem);
    }
    if (std::any_of(
            inputs.begin(), inputs.end(),
            [](const v1::ArchiveInput& in) { return !in.role().empty(); })) {
      AtLeast(errors, "model.vocab", m.vocab(), 2);
      AtLeast(errors, "batch.seq_len", spec.batch().seq_len(), 1);
    }
  }
  for (const v1::ArchiveInput& in : manifest->inputs()) {
    if (in.role().empty()) {
      if (spec.data().kind() != "synthetic") {
        errors.Add("model.path: the model takes input '", in.name(),
                   "', which data.kind ", spec.data().kind(),
                   " cannot feed (it feeds the roles tokens and targets); "
                   "use data.kind tensors or synthetic");
      }
      continue;
    }
    const bool dynamic_seq = DynamicDim1(in);
    if (in.shape_size() != 2) {
      errors.Add("model.path: input '", in.name(), "' (role ", in.role(),
                 ") has ", in.shape_size(),
                 " dimensions; token data sources feed [micro_batch, "
                 "seq_len]");
    } else if (!dynamic_seq && in.shape(1) != spec.batch().seq_len()) {
      errors.Add("batch.seq_len must be ", in.shape(1), " for input '",
                 in.name(),
                 "', whose sequence dimension the archive fixes, got ",
                 spec.batch().seq_len());
    }
  }
}

// train.loss_scale: GradScaler's arguments, as its constructor checks them.
// Unset fields take their defaults (ApplyJobSpecDefaults).
void ValidateLossScale(const v1::JobSpec& spec, FieldErrors& errors) {
  const v1::LossScaleSpec& ls = spec.train().loss_scale();
  const std::string mode = !ls.mode().empty()                      ? ls.mode()
                           : spec.model().dtype() == v1::DTYPE_F16 ? "dynamic"
                                                                   : "none";
  if (mode != "dynamic" && mode != "none") {
    errors.Add("train.loss_scale.mode must be dynamic or none, got '", mode,
               "'",
               DidYouMean(mode, std::vector<std::string>{"dynamic", "none"}));
    return;
  }
  if (mode == "none") {
    if (ls.init_scale() != 0 || ls.growth_factor() != 0 ||
        ls.backoff_factor() != 0 || ls.growth_interval() != 0) {
      errors.Add(
          "train.loss_scale sets init_scale, growth_factor, backoff_factor "
          "or growth_interval, but its mode is none: remove them, or set "
          "mode: dynamic");
    }
    return;
  }
  if (ls.init_scale() != 0 &&
      !(std::isfinite(ls.init_scale()) && ls.init_scale() > 0 &&
        ls.init_scale() <= 3.0e38)) {
    errors.Add(
        "train.loss_scale.init_scale must be a positive fp32 value (0: "
        "GradScaler's 65536), got ",
        ls.init_scale());
  }
  if (ls.growth_factor() != 0 &&
      !(std::isfinite(ls.growth_factor()) && ls.growth_factor() > 1)) {
    errors.Add("train.loss_scale.growth_factor must be > 1 (0: 2), got ",
               ls.growth_factor());
  }
  if (ls.backoff_factor() != 0 &&
      !(ls.backoff_factor() > 0 && ls.backoff_factor() < 1)) {
    errors.Add(
        "train.loss_scale.backoff_factor must be in (0, 1) (0: 0.5), "
        "got ",
        ls.backoff_factor());
  }
  AtLeast(errors, "train.loss_scale.growth_interval", ls.growth_interval(), 0);
}

// A proto dtype the graph knows (f32, bf16, f16); nullopt for unspecified
// or an unknown number.
std::optional<DType> KnownDType(v1::DType d) {
  absl::StatusOr<DType> known = FromProtoDType(d, "");
  if (!known.ok()) return std::nullopt;
  return *known;
}

// model.dtype, train.master_dtype and train.reduce_dtype: params gathered
// and computed in model.dtype, master weights and Adam moments kept in f32
// in the shards, gradients reduce-scattered in train.reduce_dtype.
void ValidatePrecision(const v1::JobSpec& spec, FieldErrors& errors) {
  const v1::ModelSpec& m = spec.model();
  const v1::TrainSpec& t = spec.train();
  const std::optional<DType> model = KnownDType(m.dtype());
  if (!model.has_value()) {
    errors.Add("model.dtype must be f32, bf16 or f16, got ",
               static_cast<int>(m.dtype()));
  } else if (*model == DType::kF16) {
    // f16 has CUDA kernels only (CPU libtorch has almost none); where the
    // hardware is not declared the ranks' devices are checked when they
    // register (CheckRankDevice).
    if (spec.hardware().device() == "cpu") {
      errors.Add(
          "model.dtype f16 needs CUDA devices, but hardware.device is cpu, "
          "where libtorch has no f16 kernels: use bf16 (the same memory, "
          "f32's exponent range), or run the ranks on GPUs");
    }
    if (m.kind() == "torchscript") {
      errors.Add(
          "model.dtype f16 is for built-in models; an exported model runs in "
          "f32 or bf16");
    }
  }
  ValidateLossScale(spec, errors);

  if (t.master_dtype() != v1::DTYPE_F32 &&
      t.master_dtype() != v1::DTYPE_UNSPECIFIED) {
    const std::optional<DType> master = KnownDType(t.master_dtype());
    errors.Add("train.master_dtype must be f32, got ",
               master.has_value()
                   ? std::string(DTypeName(*master))
                   : absl::StrCat(static_cast<int>(t.master_dtype())),
               ": the shards keep the master weights and Adam moments in f32 "
               "whatever model.dtype is; write f32 or remove it");
  }

  // Equal to model.dtype (the default) is always accepted; an unknown
  // model.dtype is reported above.
  if (t.reduce_dtype() == v1::DTYPE_UNSPECIFIED ||
      t.reduce_dtype() == m.dtype()) {
    return;
  }
  const std::optional<DType> reduce = KnownDType(t.reduce_dtype());
  if (!reduce.has_value()) {
    errors.Add("train.reduce_dtype must be f32, bf16 or f16, got ",
               static_cast<int>(t.reduce_dtype()));
  } else if (model.has_value() && *reduce != DType::kF32) {
    const absl::string_view r = DTypeName(*reduce);
    const absl::string_view d = DTypeName(*model);
    if (*model == DType::kF32) {
      errors.Add("train.reduce_dtype ", r,
                 " would round the f32 gradients of model.dtype f32: use f32",
                 *reduce == DType::kBF16 ? ", or set model.dtype bf16" : "");
    } else {
      errors.Add("train.reduce_dtype ", r, " must be f32 or model.dtype (", d,
                 "), the dtype the gradients are computed in: use f32 or ", d);
    }
  }
}

}  // namespace

void ApplyJobSpecDefaults(v1::JobSpec& spec) {
  v1::ModelSpec& m = *spec.mutable_model();
  if (m.kind().empty()) m.set_kind("builtin");
  if (m.preset().empty() && m.kind() == "builtin") m.set_preset("llama");
  if (IsNamedPreset(m.preset())) {
    const ModelConfig p = *ModelPreset(m.preset());
    if (m.layers() == 0) m.set_layers(p.layers);
    if (m.d_model() == 0) m.set_d_model(p.d_model);
    if (m.heads() == 0) m.set_heads(p.heads);
    if (m.kv_heads() == 0) m.set_kv_heads(p.kv_heads);
    if (m.ffn() == 0) m.set_ffn(p.ffn);
    if (m.vocab() == 0) m.set_vocab(p.vocab);
    if (m.experts() == 0) m.set_experts(p.experts);
    if (m.top_k() == 0) m.set_top_k(p.top_k);
  }
  if (m.kv_heads() == 0) m.set_kv_heads(m.heads());
  if (m.dtype() == v1::DTYPE_UNSPECIFIED) m.set_dtype(v1::DTYPE_F32);

  v1::DataSpec& d = *spec.mutable_data();
  if (d.kind().empty()) d.set_kind("synthetic");
  if (d.token_bytes() == 0) d.set_token_bytes(2);

  v1::BatchSpec& b = *spec.mutable_batch();
  if (b.grad_accum() == 0) b.set_grad_accum(1);

  v1::TrainSpec& t = *spec.mutable_train();
  if (t.lr() == 0) t.set_lr(1e-3);
  if (t.lr_schedule().empty()) t.set_lr_schedule("constant");
  if (t.on_nonfinite().empty()) t.set_on_nonfinite("stop");
  if (t.beta1() == 0) t.set_beta1(0.9);
  if (t.beta2() == 0) t.set_beta2(0.95);
  if (t.eps() == 0) t.set_eps(1e-8);
  if (!t.has_grad_clip()) t.set_grad_clip(1.0);  // an explicit 0 disables it
  if (t.master_dtype() == v1::DTYPE_UNSPECIFIED) {
    t.set_master_dtype(v1::DTYPE_F32);
  }
  // After model.dtype's own default.
  if (t.reduce_dtype() == v1::DTYPE_UNSPECIFIED) t.set_reduce_dtype(m.dtype());
  // Dynamic loss scaling under f16, with GradScaler's defaults.
  v1::LossScaleSpec& ls = *t.mutable_loss_scale();
  if (ls.mode().empty()) {
    ls.set_mode(m.dtype() == v1::DTYPE_F16 ? "dynamic" : "none");
  }
  if (ls.mode() == "dynamic") {
    if (ls.init_scale() == 0) ls.set_init_scale(65536.0);
    if (ls.growth_factor() == 0) ls.set_growth_factor(2.0);
    if (ls.backoff_factor() == 0) ls.set_backoff_factor(0.5);
    if (ls.growth_interval() == 0) ls.set_growth_interval(2000);
  }

  v1::ParallelSpec& par = *spec.mutable_parallel();
  if (par.world_size() == 0) par.set_world_size(1);
  if (par.zero_stage() == 0) par.set_zero_stage(3);

  v1::OptimizeSpec& o = *spec.mutable_optimize();
  // The pipeline the benchmarks measure, unless the job names its own.
  if (o.passes().empty() && o.policy().empty()) o.set_policy("tandem");
  // Five: the first plan is priced from these steps, and the median of
  // three moved 5-7% from window to window on a shared machine, which put
  // a first plan 10.6% off (bench/README.md, e2e, 2026-11-29f).
  if (o.warmup_steps() == 0) o.set_warmup_steps(5);
  if (o.drift_threshold() == 0) o.set_drift_threshold(0.1);
  if (o.drift_window() == 0) o.set_drift_window(5);
  if (!o.has_trial_margin()) o.set_trial_margin(kDefaultTrialMargin);
  if (!o.has_min_gain()) o.set_min_gain(kDefaultMinGain);
  if (!o.has_baseline_pairs()) o.set_baseline_pairs(kDefaultBaselinePairs);

  // comm.chunk_bytes stays 0: automatic.
  v1::CommSpec& comm = *spec.mutable_comm();
  if (comm.max_in_flight() == 0) {
    comm.set_max_in_flight(kDefaultCommMaxInFlight);
  }
}

absl::StatusOr<v1::JobSpec> ResolveJobPaths(v1::JobSpec spec) {
  FieldErrors errors;
  auto resolve = [&errors](const char* field, std::string* path, bool writes) {
    if (path->empty()) return;
    std::error_code ec;
    // Symlinks resolved along the part that exists; the rest (a checkpoint
    // directory not made yet, a file not there) taken as written.
    const std::filesystem::path real =
        std::filesystem::weakly_canonical(*path, ec);
    if (ec) {
      errors.Add(field, " '", path->substr(0, 256),
                 "' cannot be resolved: ", ec.message());
      return;
    }
    const std::string resolved = real.generic_string();
    if (std::optional<std::string> why = SystemPathReason(resolved, writes)) {
      errors.Add(field, " '", path->substr(0, 256), "' resolves to '",
                 resolved.substr(0, 256), "', ", *why,
                 "; point it at the job's ",
                 writes ? "own directory" : "own files");
      return;
    }
    *path = resolved;
  };
  resolve("data.path", spec.mutable_data()->mutable_path(), false);
  resolve("model.path", spec.mutable_model()->mutable_path(), false);
  resolve("model.init_from", spec.mutable_model()->mutable_init_from(), false);
  resolve("checkpoint.dir", spec.mutable_checkpoint()->mutable_dir(), true);
  RETURN_IF_ERROR(errors.ToStatus());
  return spec;
}

absl::Status CheckJobPathRoots(const v1::JobSpec& spec,
                               const JobPathRoots& roots) {
  FieldErrors errors;
  // The root (lexically normal) that holds `normal`, if any.
  auto root_of =
      [](const std::string& normal,
         const std::vector<std::string>& dirs) -> std::optional<std::string> {
    for (const std::string& dir : dirs) {
      std::string root =
          std::filesystem::path(dir).lexically_normal().generic_string();
      while (root.size() > 1 && root.back() == '/') root.pop_back();
      if (normal == root || root == "/" ||
          absl::StartsWith(normal, absl::StrCat(root, "/"))) {
        return root;
      }
    }
    return std::nullopt;
  };
  auto check = [&](const char* field, const std::string& path, bool writes) {
    if (path.empty()) return;
    const std::vector<std::string>& own = writes ? roots.write : roots.read;
    std::vector<std::string> allowed = own;
    if (!writes) {
      allowed.insert(allowed.end(), roots.write.begin(), roots.write.end());
    }
    const char* kind = writes ? "checkpoint" : "data";
    const std::string listed = absl::StrJoin(allowed, ", ");
    // Whatever the client sent: a relative path resolves against some
    // process's directory (the coordinator's when it checks the spec, the
    // worker's when it runs), and ".." walks out of any directory checked.
    if (path[0] != '/') {
      errors.Add(field, " '", path.substr(0, 256),
                 "' is relative, which depends on the worker's directory: "
                 "give an absolute path",
                 own.empty() ? std::string()
                             : absl::StrCat(" under a ", kind,
                                            " root this coordinator allows (",
                                            listed, ")"));
      return;
    }
    for (const auto& part : std::filesystem::path(path)) {
      if (part == "..") {
        errors.Add(field, " '", path.substr(0, 256),
                   "' contains '..': give the path without it");
        return;
      }
    }
    if (own.empty()) return;
    const std::string normal =
        std::filesystem::path(path).lexically_normal().generic_string();
    const std::optional<std::string> root = root_of(normal, allowed);
    if (!root.has_value()) {
      errors.Add(field, " '", path.substr(0, 256), "' is not under a ", kind,
                 " root this coordinator allows (", listed,
                 "); move the files there or ask the operator to add a "
                 "root (--",
                 writes ? "checkpoint" : "data", "-roots)");
      return;
    }
    // A root this host sees is seen as the workers see it (a shared file
    // system): what a job reads must be there now, not fail when its
    // workers start, and no symbolic link may lead out of the roots.
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::is_directory(*root, ec)) return;
    if (!fs::exists(normal, ec)) {
      if (!writes) {
        errors.Add(field, " '", path.substr(0, 256),
                   "' does not exist (this coordinator sees the ", kind,
                   " root ", *root,
                   " as the workers do); check the path, or write the files "
                   "before submitting");
      }
      return;
    }
    const std::string real = fs::canonical(normal, ec).generic_string();
    if (ec) return;
    bool inside = false;
    for (const std::string& dir : allowed) {
      std::error_code dir_ec;
      const std::string real_root =
          fs::weakly_canonical(dir, dir_ec).generic_string();
      if (!dir_ec && root_of(real, {real_root}).has_value()) inside = true;
    }
    if (!inside) {
      errors.Add(field, " '", path.substr(0, 256), "' leads out of the ", kind,
                 " roots (", listed, ") through a symbolic link, to '",
                 real.substr(0, 256),
                 "'; give the path of the files themselves under a root");
    }
  };
  check("data.path", spec.data().path(), /*writes=*/false);
  check("model.path", spec.model().path(), /*writes=*/false);
  check("model.init_from", spec.model().init_from(), /*writes=*/false);
  check("checkpoint.dir", spec.checkpoint().dir(), /*writes=*/true);
  return errors.ToStatus();
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec,
                             const PlanSpecCheck& plan_check) {
  FieldErrors errors;
  if (spec.name().empty()) {
    errors.Add("name must be set (letters, digits, '.', '_' or '-')");
  } else if (spec.name().size() > 128 ||
             spec.name().find_first_not_of(
                 "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                 "0123456789._-") != std::string::npos) {
    errors.Add("name '", spec.name().substr(0, 64),
               "' may hold only letters, digits, '.', '_' and '-' (at most "
               "128)");
  }

  const v1::ModelSpec& m = spec.model();
  const bool torchscript = m.kind() == "torchscript";
  const bool builtin = m.kind() == "builtin";
  // An unknown preset filled no sizes: their errors would only follow from
  // it, so they are left out.
  const bool sized = builtin && (m.preset() == "llama" || m.preset() == "moe" ||
                                 IsNamedPreset(m.preset()));
  if (!builtin && !torchscript) {
    errors.Add("model.kind must be builtin or torchscript, got '", m.kind(),
               "'",
               DidYouMean(m.kind(),
                          std::vector<std::string>{"builtin", "torchscript"}));
  } else if (torchscript) {
    ValidateArchiveModel(spec, errors);
  } else {
    if (!m.path().empty()) {
      errors.Add(
          "model.path is for model.kind torchscript; a builtin model "
          "takes model.preset and sizes");
    }
    if (!sized) {
      std::vector<std::string> presets = ModelPresetNames();
      presets.insert(presets.begin(), {"llama", "moe"});
      errors.Add("model.preset must be llama, moe or one of ",
                 absl::StrJoin(ModelPresetNames(), ", "), ", got '", m.preset(),
                 "'", DidYouMean(m.preset(), presets));
    }
  }
  if (sized) {
    AtLeast(errors, "model.layers", m.layers(), 1);
    AtLeast(errors, "model.d_model", m.d_model(), 1);
    AtLeast(errors, "model.heads", m.heads(), 1);
    AtLeast(errors, "model.kv_heads", m.kv_heads(), 1);
    AtLeast(errors, "model.ffn", m.ffn(), 1);
    // Far above any real model, far below what overflows the sizes the
    // graph and the worker compute from them.
    AtMost(errors, "model.layers", m.layers(), 4096, "real models have < 200");
    AtMost(errors, "model.d_model", m.d_model(), 1 << 17,
           "real models have <= 16384");
    AtMost(errors, "model.heads", m.heads(), 4096, "real models have <= 128");
    AtMost(errors, "model.kv_heads", m.kv_heads(), 4096,
           "real models have <= 128");
    AtMost(errors, "model.ffn", m.ffn(), 1 << 20, "real models have < 65536");
  }
  const v1::DataSpec& d = spec.data();
  const bool tensors = d.kind() == "tensors";
  // The tensors source reads no token ids: model.vocab and batch.seq_len
  // are unused there. Nor does the synthetic source for an archive without
  // inputs of a role: ValidateArchiveModel checks them when it has some.
  const bool tokens_read =
      !tensors && !(torchscript && d.kind() == "synthetic");
  if (tokens_read && (sized || torchscript)) {
    AtLeast(errors, "model.vocab", m.vocab(), 2);
    AtMost(errors, "model.vocab", m.vocab(), 1 << 24,
           "the largest real vocabularies are about 256k tokens");
  }
  CheckJobPath(errors, "data.path", d.path(), /*writes=*/false);
  CheckJobPath(errors, "model.path", m.path(), /*writes=*/false);
  CheckJobPath(errors, "model.init_from", m.init_from(), /*writes=*/false);

  if (d.kind() != "synthetic" && d.kind() != "tokens" && !tensors) {
    errors.Add(
        "data.kind must be synthetic, tokens or tensors, got '", d.kind(), "'",
        DidYouMean(d.kind(),
                   std::vector<std::string>{"synthetic", "tokens", "tensors"}));
  }
  if (d.kind() == "tokens" && d.path().empty()) {
    errors.Add("data.path must name the token file when data.kind is tokens");
  }
  if (tensors && d.path().empty()) {
    errors.Add(
        "data.path must name the safetensors file of named arrays when "
        "data.kind is tensors");
  }
  if (tensors && !torchscript) {
    errors.Add(
        "data.kind tensors feeds the named inputs of an exported model "
        "(model.kind torchscript); a builtin model reads tokens: use "
        "data.kind synthetic or tokens");
  }
  if (d.token_bytes() != 2 && d.token_bytes() != 4) {
    errors.Add("data.token_bytes must be 2 (uint16) or 4 (uint32), got ",
               d.token_bytes());
  }

  const v1::BatchSpec& b = spec.batch();
  AtLeast(errors, "batch.micro_batch", b.micro_batch(), 1);
  AtMost(errors, "batch.micro_batch", b.micro_batch(), 1 << 16,
         "samples per rank per micro-batch");
  AtMost(errors, "batch.seq_len", b.seq_len(), 1 << 22, "tokens per sample");
  AtLeast(errors, "batch.seq_len", b.seq_len(), tokens_read ? 1 : 0);
  AtLeast(errors, "batch.grad_accum", b.grad_accum(), 1);

  const v1::TrainSpec& t = spec.train();
  AtLeast<int64_t>(errors, "train.steps", t.steps(), 1);
  if (!(std::isfinite(t.lr()) && t.lr() > 0)) {
    errors.Add("train.lr must be > 0, got ", t.lr());
  } else if (t.lr() > 10) {
    errors.Add(
        "train.lr must be <= 10 (AdamW's useful rates are far "
        "below 1), got ",
        t.lr());
  }
  ValidateLrSchedule(t, errors);
  if (!t.on_nonfinite().empty() && t.on_nonfinite() != "stop" &&
      t.on_nonfinite() != "continue") {
    errors.Add(
        "train.on_nonfinite must be stop (the default: a NaN or "
        "infinite loss fails the job) or continue, got '",
        t.on_nonfinite().substr(0, 64), "'");
  }
  if (!(std::isfinite(t.weight_decay()) && t.weight_decay() >= 0)) {
    errors.Add("train.weight_decay must be >= 0, got ", t.weight_decay());
  }
  if (!(t.beta1() >= 0 && t.beta1() < 1)) {
    errors.Add("train.beta1 must be in [0, 1), got ", t.beta1());
  }
  if (!(t.beta2() >= 0 && t.beta2() < 1)) {
    errors.Add("train.beta2 must be in [0, 1), got ", t.beta2());
  }
  if (!(std::isfinite(t.eps()) && t.eps() > 0)) {
    errors.Add("train.eps must be > 0, got ", t.eps());
  }
  if (!(std::isfinite(t.grad_clip()) && t.grad_clip() >= 0)) {
    errors.Add("train.grad_clip must be >= 0 (0 disables it), got ",
               t.grad_clip());
  }
  ValidatePrecision(spec, errors);

  const v1::ParallelSpec& par = spec.parallel();
  if (par.world_size() < 1 || par.world_size() > kMaxWorldSize) {
    errors.Add("parallel.world_size must be >= 1 and <= ", kMaxWorldSize,
               ", got ", par.world_size());
  }
  if (par.zero_stage() != 1 && par.zero_stage() != 3) {
    errors.Add("parallel.zero_stage must be 1 or 3, got ", par.zero_stage());
  }
  if (!(std::isfinite(par.start_timeout_s()) && par.start_timeout_s() >= 0 &&
        par.start_timeout_s() <= 7 * 86400)) {
    errors.Add(
        "parallel.start_timeout_s must be 0..604800 seconds (0: 900), got ",
        par.start_timeout_s());
  }
  AtLeast<int64_t>(errors, "memory.budget_bytes", spec.memory().budget_bytes(),
                   0);

  const v1::OptimizeSpec& o = spec.optimize();
  if (plan_check) {
    for (const std::string& problem : plan_check(o, par.zero_stage())) {
      errors.Add(problem);
    }
  }
  AtLeast(errors, "optimize.warmup_steps", o.warmup_steps(), 0);
  if (!(std::isfinite(o.drift_threshold()) && o.drift_threshold() > 0)) {
    errors.Add("optimize.drift_threshold must be > 0 (0.1 = 10%), got ",
               o.drift_threshold());
  }
  AtLeast(errors, "optimize.drift_window", o.drift_window(), 1);
  if (!(std::isfinite(o.trial_margin()) && o.trial_margin() >= 0 &&
        o.trial_margin() <= 1)) {
    errors.Add(
        "optimize.trial_margin must be between 0 (no trials) and 1 (0.10 = "
        "10%), got ",
        o.trial_margin());
  }
  if (!(std::isfinite(o.min_gain()) && o.min_gain() >= 0 &&
        o.min_gain() <= 0.5)) {
    errors.Add(
        "optimize.min_gain must be between 0 and 0.5 (0.03 = a trial is kept "
        "when measured at least 3% faster), got ",
        o.min_gain());
  }
  if (o.baseline_pairs() < 0 || o.baseline_pairs() > kMaxBaselinePairs) {
    errors.Add(
        "optimize.baseline_pairs must be between 0 (no interleaved "
        "baseline measurement) and ",
        kMaxBaselinePairs, " block pairs, got ", o.baseline_pairs());
  }

  const v1::HardwareSpec& hw = spec.hardware();
  AtLeast(errors, "hardware.ranks_per_node", hw.ranks_per_node(), 0);
  for (const auto& [path, value] :
       {std::pair<const char*, double>{"hardware.intra_node_gbps",
                                       hw.intra_node_gbps()},
        {"hardware.inter_node_gbps", hw.inter_node_gbps()},
        {"hardware.host_gbps", hw.host_gbps()},
        {"hardware.collective_latency_us", hw.collective_latency_us()}}) {
    if (!(std::isfinite(value) && value >= 0)) {
      errors.Add(path, " must be >= 0 (0: measured), got ", value);
    }
  }
  AtLeast<int64_t>(errors, "hardware.device_memory_bytes",
                   hw.device_memory_bytes(), 0);
  if (!hw.device().empty() && hw.device() != "cpu" && hw.device() != "cuda") {
    // "gpu" is one letter from "cpu", but means cuda.
    errors.Add(
        "hardware.device must be cpu or cuda (or left out), got '", hw.device(),
        "'",
        absl::AsciiStrToLower(hw.device()) == "gpu"
            ? std::string(" (did you mean 'cuda'?)")
            : DidYouMean(hw.device(), std::vector<std::string>{"cpu", "cuda"}));
  }
  if (hw.device_memory_bytes() > 0 &&
      spec.memory().budget_bytes() > hw.device_memory_bytes()) {
    errors.Add("memory.budget_bytes (", spec.memory().budget_bytes(),
               ") must not exceed hardware.device_memory_bytes (",
               hw.device_memory_bytes(), ")");
  }

  const v1::CheckpointSpec& c = spec.checkpoint();
  AtLeast<int64_t>(errors, "checkpoint.every", c.every(), 0);
  CheckJobPath(errors, "checkpoint.dir", c.dir(), /*writes=*/true);
  if (!c.dir().empty() && c.every() < 1) {
    errors.Add(
        "checkpoint.every must be >= 1 when checkpoint.dir is set, "
        "got ",
        c.every());
  }

  const v1::RestartSpec& restart = spec.restart();
  if (restart.max_restarts() < 0 || restart.max_restarts() > 1000) {
    errors.Add("restart.max_restarts must be 0..1000, got ",
               restart.max_restarts());
  }
  const int32_t world = spec.parallel().world_size();
  if (restart.min_world() < 0 || (world >= 1 && restart.min_world() > world)) {
    errors.Add("restart.min_world must be 1..parallel.world_size (", world,
               "), or 0 for world_size, got ", restart.min_world());
  } else if (restart.min_world() != 0 && restart.min_world() < world &&
             restart.max_restarts() == 0) {
    errors.Add("restart.min_world (", restart.min_world(),
               ") applies to restarts: set restart.max_restarts too");
  }
  if (!(std::isfinite(restart.rejoin_timeout_s()) &&
        restart.rejoin_timeout_s() >= 0 &&
        restart.rejoin_timeout_s() <= 86400)) {
    errors.Add(
        "restart.rejoin_timeout_s must be 0..86400 seconds (0: 60), "
        "got ",
        restart.rejoin_timeout_s());
  }

  const v1::CommSpec& comm = spec.comm();
  if (comm.chunk_bytes() != 0 && comm.chunk_bytes() < 4096) {
    errors.Add("comm.chunk_bytes must be 0 (automatic) or >= 4096, got ",
               comm.chunk_bytes());
  }
  if (comm.max_in_flight() != 0 &&
      (comm.max_in_flight() < 1 || comm.max_in_flight() > 64)) {
    errors.Add("comm.max_in_flight must be between 1 and 64, got ",
               comm.max_in_flight());
  }

  if (absl::Status s = errors.ToStatus(); !s.ok()) return s;
  if (torchscript) return absl::OkStatus();
  // The model's own rules (divisibility, expert counts) once fields are sane.
  ASSIGN_OR_RETURN(const ModelConfig config, ModelConfigFromJobSpec(spec));
  if (!m.init_from().empty()) {
    ASSIGN_OR_RETURN(const std::vector<WeightTensor> params,
                     BuiltinWeightTensors(config));
    ValidateInitFrom(m.init_from(), params, errors);
  }
  return errors.ToStatus();
}

void SetPrecisionFromJobSpec(const v1::JobSpec& spec, ModelConfig& c) {
  c.dtype =
      FromProtoDType(spec.model().dtype(), "model.dtype").value_or(DType::kF32);
  c.reduce_dtype.reset();
  if (spec.train().reduce_dtype() != v1::DTYPE_UNSPECIFIED) {
    c.reduce_dtype =
        FromProtoDType(spec.train().reduce_dtype(), "train.reduce_dtype")
            .value_or(c.dtype);
  }
}

absl::Status CheckRankDevice(const v1::JobSpec& spec, absl::string_view device,
                             absl::string_view who) {
  const bool cuda = absl::StartsWith(device, "cuda");
  const std::string shown = device.empty() ? std::string("no device")
                                           : absl::StrCat("device ", device);
  const std::string& declared = spec.hardware().device();
  if (!declared.empty() && cuda != (declared == "cuda")) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, " trains on ", shown, ", but the job's hardware.device is ",
        declared, ": start the rank on ", declared == "cuda" ? "a GPU" : "CPU",
        " (tandem-worker --device ", declared, "), or change hardware.device"));
  }
  if (spec.model().dtype() == v1::DTYPE_F16 && !cuda) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, " reports ", shown,
        ", but model.dtype f16 needs a CUDA device on every rank (libtorch "
        "has no f16 kernels on the CPU): use bf16 (the same memory, f32's "
        "exponent range), or run the ranks on GPUs (tandem-worker --device "
        "cuda)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ModelConfigFromJobSpec(const v1::JobSpec& spec) {
  const v1::ModelSpec& m = spec.model();
  ModelConfig c;
  c.name = spec.name().empty() ? "job" : spec.name();
  c.arch = (m.preset() == "moe" || m.experts() > 0) ? ModelArch::kMoe
                                                    : ModelArch::kLlama;
  c.layers = m.layers();
  c.d_model = m.d_model();
  c.heads = m.heads();
  c.kv_heads = m.kv_heads();
  c.ffn = m.ffn();
  c.vocab = m.vocab();
  c.experts = m.experts();
  c.top_k = m.top_k();
  c.seq_len = spec.batch().seq_len();
  c.micro_batch = spec.batch().micro_batch();
  c.grad_accum = spec.batch().grad_accum();
  SetPrecisionFromJobSpec(spec, c);
  c.activation_checkpointing = m.activation_checkpointing();
  c.world_size = spec.parallel().world_size();
  absl::Status status = ValidateModelConfig(c);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid job spec: model: ", status.message()));
  }
  return c;
}

namespace {

// 8693 -> "8,693".
std::string GroupedDigits(int64_t n) {
  std::string digits = absl::StrCat(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

}  // namespace

JobModelDescription DescribeJobModel(const v1::JobSpec& spec) {
  JobModelDescription d;
  const v1::ModelSpec& m = spec.model();
  const int64_t samples = std::max(1, spec.parallel().world_size()) *
                          int64_t{spec.batch().micro_batch()} *
                          std::max(1, spec.batch().grad_accum());
  d.unit = "tokens";
  d.items_per_step = samples * spec.batch().seq_len();
  if (m.kind() != "torchscript") {
    d.text = absl::StrCat(m.preset().empty() ? "builtin" : m.preset(), ": ",
                          m.layers(), " layers, d_model ", m.d_model(), ", ",
                          m.heads(), " heads (", m.kv_heads(), " kv), ffn ",
                          m.ffn(), ", vocab ", m.vocab());
    if (m.experts() > 0) {
      absl::StrAppend(&d.text, ", ", m.experts(), " experts (top ", m.top_k(),
                      ")");
    }
    return d;
  }
  absl::StatusOr<v1::ArchiveManifest> manifest = ReadArchiveManifest(m.path());
  if (!manifest.ok()) {
    d.text = absl::StrCat("exported model ", m.path());
    return d;
  }
  const v1::ArchiveManifest& a = *manifest;
  bool tokens = false;
  for (const v1::ArchiveInput& in : a.inputs()) {
    tokens = tokens || in.role() == "tokens";
  }
  if (!tokens || spec.data().kind() == "tensors") {
    d.unit = "samples";
    d.items_per_step = samples;
  }
  int64_t values = 0;
  for (const v1::ArchiveParam& p : a.params()) {
    int64_t n = 1;
    for (int64_t dim : p.shape()) n *= dim;
    values += n;
  }
  std::vector<std::string> units;
  for (int i = 0; i < a.units_size() && i < 4; ++i) {
    units.push_back(a.units(i).name());
  }
  if (a.units_size() > 4) units.push_back("...");
  std::vector<std::string> inputs;
  for (const v1::ArchiveInput& in : a.inputs()) {
    std::vector<std::string> dims;
    for (int i = 0; i < in.shape_size(); ++i) {
      const bool dynamic =
          std::find(in.dynamic_dims().begin(), in.dynamic_dims().end(), i) !=
          in.dynamic_dims().end();
      dims.push_back(i == 0    ? std::string("n")
                     : dynamic ? std::string("*")
                               : absl::StrCat(in.shape(i)));
    }
    inputs.push_back(absl::StrCat(in.name(), " ", in.dtype(), " [",
                                  absl::StrJoin(dims, ", "), "]"));
  }
  d.text = absl::StrCat(a.name(), " (exported): ", a.units_size(), " units (",
                        absl::StrJoin(units, ", "), "), ", a.params_size(),
                        " params of ", GroupedDigits(values),
                        " values; inputs ", absl::StrJoin(inputs, ", "));
  for (const v1::ArchiveGlue& g : a.glues()) {
    absl::StrAppend(&d.text, "; glue ", g.name(), " over ", g.unit_count(),
                    " units");
  }
  return d;
}

}  // namespace tandem
