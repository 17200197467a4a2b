#!/usr/bin/env bash
# Builds the unit tests under AddressSanitizer and UndefinedBehaviorSanitizer
# (-DTANDEM_SANITIZE=ON, gcc, a separate build directory) and runs them once
# with ctest. Without --worker it builds everything but the libtorch worker
# (common, the coordinator, the agent, the planner: what parses untrusted
# input); --worker adds the worker's tests, against an uninstrumented
# libtorch. Not part of scripts/test.sh, for time: it is the documented
# sanitizer run of issue 16 (coordinator/README.md, "Tests").
#
#   scripts/sanitize.sh [--worker] [ctest arguments ...]
#
# Environment: TANDEM_SANITIZE_BUILD_DIR (default build-asan), TANDEM_JOBS.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${TANDEM_SANITIZE_BUILD_DIR:-$ROOT/build-asan}"
WORKER=OFF
if [ "${1:-}" = "--worker" ]; then WORKER=ON; shift; fi
case "${1:-}" in -h|--help) sed -n 2,13p "$0"; exit 0 ;; esac

TANDEM_SKIP_BUILD=1 bash "$ROOT/scripts/setup.sh"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTANDEM_SANITIZE=ON -DTANDEM_BUILD_WORKER="$WORKER" >/dev/null
cmake --build "$BUILD" -j"${TANDEM_JOBS:-2}"

# Leaks too; one error stops the test that made it, naming it.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
cd "$BUILD"
ctest --output-on-failure -j"${TANDEM_JOBS:-2}" -E '^(layering|bench_.*)$' "$@"
