#!/usr/bin/env bash
# Installs, idempotently, every Debian package Tandem needs, then configures and
# builds with CMake (Release, -j2). Safe to run repeatedly: apt-get is skipped
# when everything is already installed, and the build is incremental.
#
#   scripts/setup.sh            install + build
#   TANDEM_SKIP_INSTALL=1 ...   build only
#   TANDEM_BUILD_DIR=dir ...    build directory (default: build)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${TANDEM_BUILD_DIR:-$ROOT/build}"
JOBS="${TANDEM_JOBS:-2}"

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config git clang-format
  # cpack's Debian package (ctest install, scripts/image.sh): dpkg-shlibdeps
  # comes with build-essential, and CPackDeb finds the binaries with file(1)
  file
  # protocol
  protobuf-compiler libprotobuf-dev protobuf-compiler-grpc libgrpc++-dev
  # common
  libabsl-dev libyaml-cpp-dev
  # coordinator store
  libsqlite3-dev sqlite3
  # TLS and join secrets (libcrypto), certificates in tests and the Slurm recipe
  libssl-dev openssl
  # worker
  libtorch-dev libgloo-dev libopenblas0-pthread
  # tests and benchmarks (clang and its runtimes: the fuzz targets)
  googletest libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev
  prometheus slurm-wlm munge iproute2
  # python client and the PyTorch peer in benchmarks
  python3 python3-grpcio python3-protobuf python3-yaml python3-pytest python3-torch
  python3-pip
  # the exported-model tests' third-party models (the builds for torch 1.13):
  # torchvision's ViT, Swin and ConvNeXt, torchaudio's Conformer and wav2vec2,
  # torchtext's RoBERTa
  python3-torchvision python3-torchaudio python3-torchtext
)

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: all ${#PACKAGES[@]} packages present"
    return
  fi
  echo "setup: installing ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

if [ "${TANDEM_SKIP_INSTALL:-0}" != "1" ]; then
  install_packages
  # Offline manifest checks need node and npm. A nodejs from elsewhere may
  # bundle its own npm (and conflict with Debian's), so install only if absent.
  if ! command -v npm >/dev/null 2>&1; then
    echo "setup: installing nodejs npm"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm
  fi
fi

if [ "${TANDEM_SKIP_BUILD:-0}" = "1" ]; then
  exit 0
fi

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$BUILD_DIR" -j"$JOBS"
