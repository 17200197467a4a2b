#!/usr/bin/env bash
# bench/e2e: Tandem against PyTorch DDP and the reference policies, two ranks
# in two network namespaces joined by a veth pair whose bandwidth tc caps
# (issue 9). Run as root from anywhere:
#
#   sudo bench/e2e/run.sh [--rates "2000 200"] [--models tiny-llama,wide-short,exported-gpt]
#                         [--rounds 3] [--steps 8] [--discard 2] [--settle-steps 15]
#                         [--paired-pairs 10] [--paired-block-steps 5] [--ddp-pairs 4]
#                         [--out FILE [--force]] [--quick]
#                         [--comm "chunk_bytes: 64KiB, max_in_flight: 4"]
#   sudo bench/e2e/run.sh --drift-check [--rates R] [--drift-args "--throttle-at 150 ..."]
#   sudo bench/e2e/run.sh --noise [--rates R] [--noise-args "--jobs 5 ..."] --out FILE
#   sudo bench/e2e/run.sh --long-run STEPS [--rates R] [--models M] --out FILE
#
# For each link rate and model: Tandem's on-demand warm-up with a profile;
# every reference policy and Tandem's own pipeline alone ("tandem-passes")
# planned from that profile, at two memory budgets (DDP's footprint and 60%
# of it); Tandem's schedule from a real job on the link (a coordinator, the
# job submitted as a user submits it, two agent-mode workers, run until its
# loop settles; bench/e2e/coordinator_job.py). Then --rounds interleaved
# rounds (default 3), each running every contender once: compute alone at
# world 1 (Tandem and PyTorch), PyTorch DDP (bench/e2e/ddp_reference.py) and
# each schedule on the link; a row is the median over rounds, with the
# min-max over rounds. Communication alone (the lower bound) once per
# schedule. Where Tandem's best reference at a budget is a plan on Tandem's
# runtime, the two then alternate in one run (--paired-pairs block pairs of
# --paired-block-steps steps; 0 pairs: none), and that interval decides
# the row's never-behind target (driver.py, step 4b). At the large budget
# Tandem's plan and PyTorch DDP are then compared pair by pair: each
# round's two runs, and --ddp-pairs more pairs back to back (default 4; 0:
# the rounds' only); that interval decides the Tandem/DDP target
# (driver.py, step 4c). --settle-steps: steps without a new schedule version after which
# Tandem's job counts as settled. JSON lines go to --out (default
# $TMPDIR/tandem-e2e/results.jsonl);
# the table is printed at the end (bench/e2e/report.py); an --out FILE that
# exists and is not empty is refused unless --force (results are kept in the
# repository; the default is scratch and rewritten). The namespaces
# (tandem-e2e-0/1) and the veth pair are removed on exit, failure included.
# --comm sets the job spec's `comm` section for every Tandem run (default:
# the spec's defaults).
# --drift-check runs only bench/drift/throttle.py (issue 15): a job under a
# coordinator on the first rate's link, throttled to 1/20 of it mid-job; a
# drift re-plan must follow within drift_window steps (exit 1 if not);
# --drift-args passes its options (throttle.py --help).
# --long-run replaces the bench: per model and rate, Tandem's job at the
# large budget, then the plan it settled on alone for STEPS steps; both
# runs' step time and exposed communication by thirds (driver.py long_run).
# --noise runs only bench/noise/noise.py (issue 34) on the first rate's link:
# jobs of the demo and an exported model, quiet, beside a CPU hog and under
# link flaps, each re-measured quietly after; --noise-args passes its options
# (noise.py --help).
# Environment: TANDEM_BUILD_DIR (default build/): the binaries and the
# Python client's stubs are built there (-j2) when missing.
set -euo pipefail

# glibc keeps freed blocks for every contender (a caller's own values win):
# by default it hands PyTorch's large blocks back to the kernel each step
# and faults them in again, which on some VMs made PyTorch's steps 2-3x
# slower and erratic while Tandem's block cache kept its own
# (bench/README.md, "Results (2026-12-02b ...)").
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-1073741824}"
export MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-1073741824}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
RATES="2000 200"
MODELS="tiny-llama,wide-short,exported-gpt"
STEPS="" DISCARD=2 QUICK=0 COMM="" DRIFT_CHECK=0 NOISE=0 NOISE_ARGS="" DRIFT_ARGS="" LONG_RUN=0 FORCE=0 ROUNDS=3 SETTLE=15
PAIRED_PAIRS=10 PAIRED_BLOCK=5 DDP_PAIRS=4
WORK="${TMPDIR:-/tmp}/tandem-e2e"
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rates) RATES="$2"; shift 2 ;;
    --models) MODELS="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --discard) DISCARD="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --settle-steps) SETTLE="$2"; shift 2 ;;
    --paired-pairs) PAIRED_PAIRS="$2"; shift 2 ;;
    --paired-block-steps) PAIRED_BLOCK="$2"; shift 2 ;;
    --ddp-pairs) DDP_PAIRS="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --force) FORCE=1; shift ;;
    --comm) COMM="$2"; shift 2 ;;
    --drift-check) DRIFT_CHECK=1; shift ;;
    --noise) NOISE=1; shift ;;
    --noise-args) NOISE_ARGS="$2"; shift 2 ;;
    --drift-args) DRIFT_ARGS="$2"; shift 2 ;;
    --long-run) LONG_RUN="$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^set -euo/ { exit } NR > 1' "$0"; exit 0 ;;
    *) echo "$0: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if ! [[ "$PAIRED_PAIRS" =~ ^[0-9]+$ ]]; then
  echo "$0: --paired-pairs must be a whole number (0: no alternating check), not '$PAIRED_PAIRS'" >&2
  exit 2
