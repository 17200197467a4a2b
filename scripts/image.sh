#!/usr/bin/env bash
# Builds the container image tandem:VERSION from Debian packages: a bookworm
# rootfs made by mmdebstrap with only the runtime packages (libtorch, gRPC,
# protobuf, sqlite, OpenBLAS, python3 with grpcio/protobuf/yaml),
# imported with podman, plus a layer that installs Tandem's own Debian
# package (made by cpack from the build: the binaries in /usr/bin, its
# dependencies checked by dpkg against the base) and the Python client
# (`tandem` on PATH). deploy/k8s/README.md, "The
# image", says what is in it, how VERSION is made and how to push it.
#
#   scripts/image.sh             build (or confirm up to date) and print the size
#   scripts/image.sh --version   print VERSION only
#   scripts/image.sh --refresh   rebuild the base rootfs (new Debian updates)
#
#   TANDEM_BUILD_DIR=dir      build directory (default: build)
#   TANDEM_IMAGE=name         image name (default: tandem)
#   TANDEM_IMAGE_CACHE=dir    cache (default: .image-cache, git-ignored)
#   TANDEM_DEBIAN_MIRROR=url  Debian mirror (default: http://deb.debian.org/debian)
#
# Idempotent: the base rootfs is cached as a tarball keyed by the package
# list and everything else that goes into it, and imported once; the Tandem
# layer is rebuilt only when its content (binaries, client, image config)
# changed. Needs root (mmdebstrap's root mode, podman's system storage).
# Downloads only from the Debian mirror.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${TANDEM_BUILD_DIR:-$ROOT/build}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
IMAGE="${TANDEM_IMAGE:-tandem}"
CACHE="${TANDEM_IMAGE_CACHE:-$ROOT/.image-cache}"
MIRROR="${TANDEM_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm

# What the binaries and the client load at run time, as Debian runtime
# packages (found with `readelf -d` and `dpkg -S` on the built binaries);
# their dependencies come along. libtorch1.13 alone pulls OpenCV and FFmpeg
# (Debian builds it with them): most of the image.
RUNTIME_PACKAGES=(
  # worker
  libtorch1.13 libgloo0 libopenblas0-pthread
  # both daemons and tandem-health (libgrpc29 brings libssl3, whose
  # libcrypto the coordinator's join secrets use too)
  libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 libyaml-cpp0.7
  # coordinator store
  libsqlite3-0
  # the Python client and CLI
  python3 python3-grpcio python3-protobuf python3-yaml
)
# Tandem's executables, built here and packaged by cpack (CMakeLists.txt,
# "Installing") into /usr/bin.
BINARIES=(
  coordinator/tandem-coordinator
  coordinator/tandem-health
  coordinator/tandem-plan
  common/tandem-graph
  worker/tandem-worker
)
# runc: the test runs the image with it (tests/e2e/test_image.py says why).
HOST_PACKAGES=(mmdebstrap podman runc python3-pip)
# The user the Kubernetes manifests run as (runAsUser/runAsGroup).
UID_GID=10001
PATH_ENV=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# Debian's documentation, manuals and translations are left out of the
# rootfs (copyright files stay).
DPKG_OPTS=(
  'path-exclude=/usr/share/doc/*'
  'path-include=/usr/share/doc/*/copyright'
  'path-exclude=/usr/share/man/*'
  'path-exclude=/usr/share/info/*'
  'path-exclude=/usr/share/locale/*'
  'path-exclude=/usr/share/lintian/*'
)
# Runs once the packages are in: the unprivileged user and the
# coordinator's database directory (a volume in Kubernetes).
CUSTOMIZE_HOOK="set -e
echo 'tandem:x:$UID_GID:$UID_GID:Tandem:/var/lib/tandem:/usr/sbin/nologin' >> \"\$1/etc/passwd\"
echo 'tandem:x:$UID_GID:' >> \"\$1/etc/group\"
mkdir -p \"\$1/var/lib/tandem\"
chown $UID_GID:$UID_GID \"\$1/var/lib/tandem\"
rm -rf \"\$1/var/cache/debconf\"/*-old \"\$1/var/log\"/*.log"

version() {
  local described base sha
  if described=$(git -C "$ROOT" describe --tags --dirty 2>/dev/null); then
    echo "${described#v}"
    return
  fi
  base=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$ROOT/client/python/tandem/__init__.py")
  if sha=$(git -C "$ROOT" rev-parse --short=7 HEAD 2>/dev/null); then
    base="$base-g$sha"
    git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || base="$base-dirty"
  fi
  echo "$base"
}

