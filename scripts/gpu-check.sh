#!/usr/bin/env bash
# The worker on a GPU: the one command to run on a machine with an NVIDIA GPU,
# PyTorch (with CUDA and NCCL), CMake and ninja, and no gRPC or internet.
#
#   scripts/gpu-check.sh
#
# 1. Configures the standalone-only worker (-DTANDEM_WORKER_STANDALONE_ONLY=ON:
#    no gRPC, no coordinator) against PyTorch's own libtorch into build-gpu/
#    and builds tandem-worker and the worker's tests.
# 2. Runs the worker's unit tests: worker_core_test, worker_trainer_test
#    (its CUDA numerics test must run, not skip) and worker_runtime_test (the
#    executor's numerics, on the CPU side of that libtorch).
# 3. Trains a small model with the standalone tandem-worker on the CPU
#    (Gloo) and on CUDA (NCCL) and compares each step's loss: world 1, and
#    world 2 (one rank per GPU, LOCAL_RANK 0 and 1) when two GPUs are visible,
#    else that part is skipped. Losses must agree within LOSS_RTOL (default
#    1e-3, relative): cuBLAS and the CPU kernels sum in different orders, and
#    AdamW carries that rounding a few steps.
#
# 4. Runs bench/gpu (bench/gpu/README.md): adaptive offload against
#    offload-all and no offload at three budgets, bf16 and f16 numerics
#    against PyTorch eager with autocast (and GradScaler), and tokens/s of a
#    built-in preset against eager. Its JSON lines go to GPU_BENCH_OUT; a run
#    that fails fails the check, a missed target is reported. GPU_BENCH=0
#    skips it.
#
# Without a GPU (no nvidia-smi, or it lists none) it prints "no GPU: skipped"
# and exits 0. Exits non-zero, saying what failed, otherwise.
#
# Besides PyTorch it needs what the standalone-only build needs: protobuf
# (protoc and libprotobuf; the job spec is a proto), abseil, yaml-cpp and
# GoogleTest (Debian/Ubuntu: protobuf-compiler libprotobuf-dev libabsl-dev
# libyaml-cpp-dev libgtest-dev libgmock-dev).
# A machine with no package registry takes them as .deb files instead:
# `scripts/gpu-deps.sh` downloads them (on a Debian 12 machine that has one)
# into .gpu-deps/, and this script unpacks every .deb found there into a
# private prefix (never into /) and builds and runs against it.
#
# Environment:
#   PYTHON           the Python that has torch (default: python3)
#   TANDEM_GPU_BUILD build directory (default: <checkout>/build-gpu)
#   TANDEM_JOBS      build parallelism (default: nproc)
#   LOSS_RTOL        relative loss tolerance, CUDA against CPU (default 1e-3)
#   NCCL_INCLUDE_DIR directory of nccl.h (default: the nvidia-nccl wheel's)
#   TANDEM_GPU_DEPS  folder of .deb files to build against (default:
#                    <checkout>/.gpu-deps; ignored when it holds none)
#   GPU_BENCH        1 (default) runs bench/gpu after the checks, 0 skips it
#   GPU_BENCH_OUT    its JSON lines (default: <build>/gpu-bench.jsonl)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${TANDEM_GPU_BUILD:-$ROOT/build-gpu}"
PYTHON="${PYTHON:-python3}"
JOBS="${TANDEM_JOBS:-$(nproc)}"
LOSS_RTOL="${LOSS_RTOL:-1e-3}"

say() { echo "gpu-check: $*"; }
die() { echo "gpu-check: FAILED: $*" >&2; exit 1; }

# --- Is there a GPU at all? -------------------------------------------------
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
fi
if [ "${gpus:-0}" -eq 0 ]; then
  echo "no GPU: skipped (nvidia-smi finds none)"
  exit 0
fi
say "$gpus GPU(s):"
nvidia-smi -L | sed 's/^/  /'

# --- PyTorch: CUDA, NCCL, its CMake prefix ----------------------------------
command -v "$PYTHON" >/dev/null 2>&1 ||
  die "no '$PYTHON'; set PYTHON to the Python that has torch"
torch_info="$("$PYTHON" - <<'EOF'
import os
import torch
import torch.distributed as dist
import torch.utils
nccl_include = os.environ.get("NCCL_INCLUDE_DIR", "")
if not nccl_include:
    try:
        import nvidia.nccl  # a namespace package: walk __path__
        for path in list(nvidia.nccl.__path__):
            include = os.path.join(path, "include")
            if os.path.exists(os.path.join(include, "nccl.h")):
                nccl_include = include
                break
    except ImportError:
        pass
