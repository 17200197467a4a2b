#!/usr/bin/env bash
# Installing Tandem (issue 37): `cmake --install` puts every binary in
# <prefix>/bin, each runs from there, `tandem launch` finds the installed
# tandem-worker on PATH, and `cpack` makes a Debian package of them whose
# dependencies dpkg-shlibdeps found. Run by ctest as install_test.sh
# SOURCE_DIR BUILD_DIR.
set -euo pipefail
SRC="$1"
BUILD="$2"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

cmake --install "$BUILD" --prefix "$TMP/prefix" > "$TMP/install.log"
BINARIES=(tandem-coordinator tandem-health tandem-plan tandem-graph)
[ -f "$BUILD/worker/tandem-worker" ] && BINARIES+=(tandem-worker)
for b in "${BINARIES[@]}"; do
  [ -x "$TMP/prefix/bin/$b" ] || { echo "FAIL: $b not installed in $TMP/prefix/bin"; exit 1; }
  # Each runs from its installed place (its usage on --help).
  "$TMP/prefix/bin/$b" --help > "$TMP/$b.help" 2>&1 ||
    { echo "FAIL: installed $b --help: $(tail -3 "$TMP/$b.help")"; exit 1; }
  grep -qi "usage" "$TMP/$b.help" || { echo "FAIL: $b --help printed no usage"; exit 1; }
done

if [ -f "$BUILD/worker/tandem-worker" ]; then
  # The launcher finds the installed worker on PATH (no --worker, no
  # $TANDEM_WORKER).
  found=$(cd "$TMP" && env -u TANDEM_WORKER PATH="$TMP/prefix/bin:/usr/bin:/bin" \
    PYTHONPATH="$SRC/client/python" /usr/bin/python3 -c \
    'from tandem.launch import find_worker; print(find_worker())')
  [ "$found" = "$TMP/prefix/bin/tandem-worker" ] ||
    { echo "FAIL: tandem launch found '$found', not the installed worker"; exit 1; }
fi

# The Debian package: the same binaries under /usr/bin, with the shared
# libraries' packages as dependencies, and the client's version.
(cd "$TMP" && cpack -G DEB -B "$TMP/pkg" --config "$BUILD/CPackConfig.cmake" > "$TMP/cpack.log" 2>&1) ||
  { echo "FAIL: cpack: $(tail -5 "$TMP/cpack.log")"; exit 1; }
deb=$(ls "$TMP"/pkg/tandem_*.deb)
contents=$(dpkg-deb -c "$deb")
for b in "${BINARIES[@]}"; do
  grep -q "\./usr/bin/$b\$" <<<"$contents" || { echo "FAIL: $deb lacks /usr/bin/$b"; exit 1; }
done
depends=$(dpkg-deb -f "$deb" Depends)
for lib in libgrpc++ libprotobuf libsqlite3; do
  grep -q "$lib" <<<"$depends" || { echo "FAIL: $deb depends on no $lib: $depends"; exit 1; }
done
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$SRC/client/python/tandem/__init__.py")
[ "$(dpkg-deb -f "$deb" Version)" = "$version" ] ||
  { echo "FAIL: package version $(dpkg-deb -f "$deb" Version), client $version"; exit 1; }
echo "ok: ${#BINARIES[@]} binaries installed and packaged ($(basename "$deb"))"