REFRESH=0
case "${1:-}" in
  --version) version; exit 0 ;;
  --refresh) REFRESH=1 ;;
  "") ;;
  *) echo "usage: $0 [--version|--refresh]" >&2; exit 2 ;;
esac

if [ "$(id -u)" -ne 0 ]; then
  echo "$0: run as root (mmdebstrap's root mode and podman's system storage)" >&2
  exit 1
fi

missing=()
for p in "${HOST_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "image: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The binaries and the client's generated stubs, up to date.
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  TANDEM_SKIP_BUILD=1 TANDEM_BUILD_DIR="$BUILD_DIR" "$ROOT/scripts/setup.sh"
  generator=()
  command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
  cmake -S "$ROOT" -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
fi
targets=(tandem_python_stubs)
for b in "${BINARIES[@]}"; do targets+=("$(basename "$b")"); done
cmake --build "$BUILD_DIR" -j"${TANDEM_JOBS:-2}" --target "${targets[@]}"

VERSION=$(version)
mkdir -p "$CACHE"
start=$SECONDS

# --- base: the Debian rootfs -------------------------------------------------
SOURCES=(
  "deb $MIRROR $SUITE main"
  "deb $MIRROR $SUITE-updates main"
  "deb ${MIRROR%/debian}/debian-security $SUITE-security main"
)
BASE_KEY=$(printf '%s\n' "$SUITE" "${SOURCES[@]}" "${RUNTIME_PACKAGES[@]}" \
  "${DPKG_OPTS[@]}" "$CUSTOMIZE_HOOK" "$PATH_ENV" | sha256sum | cut -c1-16)
BASE_TAR="$CACHE/base-$BASE_KEY.tar"
BASE_IMAGE="localhost/$IMAGE-base:$BASE_KEY"
if [ "$REFRESH" = 1 ]; then
  rm -f "$BASE_TAR"
  podman image rm -f "$BASE_IMAGE" >/dev/null 2>&1 || true
fi
if ! podman image exists "$BASE_IMAGE"; then
  if [ ! -f "$BASE_TAR" ]; then
    echo "image: mmdebstrap $SUITE (${#RUNTIME_PACKAGES[@]} packages and their dependencies) -> $BASE_TAR"
    dpkg_args=()
    for o in "${DPKG_OPTS[@]}"; do dpkg_args+=(--dpkgopt="$o"); done
    mmdebstrap --quiet --mode=root --variant=essential --format=tar \
      --include="$(IFS=,; echo "${RUNTIME_PACKAGES[*]}")" \
      "${dpkg_args[@]}" --customize-hook="$CUSTOMIZE_HOOK" \
      "$SUITE" "$BASE_TAR.partial" "${SOURCES[@]}"
    mv "$BASE_TAR.partial" "$BASE_TAR"
    # One base is kept: the one for this package list.
    find "$CACHE" -maxdepth 1 -name 'base-*.tar' ! -name "base-$BASE_KEY.tar" -delete
  fi
  echo "image: podman import $BASE_TAR as $BASE_IMAGE"
  podman import --quiet --change "ENV PATH=$PATH_ENV" "$BASE_TAR" "$BASE_IMAGE" >/dev/null
  # Bases of older package lists go with their tags.
  podman images --format '{{.Repository}}:{{.Tag}}' "localhost/$IMAGE-base" |
    grep -vx "$BASE_IMAGE" | xargs -r podman image rm >/dev/null 2>&1 || true
fi

# --- layer: Tandem's package and the Python client ---------------------------
STAGE="$CACHE/layer"
rm -rf "$STAGE"
mkdir -p "$STAGE/usr"
# The Debian package a user installs, as `cmake --install` + cpack make it.
rm -rf "$CACHE/pkg"
(cd "$CACHE" && cpack -G DEB -B "$CACHE/pkg" --config "$BUILD_DIR/CPackConfig.cmake" \
  > "$CACHE/cpack.log" 2>&1) ||
  { echo "$0: cpack failed (log: $CACHE/cpack.log):" >&2; tail -5 "$CACHE/cpack.log" >&2; exit 1; }
deb=$(ls "$CACHE"/pkg/tandem_*.deb)
# Listed once: grep -q on a pipe would leave dpkg-deb a broken pipe
# (pipefail).
contents=$(dpkg-deb -c "$deb")
for b in "${BINARIES[@]}"; do
  grep -q "\./usr/bin/$(basename "$b")\$" <<<"$contents" ||
    { echo "$0: $deb lacks /usr/bin/$(basename "$b")" >&2; exit 1; }
