#!/usr/bin/env bash
# bench/load/run.sh: one coordinator on a temporary database, tandem-loadgen
# at each load (fake workers across jobs), a results JSON; stops everything
# it started. bench/README.md, "load".
#
#   bench/load/run.sh                          # loads 100,250,500,1000,2000
#   LOADS=1000 bench/load/run.sh --duration-s 30
#   OUT=/tmp/load.json bench/load/run.sh --restart-at-load 0
#
# Environment: BUILD (build), COORDINATOR and LOADGEN (the binaries, from
# BUILD), LOADS, OUT (bench/load/results-<UTC date>.json),
# HEARTBEAT_TIMEOUT_S (15, the coordinator's default), MAX_RPC_THREADS (the
# coordinator's --max-rpc-threads; empty: its default), KEEP=1 keeps the
# temporary directory (database and logs), NOTE is copied into the results
# (e.g. the coordinator's commit). Arguments go to tandem-loadgen.
set -euo pipefail

cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
COORDINATOR=${COORDINATOR:-$BUILD/coordinator/tandem-coordinator}
LOADGEN=${LOADGEN:-$BUILD/bench/tandem-loadgen}
LOADS=${LOADS:-100,250,500,1000,2000}
OUT=${OUT:-bench/load/results-$(date -u +%F).json}
HEARTBEAT_TIMEOUT_S=${HEARTBEAT_TIMEOUT_S:-15}
MAX_RPC_THREADS=${MAX_RPC_THREADS:-}

for b in "$COORDINATOR" "$LOADGEN"; do
  if [[ ! -x $b ]]; then
    echo "run.sh: $b is not built: ninja -C $BUILD tandem-coordinator tandem-loadgen" >&2
    exit 2
  fi
done
COORDINATOR=$(realpath "$COORDINATOR")
LOADGEN=$(realpath "$LOADGEN")

# Two file descriptors per fake worker (its socket, the coordinator's end).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

work=$(mktemp -d /tmp/tandem-load.XXXXXX)
pidfile=$work/coordinator.pid
log=$work/coordinator.log

cleanup() {
  local pid
  pid=$(cat "$pidfile" 2>/dev/null || true)
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  if [[ ${KEEP:-0} == 1 ]]; then
    echo "run.sh: kept $work" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
flags=(--listen "127.0.0.1:$port" --db "$work/tandem.db"
       --metrics-listen 127.0.0.1:0 --heartbeat-timeout-s "$HEARTBEAT_TIMEOUT_S")
if [[ -n $MAX_RPC_THREADS ]]; then
  flags+=(--max-rpc-threads "$MAX_RPC_THREADS")
fi

"$COORDINATOR" "${flags[@]}" >>"$log" 2>&1 &
echo $! >"$pidfile"
# The loadgen SIGKILLs it: no job notice from this shell.
disown
for _ in $(seq 200); do
  grep -q "listening on port" "$log" 2>/dev/null && break
  if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "run.sh: the coordinator did not start:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.05
done

# The restart: the same flags and database; `exec` so that the shell's pid
# is the coordinator's (the loadgen writes it to the pid file).
printf -v restart_cmd 'exec %q' "$COORDINATOR"
for f in "${flags[@]}"; do printf -v restart_cmd '%s %q' "$restart_cmd" "$f"; done
restart_cmd+=" >>$(printf %q "$log") 2>&1"

echo "run.sh: coordinator $(cat "$pidfile") on 127.0.0.1:$port (db $work/tandem.db); load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$LOADGEN" --coordinator "127.0.0.1:$port" --coordinator-pid "$(cat "$pidfile")" \
  --restart-cmd "$restart_cmd" --pid-file "$pidfile" --loads "$LOADS" \
  --db "$work/tandem.db" --note "${NOTE:-}" --out "$OUT" "$@"
echo "run.sh: results in $OUT; load average now: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
if grep -qiE "error|fatal|abort" "$log"; then
  echo "run.sh: the coordinator's log has errors:" >&2
  grep -iE "error|fatal|abort" "$log" | head -20 >&2
fi