print(torch.__version__)
print(torch.version.cuda or "")
print(int(dist.is_available() and dist.is_nccl_available()))
print(int(torch.cuda.is_available()))
print(torch.utils.cmake_prefix_path)
print(nccl_include)
EOF
)" || die "'$PYTHON' cannot import torch; set PYTHON to the Python that has PyTorch"
mapfile -t info <<<"$torch_info"
torch_version="${info[0]:-}"
torch_cuda="${info[1]:-}"
torch_nccl="${info[2]:-0}"
torch_sees_gpu="${info[3]:-0}"
torch_prefix="${info[4]:-}"
nccl_include="${info[5]:-}"
say "PyTorch $torch_version, CUDA ${torch_cuda:-none}, NCCL $torch_nccl," \
    "prefix $torch_prefix"
[ -n "$torch_cuda" ] || die "PyTorch $torch_version is a CPU-only build; install a CUDA one"
[ "$torch_nccl" = 1 ] || die "PyTorch $torch_version has no NCCL"
[ "$torch_sees_gpu" = 1 ] ||
  die "nvidia-smi lists GPUs but torch.cuda.is_available() is false (driver too old for CUDA $torch_cuda?)"

# libtorch 2.13 and later need C++20 in every file that includes its headers.
cxx_standard=17
if "$PYTHON" -c 'import sys, torch; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(0 if v >= (2, 13) else 1)'; then
  cxx_standard=20
fi

# find_package(Torch) looks for the CUDA toolkit (nvcc) as well.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
command -v nvcc >/dev/null 2>&1 ||
  die "no nvcc on PATH: libtorch's CMake config needs the CUDA toolkit (add its bin/ to PATH)"