fi
if ! [[ "$DDP_PAIRS" =~ ^[0-9]+$ ]]; then
  echo "$0: --ddp-pairs must be a whole number (0: the rounds' pairs only), not '$DDP_PAIRS'" >&2
  exit 2
fi
if ! [[ "$PAIRED_BLOCK" =~ ^[0-9]+$ ]] || [ "$PAIRED_BLOCK" -lt 2 ]; then
  echo "$0: --paired-block-steps must be a whole number of at least 2 (each block's first step, the switch, is left out), not '$PAIRED_BLOCK'" >&2
  exit 2
fi
if [ -n "$OUT" ] && [ -s "$OUT" ] && [ "$FORCE" -ne 1 ]; then
  echo "$0: --out $OUT exists and is not empty; pick a new file, or add --force to overwrite it" >&2
  exit 2
fi
OUT="${OUT:-$WORK/results.jsonl}"
if [ "$(id -u)" -ne 0 ]; then
  echo "$0: needs root (it creates network namespaces and tc qdiscs); rerun with sudo" >&2
  exit 2
fi
for tool in ip tc /usr/bin/python3; do
  command -v "$tool" >/dev/null || { echo "$0: '$tool' not found" >&2; exit 2; }
done

BUILD="${TANDEM_BUILD_DIR:-$ROOT/build}"
need_build=0
BINS="worker/tandem-worker coordinator/tandem-plan bench/tandem-comm-replay coordinator/tandem-coordinator"
for bin in $BINS; do
  [ -x "$BUILD/$bin" ] || need_build=1
done
# Tandem's job is submitted with the Python client (client/python).
[ -f "$ROOT/client/python/tandem/v1/job_service_pb2.py" ] || need_build=1
if [ "$need_build" -eq 1 ]; then
  echo "[e2e] building tandem-worker, tandem-plan, tandem-comm-replay, tandem-coordinator and the Python stubs in $BUILD" >&2
  [ -f "$BUILD/CMakeCache.txt" ] || cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >&2
  cmake --build "$BUILD" -j2 --target tandem-worker tandem-plan tandem-comm-replay tandem-coordinator tandem_python_stubs >&2
fi

# A snapshot of the binaries: a rebuild during the run must not swap them.
SNAP="$WORK/bin"
mkdir -p "$SNAP/worker" "$SNAP/coordinator" "$SNAP/bench"
for bin in $BINS; do
  cp "$BUILD/$bin" "$SNAP/$bin.tmp" && mv "$SNAP/$bin.tmp" "$SNAP/$bin"
done
BUILD="$SNAP"

NS0=tandem-e2e-0 NS1=tandem-e2e-1
IF0=tde2e0 IF1=tde2e1
IP0=10.231.7.1 IP1=10.231.7.2

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "${DRIVER_PID:-}" ]; then kill "$DRIVER_PID" 2>/dev/null || true; fi
  # Processes still inside the bench's namespaces are this bench's ranks.
  for ns in "$NS0" "$NS1"; do
    if ip netns list | grep -qw "$ns"; then
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done
    fi
  done
  sleep 0.2
  for ns in "$NS0" "$NS1"; do
    ip netns del "$ns" 2>/dev/null || true  # removes the veth ends with it
  done
  ip link del "$IF0" 2>/dev/null || true
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A previous run killed hard may have left them behind.
for ns in "$NS0" "$NS1"; do ip netns del "$ns" 2>/dev/null || true; done
ip link del "$IF0" 2>/dev/null || true

ip netns add "$NS0"
ip netns add "$NS1"
ip link add "$IF0" type veth peer name "$IF1"
ip link set "$IF0" netns "$NS0"
ip link set "$IF1" netns "$NS1"
ip -n "$NS0" addr add "$IP0/24" dev "$IF0"
ip -n "$NS1" addr add "$IP1/24" dev "$IF1"
for pair in "$NS0 $IF0" "$NS1 $IF1"; do
  set -- $pair
  ip -n "$1" link set lo up
  ip -n "$1" link set "$2" up
done

