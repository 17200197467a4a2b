#!/usr/bin/env bash
# Starts W local ranks of tandem-worker on loopback, prints rank 0's JSON
# lines, and exits non-zero if any rank fails (the others are stopped).
#
#   deploy/local/run-standalone.sh W SPEC [tandem-worker flags...]
#   e.g. deploy/local/run-standalone.sh 2 deploy/local/tiny-llama.yaml \
#          --schedule plan.txt --profile-out /tmp/profile.txt
#
# A --profile-out FILE gets the rank appended (FILE.rank0, ...). Environment:
#   TANDEM_WORKER     the binary (default: $TANDEM_BUILD_DIR or build/, then
#                     build-worker/)
#   TANDEM_PORT       rendezvous port (default: a free one)
#   TANDEM_LOG_DIR    where rank logs go (default: a temporary directory)
#   OPENBLAS_NUM_THREADS (default 1) and --threads (default nproc / W).
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 W SPEC [tandem-worker flags...]" >&2
  exit 2
fi
W=$1
SPEC=$2
shift 2
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if ! [[ "$W" =~ ^[0-9]+$ ]] || [ "$W" -lt 1 ]; then
  echo "$0: W must be a positive integer, got '$W'" >&2
  exit 2
fi
if [ ! -f "$SPEC" ]; then
  echo "$0: no job spec at '$SPEC'" >&2
  exit 2
fi

WORKER="${TANDEM_WORKER:-}"
if [ -z "$WORKER" ]; then
  for dir in "${TANDEM_BUILD_DIR:-$ROOT/build}" "$ROOT/build-worker"; do
    if [ -x "$dir/worker/tandem-worker" ]; then
      WORKER="$dir/worker/tandem-worker"
      break
    fi
  done
fi
if [ -z "$WORKER" ] || [ ! -x "$WORKER" ]; then
  echo "$0: tandem-worker not found; build it (cmake -DTANDEM_BUILD_WORKER=ON) or set TANDEM_WORKER" >&2
  exit 2
fi

PORT="${TANDEM_PORT:-$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
LOG_DIR="${TANDEM_LOG_DIR:-$(mktemp -d -t tandem-standalone.XXXXXX)}"
mkdir -p "$LOG_DIR"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
THREADS=$(( $(nproc) / W ))
[ "$THREADS" -ge 1 ] || THREADS=1

# Per-rank flags: --profile-out gets a rank suffix.
rank_args() {
  local r=$1
  shift
  local out=()
  while [ $# -gt 0 ]; do
    if [ "$1" = "--profile-out" ] && [ $# -ge 2 ]; then
      out+=("--profile-out" "$2.rank$r")
      shift 2
    else
      out+=("$1")
      shift
    fi
  done
  if [ ${#out[@]} -gt 0 ]; then printf '%s\0' "${out[@]}"; fi
}

declare -A RANK_OF=()
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

# Each rank is its own LOCAL_RANK: on a machine with GPUs rank r trains on
# cuda:r (--device auto or cuda).
for ((r = 0; r < W; r++)); do
  mapfile -d '' args < <(rank_args "$r" "$@")
  if [ "$r" -eq 0 ]; then
    LOCAL_RANK=$r "$WORKER" --standalone --spec "$SPEC" --rank "$r" --world "$W" \
      --rendezvous "127.0.0.1:$PORT" --threads "$THREADS" "${args[@]+"${args[@]}"}" \
      2>"$LOG_DIR/rank$r.err" > >(tee "$LOG_DIR/rank$r.out") &
  else
    LOCAL_RANK=$r "$WORKER" --standalone --spec "$SPEC" --rank "$r" --world "$W" \
      --rendezvous "127.0.0.1:$PORT" --threads "$THREADS" "${args[@]+"${args[@]}"}" \
      >"$LOG_DIR/rank$r.out" 2>"$LOG_DIR/rank$r.err" &
  fi
  PIDS+=("$!")
  RANK_OF[$!]=$r
done

# Poll: the first rank to fail stops the job (its peers would otherwise
# wait for it until the collective timeout).
status=0
declare -A DONE=()
while [ "${#DONE[@]}" -lt "$W" ] && [ "$status" -eq 0 ]; do
  for pid in "${PIDS[@]}"; do
    [ -n "${DONE[$pid]:-}" ] && continue
    kill -0 "$pid" 2>/dev/null && continue
    set +e
    wait "$pid"
    rc=$?
    set -e
    DONE[$pid]=1
    if [ "$rc" -ne 0 ]; then
      r="${RANK_OF[$pid]}"
      echo "$0: rank $r failed (exit $rc); stopping the others. Its log:" >&2
      tail -n 20 "$LOG_DIR/rank$r.err" >&2 || true
      status=1
      break
    fi
  done
  if [ "${#DONE[@]}" -lt "$W" ] && [ "$status" -eq 0 ]; then sleep 0.1; fi
done
if [ "$status" -ne 0 ]; then
  cleanup
  wait 2>/dev/null || true
fi
trap - EXIT INT TERM
exit "$status"