# --- Build dependencies carried as .deb files --------------------------------
DEPS="${TANDEM_GPU_DEPS:-$ROOT/.gpu-deps}"
prefix_path="$torch_prefix"
if compgen -G "$DEPS/*.deb" >/dev/null; then
  deps_root="$BUILD/deps"
  say "unpacking $(ls "$DEPS"/*.deb | wc -l) .deb files from $DEPS into $deps_root"
  rm -rf "$deps_root"
  mkdir -p "$deps_root"
  for deb in "$DEPS"/*.deb; do
    dpkg-deb -x "$deb" "$deps_root" || die "cannot unpack $deb"
  done
  multiarch="$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
  prefix_path="$deps_root/usr;$torch_prefix"
  export PATH="$deps_root/usr/bin:$PATH"
  # protoc at build time, the shared libraries at test and run time.
  export LD_LIBRARY_PATH="$deps_root/usr/lib/$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# --- Configure and build ----------------------------------------------------
cmake_args=(
  -S "$ROOT" -B "$BUILD" -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_CXX_STANDARD="$cxx_standard"
  -DCMAKE_PREFIX_PATH="$prefix_path"
  -DCMAKE_CUDA_COMPILER="$(command -v nvcc)"
  -DTANDEM_WORKER_STANDALONE_ONLY=ON
  -DTANDEM_WITH_NCCL=ON
)
[ -n "$nccl_include" ] && cmake_args+=(-DNCCL_INCLUDE_DIR="$nccl_include")
say "configuring $BUILD"
mkdir -p "$BUILD"
cmake "${cmake_args[@]}" | tee "$BUILD/configure.log" ||
  die "configure failed (missing protobuf, abseil, yaml-cpp or GoogleTest? see above)"
grep -q "defines: .*TANDEM_WITH_NCCL" "$BUILD/configure.log" ||
  die "the build did not pick up a CUDA libtorch with NCCL (see $BUILD/configure.log)"
say "building"
# -k 0: on a failure, every file that does not compile is named, not the
# first one only.
cmake --build "$BUILD" -j"$JOBS" --target tandem-worker tandem-plan \
  worker_core_test worker_trainer_test worker_runtime_test -- -k 0

# --- Unit tests -------------------------------------------------------------
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# The archive tests write their model archives with this Python's torch.
export TANDEM_PYTHON="$PYTHON"
tests="$BUILD/tests/unit/worker"
say "worker_core_test"
"$tests/worker_core_test" --gtest_brief=1 || die "worker_core_test"
say "worker_trainer_test (the CUDA numerics test must run)"
trainer_log="$BUILD/worker_trainer_test.log"
"$tests/worker_trainer_test" 2>&1 | tee "$trainer_log" |
  grep -E '^\[ +(OK|FAILED|SKIPPED) +\]' || true
if ! grep -q '^\[  PASSED  \]' "$trainer_log" ||
  grep -q '^\[  FAILED  \]' "$trainer_log"; then
  die "worker_trainer_test (log: $trainer_log)"
fi
if grep -q 'SKIPPED \].*Cuda' "$trainer_log"; then
  die "the CUDA numerics test skipped itself on a GPU machine (log: $trainer_log)"
fi
say "worker_runtime_test (executor numerics)"
"$tests/worker_runtime_test" --gtest_brief=1 || die "worker_runtime_test"

# --- The standalone worker: CUDA against CPU --------------------------------
WORK="$(mktemp -d -t tandem-gpu-check.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
cat >"$WORK/spec.yaml" <<'EOF'
name: gpu-check
model:
  preset: llama
  layers: 2
  d_model: 64
  heads: 4
  kv_heads: 4
  ffn: 176
  vocab: 512
data:
  kind: synthetic
  seed: 1
batch:
  micro_batch: 2
  seq_len: 32
train:
  steps: 8
  lr: 1.0e-3
  seed: 1
parallel:
  world_size: 1
  zero_stage: 3
EOF
worker="$BUILD/worker/tandem-worker"
free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run NAME WORLD DEVICE: every rank of one run; rank 0's lines in NAME.jsonl.
run() {
  local name=$1 world=$2 device=$3 port pids=() r rc=0
  port="$(free_port)"
  for ((r = 0; r < world; r++)); do
    LOCAL_RANK=$r "$worker" --standalone --spec "$WORK/spec.yaml" --rank "$r" \
      --world "$world" --rendezvous "127.0.0.1:$port" --device "$device" \
      --threads 2 --timeout-s 120 >"$WORK/$name.rank$r.jsonl" \
      2>"$WORK/$name.rank$r.err" &
    pids+=("$!")
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  if [ "$rc" -ne 0 ]; then
    for ((r = 0; r < world; r++)); do
      echo "--- $name rank $r stderr" >&2
      tail -n 20 "$WORK/$name.rank$r.err" >&2 || true
    done
    die "standalone run '$name' (world $world, --device $device) failed"
  fi
  cp "$WORK/$name.rank0.jsonl" "$WORK/$name.jsonl"
}

# compare CPU_RUN CUDA_RUN: per-step losses within LOSS_RTOL.
compare() {
  "$PYTHON" - "$WORK/$1.jsonl" "$WORK/$2.jsonl" "$LOSS_RTOL" <<'EOF'
import json, sys
def losses(path):
    with open(path) as f:
        return [json.loads(l)["loss"] for l in f if '"loss"' in l]
cpu, gpu, rtol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
if not cpu or len(cpu) != len(gpu):
    sys.exit(f"step counts differ: cpu {len(cpu)}, cuda {len(gpu)}")
worst = 0.0
for step, (c, g) in enumerate(zip(cpu, gpu)):
    rel = abs(g - c) / max(abs(c), 1e-12)
    worst = max(worst, rel)
    print(f"  step {step}: cpu {c:.7f}  cuda {g:.7f}  rel {rel:.2e}")
if worst > rtol:
    sys.exit(f"largest relative difference {worst:.2e} > {rtol:g}")
print(f"  largest relative difference {worst:.2e} <= {rtol:g}")
EOF
}

say "standalone world 1: cpu (gloo) against cuda:0 (nccl)"
run cpu1 1 cpu
run cuda1 1 cuda
grep -q "cuda:0 with nccl" "$WORK/cuda1.rank0.err" ||
  die "the cuda run did not run on cuda:0 with nccl: $(head -n 1 "$WORK/cuda1.rank0.err")"
compare cpu1 cuda1 || die "world 1: CUDA losses differ from the CPU's"

if [ "$gpus" -ge 2 ]; then
  say "standalone world 2: cpu (gloo) against cuda:0 + cuda:1 (nccl)"
  run cpu2 2 cpu
  run cuda2 2 cuda
  grep -q "cuda:1 with nccl" "$WORK/cuda2.rank1.err" ||
    die "rank 1 did not run on cuda:1 with nccl: $(head -n 1 "$WORK/cuda2.rank1.err")"
  compare cpu2 cuda2 || die "world 2: CUDA losses differ from the CPU's"
else
  say "world 2 over NCCL: skipped (needs 2 GPUs, found $gpus)"
fi

say "OK: CUDA numerics match the CPU's"

# --- bench/gpu ---------------------------------------------------------------
if [ "${GPU_BENCH:-1}" != 0 ]; then
  bench_out="${GPU_BENCH_OUT:-$BUILD/gpu-bench.jsonl}"
  say "bench/gpu (offload, precision, throughput) -> $bench_out"
  "$PYTHON" "$ROOT/bench/gpu/gpu_bench.py" --build "$BUILD" --device cuda \
    --out "$bench_out" || die "bench/gpu failed (its output is above)"
  say "OK: bench/gpu ran; record its figures in bench/README.md"
fi