done
cp "$deb" "$STAGE/tandem.deb"
# pip builds from a copy at a fixed path (the checkout stays untouched and
# the installed metadata is the same every time), with the generated stubs.
SRC="$CACHE/src/python"
rm -rf "$SRC"
mkdir -p "$SRC"
cp -r "$ROOT/client/python/pyproject.toml" "$ROOT/client/python/setup.py" \
  "$ROOT/client/python/tandem" "$SRC/"
find "$SRC" -name __pycache__ -prune -exec rm -rf {} +
PIP_DISABLE_PIP_VERSION_CHECK=1 /usr/bin/python3 -m pip install --quiet \
  --no-index --no-deps --no-build-isolation --no-compile \
  --break-system-packages --root "$STAGE" --prefix /usr "$SRC"
# (Debian's pip maps the /usr prefix to /usr/local/{bin,lib/python3.X/
# dist-packages}; --prefix /usr/local would land in /usr/local/local.)
site=$(echo "$STAGE"/usr/local/lib/python3*/dist-packages)
[ -f "$site/tandem/v1/job_service_pb2.py" ] ||
  { echo "$0: the client's stubs are not in $site/tandem/v1" >&2; exit 1; }
# Bytecode keyed by content, not mtime: the layer's hash stays the same.
/usr/bin/python3 -m compileall -q --invalidation-mode checked-hash \
  -s "$STAGE" -p / "$site/tandem"

# dpkg installs the package as on any Debian machine: a dependency the
# base lacks fails the build here, naming it.
cat > "$STAGE/Containerfile" <<EOF
FROM $BASE_IMAGE
COPY tandem.deb /tmp/tandem.deb
RUN dpkg -i /tmp/tandem.deb && rm /tmp/tandem.deb
COPY usr/ /usr/
ENV PATH=$PATH_ENV
USER $UID_GID:$UID_GID
WORKDIR /var/lib/tandem
CMD ["tandem-coordinator", "--listen", "0.0.0.0:50051", "--db", "/var/lib/tandem/tandem.db", "--tls-cert", "/etc/tandem/tls/tls.crt", "--tls-key", "/etc/tandem/tls/tls.key", "--auth-tokens", "/etc/tandem/auth/tokens"]
EOF
# The package file carries build times: its payload's binaries and its
# control fields (version, dependencies) stand for it in the key.
CONTENT=$(cd "$STAGE" && find . -type f ! -name tandem.deb -printf '%p %m\n' | sort &&
  find . -type f ! -name tandem.deb -print0 | sort -z | xargs -0 sha256sum &&
  dpkg-deb -f tandem.deb Package Version Depends &&
  for b in "${BINARIES[@]}"; do sha256sum "$BUILD_DIR/$b" | cut -c1-64; done)
CONTENT_KEY=$(echo "$CONTENT" | sha256sum | cut -c1-16)

ref="localhost/$IMAGE:$VERSION"
current=$(podman image inspect --format '{{index .Labels "io.tandem.content"}}' \
  "$ref" 2>/dev/null || true)
if [ "$current" = "$CONTENT_KEY" ]; then
  echo "image: $ref is up to date (content $CONTENT_KEY)"
else
  old=$(podman image inspect --format '{{.Id}}' "$ref" 2>/dev/null || true)
  echo "image: building $ref (content $CONTENT_KEY)"
  # runc: the RUN step needs a runtime that works here (tests/e2e/
  # test_image.py says why not crun).
  podman build --quiet --pull=never --network=none --runtime runc \
    --label "io.tandem.content=$CONTENT_KEY" \
    --label "org.opencontainers.image.title=tandem" \
    --label "org.opencontainers.image.version=$VERSION" \
    --tag "$ref" "$STAGE" >/dev/null
  podman tag "$ref" "localhost/$IMAGE:latest"
  # The image this one replaced, once no tag names it.
  if [ -n "$old" ] && [ -z "$(podman image inspect --format '{{.RepoTags}}' "$old" 2>/dev/null | tr -d '[]')" ]; then
    podman image rm "$old" >/dev/null 2>&1 || true
  fi
fi
podman tag "$ref" "localhost/$IMAGE:latest"

id=$(podman image inspect --format '{{.Id}}' "$ref")
size=$(podman image inspect --format '{{.Size}}' "$ref")
awk -v r="$ref" -v id="$id" -v s="$size" -v t=$((SECONDS - start)) 'BEGIN {
  printf "image: %s id %s size %d bytes (%.2f GB) in %d s\n", r, id, s, s / 1e9, t }'
