#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang under AddressSanitizer
# and UndefinedBehaviorSanitizer and runs each for a bounded time, starting
# from its committed seed corpus, after replaying every committed
# reproducer (tests/fuzz/regressions/<target>/). scripts/test.sh runs it
# for 30 s a target; bench/fuzz/run.sh runs it long.
#
#   scripts/fuzz.sh [--seconds N] [TARGET ...]      (default: 30 s, all four)
#
# A crash stops the run with exit 1 and leaves the input in
# build-fuzz/artifacts/; copy it into tests/fuzz/regressions/<target>/ once
# fixed. Environment: TANDEM_FUZZ_BUILD_DIR (default build-fuzz), TANDEM_JOBS.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${TANDEM_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
SECONDS_EACH=30
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH="$2"; shift 2 ;;
    -h|--help) sed -n 2,14p "$0"; exit 0 ;;
    -*) echo "$0: unknown flag '$1' (see --help)" >&2; exit 2 ;;
    *) TARGETS+=("${1%_fuzzer}_fuzzer"); shift ;;
  esac
done
ALL=(text_forms_fuzzer job_spec_fuzzer checkpoint_fuzzer service_fuzzer)
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL[@]}")
for t in "${TARGETS[@]}"; do
  [[ " ${ALL[*]} " == *" $t "* ]] ||
    { echo "$0: unknown target '$t'; targets: ${ALL[*]}" >&2; exit 2; }
done
command -v clang++ >/dev/null ||
  { echo "$0: clang++ not found (scripts/setup.sh installs clang)" >&2; exit 2; }

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DTANDEM_FUZZ=ON \
    -DTANDEM_BUILD_TESTS=OFF >/dev/null
fi
cmake --build "$BUILD" -j"${TANDEM_JOBS:-2}" --target "${TARGETS[@]}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
mkdir -p "$BUILD/artifacts"
status=0
for t in "${TARGETS[@]}"; do
  name="${t%_fuzzer}"
  seeds="$ROOT/tests/fuzz/corpus/$name"
  regressions="$ROOT/tests/fuzz/regressions/$name"
  work="$BUILD/corpus/$name"
  mkdir -p "$work"
  if compgen -G "$regressions/*" >/dev/null; then
    echo "== $t: replaying $(ls "$regressions" | wc -l) reproducers"
    "$BUILD/tests/fuzz/$t" "$regressions"/* 2>&1 | tail -n 3 || {
      echo "$t: a reproducer in $regressions crashes again" >&2; status=1; continue; }
  fi
  echo "== $t: ${SECONDS_EACH} s from $(ls "$seeds" | wc -l) seeds"
  if ! "$BUILD/tests/fuzz/$t" -max_total_time="$SECONDS_EACH" -timeout=20 \
      -rss_limit_mb=2560 -print_final_stats=1 \
      -artifact_prefix="$BUILD/artifacts/$name-" "$work" "$seeds" \
      >"$BUILD/$name.log" 2>&1; then
    tail -n 40 "$BUILD/$name.log" >&2
    echo "$t: FOUND A CRASH; the input is in $BUILD/artifacts/ (log: $BUILD/$name.log)" >&2
    status=1
    continue
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$BUILD/$name.log" |
    tr '\n' ' '
  echo
done
exit "$status"
