#!/usr/bin/env bash
# Downloads, as .deb files, what scripts/gpu-check.sh needs to build the
# worker besides PyTorch, for a GPU machine that has PyTorch but no package
# registry (and so no apt-get install):
#
#   scripts/gpu-deps.sh [DIR]        # default DIR: <checkout>/.gpu-deps
#
# Run it on a Debian 12 (bookworm, amd64) machine with network access, then
# take DIR along to the GPU machine (it is git-ignored); gpu-check.sh
# unpacks the files into a private prefix there and builds against it. The
# libraries are bookworm's: they need glibc 2.36 or newer, which Debian 12,
# Ubuntu 24.04 and later have. About 5 MB.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/.gpu-deps}"

# The -dev packages and the runtime libraries they point at (libgloo-dev:
# headers only, for
# ProcessGroupGloo.hpp, since the PyTorch wheel ships none); zlib, OpenSSL
# and libstdc++ come with any distribution.
packages=(
  protobuf-compiler libprotoc32 libprotobuf32 libprotobuf-dev
  libabsl-dev libabsl20220623
  libyaml-cpp-dev libyaml-cpp0.7
  libgtest-dev libgmock-dev
  libgloo-dev
)

[ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ] ||
  { echo "gpu-deps: needs a Debian amd64 machine (dpkg and apt-get)" >&2; exit 1; }
mkdir -p "$DIR"
rm -f "$DIR"/*.deb
# apt-get download writes into the working directory; as root it warns that
# _apt cannot write there, which is harmless.
(cd "$DIR" && apt-get download "${packages[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
count="$(ls "$DIR"/*.deb 2>/dev/null | wc -l)"
[ "$count" -eq "${#packages[@]}" ] ||
  { echo "gpu-deps: got $count of ${#packages[@]} packages in $DIR (apt-get update first?)" >&2; exit 1; }
echo "gpu-deps: $count packages ($(du -sh "$DIR" | cut -f1)) in $DIR"
