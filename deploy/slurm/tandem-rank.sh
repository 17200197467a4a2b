#!/usr/bin/env bash
# One Tandem worker per Slurm task; srun runs this once per task:
#
#   srun --ntasks=N deploy/slurm/tandem-rank.sh
#
# rank = SLURM_PROCID, world = SLURM_NTASKS, local rank = SLURM_LOCALID
# (exported as RANK, WORLD_SIZE and LOCAL_RANK). The signals Slurm sends a
# task (scancel, srun forwarding, the time limit) are forwarded to the
# worker: it tells the coordinator and exits. A worker whose job restarts
# is started again in the same task (below).
#
# Environment:
#   TANDEM_COORDINATOR  coordinator HOST:PORT (required)
#   TANDEM_JOB          Tandem job id (required)
#   TANDEM_WORKER       tandem-worker binary (default: $TANDEM_BUILD_DIR/
#                       worker/tandem-worker, else the one on PATH)
#   TANDEM_BUILD_DIR    build directory (default: <checkout>/build)
#   TANDEM_LOG_DIR      per-rank logs: rank-R.log (stderr) and rank-R.jsonl
#                       (one JSON line per step); default: the current dir
#   TANDEM_BIND_HOST    address Gloo binds for this rank (default: this
#                       node's hostname; 127.0.0.1 when the job has one node)
#   TANDEM_HEALTH_PORT  when set, serve grpc.health.v1 on port
#                       TANDEM_HEALTH_PORT + local rank
#   TANDEM_THREADS      intra-op threads (default: SLURM_CPUS_PER_TASK)
#   TANDEM_TLS_CA       the coordinator's CA, when it serves TLS
#   TANDEM_JOIN_SECRET  the job's join secret (read by tandem-worker itself)
#   TANDEM_MAX_RELAUNCHES  how often a task starts its worker again (10)
set -euo pipefail

: "${SLURM_PROCID:?run this under srun (SLURM_PROCID is unset)}"
: "${TANDEM_COORDINATOR:?set TANDEM_COORDINATOR to the coordinator HOST:PORT}"
: "${TANDEM_JOB:?set TANDEM_JOB to the Tandem job id (tandem submit -q)}"

# The user's token stays with the batch script: workers authenticate with
# the job's join secret only.
unset TANDEM_TOKEN
export RANK="$SLURM_PROCID"
export WORLD_SIZE="${SLURM_NTASKS:-1}"
export LOCAL_RANK="${SLURM_LOCALID:-0}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build_dir="${TANDEM_BUILD_DIR:-$here/../../build}"
worker="${TANDEM_WORKER:-}"
if [ -z "$worker" ]; then
  if [ -x "$build_dir/worker/tandem-worker" ]; then
    worker="$build_dir/worker/tandem-worker"
  else
    worker="$(command -v tandem-worker || true)"
  fi
fi
if [ -z "$worker" ] || [ ! -x "$worker" ]; then
  echo "tandem-rank.sh: rank $RANK: no tandem-worker (set TANDEM_WORKER or" \
       "TANDEM_BUILD_DIR, or put it on PATH)" >&2
  exit 2
fi

log_dir="${TANDEM_LOG_DIR:-.}"
mkdir -p "$log_dir"
if [ -z "${TANDEM_BIND_HOST:-}" ]; then
  if [ "${SLURM_NNODES:-1}" = "1" ]; then
    TANDEM_BIND_HOST=127.0.0.1
  else
    TANDEM_BIND_HOST="$(hostname)"
  fi
fi

# --world: a job whose world_size is not SLURM_NTASKS fails at once, saying
# so, instead of waiting in the rendezvous for ranks that never come.
args=(--coordinator "$TANDEM_COORDINATOR" --job "$TANDEM_JOB"
      --rank "$RANK" --world "$WORLD_SIZE" --bind-host "$TANDEM_BIND_HOST")
[ -n "${TANDEM_TLS_CA:-}" ] && args+=(--tls-ca "$TANDEM_TLS_CA")
threads="${TANDEM_THREADS:-${SLURM_CPUS_PER_TASK:-}}"
[ -n "$threads" ] && args+=(--threads "$threads")
if [ -n "${TANDEM_HEALTH_PORT:-}" ]; then
  args+=(--health-listen "0.0.0.0:$((TANDEM_HEALTH_PORT + LOCAL_RANK))")
fi

# The task stays and starts its worker again, keeping the allocation, when
# the job restarts (coordinator/README.md, "Elastic restarts"): exit 75 (the
# coordinator said so) or a crash (SIGKILL, SIGSEGV, SIGABRT), at most
# TANDEM_MAX_RELAUNCHES times. A worker that ends any other way (done,
# refused, stopped by scancel's SIGTERM) ends the task with its status.
max_relaunches="${TANDEM_MAX_RELAUNCHES:-10}"
child=""
stopping=0
forward() {
  stopping=1
  [ -n "$child" ] && kill -"$1" "$child" 2>/dev/null
}
trap 'forward TERM' TERM
trap 'forward INT' INT
launch=0
while true; do
  launch=$((launch + 1))
  echo "tandem-rank.sh: rank $RANK of $WORLD_SIZE (local $LOCAL_RANK) on" \
       "$(hostname) [${SLURMD_NODENAME:-?}], job $TANDEM_JOB at" \
       "$TANDEM_COORDINATOR, launch $launch" >>"$log_dir/rank-$RANK.log"
  "$worker" "${args[@]}" >>"$log_dir/rank-$RANK.jsonl" \
    2>>"$log_dir/rank-$RANK.log" &
  child=$!
  while true; do
    rc=0
    wait "$child" || rc=$?  # (set -e must not end the loop here)
    # wait returns early (status > 128) when a trapped signal arrives.
    kill -0 "$child" 2>/dev/null || break
  done
  child=""
  case "$rc" in
    75|134|137|139) ;;
    *) exit "$rc" ;;
  esac
  if [ "$stopping" = 1 ] || [ "$launch" -gt "$max_relaunches" ]; then
    exit "$rc"
  fi
  echo "tandem-rank.sh: rank $RANK: worker exited with $rc; starting it" \
       "again" >>"$log_dir/rank-$RANK.log"
done
