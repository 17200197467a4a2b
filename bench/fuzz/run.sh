#!/usr/bin/env bash
# The fuzz targets run long (tests/fuzz/README.md): each for --seconds
# (default 3600), keeping the corpus they grow in build-fuzz/corpus/ from
# run to run. Results: bench/README.md, "Fuzzing".
#
#   bench/fuzz/run.sh [--seconds N] [TARGET ...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
args=(--seconds 3600)
[ "${1:-}" = "--seconds" ] && { args=(--seconds "$2"); shift 2; }
exec "$ROOT/scripts/fuzz.sh" "${args[@]}" "$@"