mkdir -p "$WORK" "$(dirname "$OUT")"
: > "$OUT"
rm -f "$WORK"/*.budgets.json

# The token bucket holds one TCP segment offload burst (a 64 KiB payload plus
# headers). With a 64 KiB bucket tbf cut every such burst into MTU-sized
# packets in software: at 2000 Mbit/s the kernel then spent about 1.9 of this
# machine's 2 cores moving the bytes (system and softirq time 3.4x those of
# a 256 KiB bucket for the same transfers), starving compute so that no
# contender could overlap anything, which a NIC that segments in hardware
# never does (bench/README.md, "The emulated link's own cost").
BURST=256kb

# Machine facts, into the results.
/usr/bin/python3 - "$OUT" "$COMM" "$BURST" <<'EOF'
import json, os, platform, subprocess, sys, time
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
import torch
facts = {"contender": "machine", "cpu": cpu, "cores": os.cpu_count(),
         "kernel": platform.release(), "torch": torch.__version__,
         "loadavg_start": open("/proc/loadavg").read().split()[:3],
         "date": time.strftime("%Y-%m-%d %H:%M:%S"),
         "comm": sys.argv[2] or "spec defaults", "link_burst": sys.argv[3],
         "malloc": {k: os.environ.get(k, "") for k in
                    ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}}
open(sys.argv[1], "a").write(json.dumps(facts) + "\n")
EOF

# Shapes both ends of the link to $1 Mbit/s.
shape_link() {
  local mbit=$1 pair ns dev
  for pair in "$NS0 $IF0" "$NS1 $IF1"; do
    read -r ns dev <<<"$pair"
    ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "${mbit}mbit" burst "$BURST" latency 50ms
  done
}

# --drift-check or --noise: one driver on the first rate's link, run inside
# ns0 (the coordinator and rank 0 there, rank 1 in ns1: all over the link).
SOLO=""
if [ "$DRIFT_CHECK" -eq 1 ]; then
  SOLO="drift check:$ROOT/bench/drift/throttle.py:$WORK/drift"
elif [ "$NOISE" -eq 1 ]; then
  SOLO="noise bench:$ROOT/bench/noise/noise.py:$WORK/noise"
fi
if [ -n "$SOLO" ]; then
  IFS=: read -r what script workdir <<<"$SOLO"
  rate=${RATES%% *}
  shape_link "$rate"
  echo "[e2e] $what on a ${rate} Mbit/s link" >&2
  extra=()
  if [ "$NOISE" -eq 1 ]; then read -r -a extra <<<"$NOISE_ARGS"
  else read -r -a extra <<<"$DRIFT_ARGS"
  fi
  ip netns exec "$NS0" /usr/bin/python3 "$script" --build "$BUILD" \
    --workdir "$workdir" --ns1 "$NS1" --if0 "$IF0" --if1 "$IF1" --ip0 "$IP0" --ip1 "$IP1" \
    --rate-mbit "$rate" --burst "$BURST" --out "$OUT" "${extra[@]}" &
  DRIVER_PID=$!
  wait "$DRIVER_PID"
  exit $?
fi

for rate in $RATES; do
  shape_link "$rate"
  if [ -n "$STEPS" ]; then steps=$STEPS
  elif [ "$QUICK" -eq 1 ]; then steps=3
  elif [ "$rate" -ge 1000 ]; then steps=8
  else steps=5
  fi
  replay=$(( steps < 4 ? steps : 4 )); [ "$rate" -ge 1000 ] || replay=3
  echo "[e2e] link ${rate} Mbit/s: models $MODELS, $ROUNDS rounds of $steps measured steps ($DISCARD discarded)" >&2
  /usr/bin/python3 "$ROOT/bench/e2e/driver.py" --rate "$rate" --models "$MODELS" \
    --build "$BUILD" --workdir "$WORK" --out "$OUT" \
    --ns0 "$NS0" --ns1 "$NS1" --if0 "$IF0" --if1 "$IF1" --ip0 "$IP0" --ip1 "$IP1" \
    --steps "$steps" --discard "$DISCARD" --replay-steps "$replay" \
    --rounds "$ROUNDS" --settle-steps "$SETTLE" --long-run "$LONG_RUN" \
    --paired-pairs "$PAIRED_PAIRS" --paired-block-steps "$PAIRED_BLOCK" \
    --ddp-pairs "$DDP_PAIRS" \
    ${COMM:+--comm "$COMM"} &
  DRIVER_PID=$!
  wait "$DRIVER_PID"
  DRIVER_PID=""
done

/usr/bin/python3 - "$OUT" <<'EOF'
import json, sys
open(sys.argv[1], "a").write(json.dumps({"contender": "machine-end",
    "loadavg_end": open("/proc/loadavg").read().split()[:3]}) + "\n")
EOF
/usr/bin/python3 "$ROOT/bench/e2e/report.py" "$OUT"
echo "[e2e] JSON lines: $OUT" >&2
