#!/usr/bin/env bash
# Checkpoints through the real CLI at world 2 (worker/README.md,
# "Persistence and faults"):
#   1. an uninterrupted run of 34 steps is the reference;
#   2. a run of 32 steps checkpointing every 2 steps is SIGKILLed as soon as
#      a complete checkpoint (its MANIFEST) of step >= 4 exists, polled for
#      with a timeout; it must not have finished. Resumed, it prints steps
#      from exactly its newest complete checkpoint on, and every loss equals
#      the reference's exactly (a partial newer checkpoint is ignored);
#   3. the newest checkpoint's rank-1 file corrupted and the previous one's
#      rank-0 file truncated: both are detected and logged, and training
#      resumes from the one before, again with the reference's exact losses;
#   4. a checkpoint resumes at another world size (resharded: the numerics
#      are tests/export/test_resume_world_size.py's), and one of another
#      model is refused with a clear error;
#   5. ZeRO-1 (zero_stage 1) trains the same losses as ZeRO-3 (to fp32
#      rounding).
#   checkpoint_resume_test.sh TANDEM_WORKER RUN_STANDALONE_SH
set -euo pipefail
WORKER=$1
RUNNER=$2
TMP=$(mktemp -d -t tandem-ckpt-test.XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT
export TANDEM_WORKER="$WORKER" OPENBLAS_NUM_THREADS=1

spec() {  # steps checkpoint_dir [zero_stage] [layers]
  cat <<YAML
name: ckpt-test
model: {preset: llama, layers: ${4:-2}, d_model: 32, heads: 4, kv_heads: 2, ffn: 48, vocab: 64}
data: {kind: synthetic, seed: 3}
batch: {micro_batch: 2, seq_len: 16}
train: {steps: $1, lr: 0.001, seed: 5, weight_decay: 0.1}
parallel: {world_size: 2, zero_stage: ${3:-3}}
checkpoint: {dir: "$2", every: 2}
YAML
}

losses() {  # file -> "step loss" lines
  /usr/bin/python3 -c '
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if "loss" in d:
        print(d["step"], repr(d["loss"]))' "$1"
}

# 1. Reference: 34 steps without checkpoints (the longest run below).
REF_STEPS=34
spec $REF_STEPS "" > "$TMP/ref.yaml"
"$RUNNER" 2 "$TMP/ref.yaml" > "$TMP/ref.out"
losses "$TMP/ref.out" > "$TMP/ref.losses"
[ "$(wc -l < "$TMP/ref.losses")" -eq $REF_STEPS ] || { cat "$TMP/ref.out"; exit 1; }

# Every line of $1 ("step loss") must appear verbatim in the reference.
same_as_reference() {
  while read -r step loss; do
    want=$(awk -v s="$step" '$1 == s {print $2}' "$TMP/ref.losses")
    if [ "$want" != "$loss" ]; then
      echo "step $step: loss $loss, uninterrupted run $want" >&2
      return 1
    fi
  done < "$1"
}

# Sets NEWEST to the newest step in $1 with a complete checkpoint (a
# MANIFEST, which rank 0 writes atomically once every rank's file is
# written), or to "" when there is none.
newest_checkpoint() {
  local m s
  NEWEST=""
  for m in "$1"/step-*/MANIFEST; do
    [ -e "$m" ] || continue
    s=${m%/MANIFEST}
    s=$((10#${s##*/step-}))
    if [ -z "$NEWEST" ] || [ "$s" -gt "$NEWEST" ]; then NEWEST=$s; fi
  done
}

# True while process $1 runs (not exited, not a zombie awaiting wait).
running() {
  local state
  [ -r "/proc/$1/stat" ] || return 1
  state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ -n "$state" ] && [ "$state" != Z ]
}

# 2. Kill both ranks (SIGKILL) once a complete checkpoint of step >= 4 exists:
# the kill waits for that fact, not for a guessed step time. 32 steps leave
# 28 more steps (~0.3 s of training on an idle machine) between that
# checkpoint and the end, so the kill lands mid-run.
KILL_STEPS=32
KILL_AFTER=4
KILL_TIMEOUT_S=120
CK="$TMP/ckpt"
spec $KILL_STEPS "$CK" > "$TMP/ck.yaml"
PORT=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for r in 0 1; do
  "$WORKER" --standalone --spec "$TMP/ck.yaml" --rank $r --world 2 \
    --rendezvous "127.0.0.1:$PORT" --threads 1 \
    > "$TMP/killed.rank$r.out" 2> "$TMP/killed.rank$r.err" &
  PIDS+=($!)
done
deadline=$((SECONDS + KILL_TIMEOUT_S))
while :; do
  newest_checkpoint "$CK"
  if [ -n "$NEWEST" ] && [ "$NEWEST" -ge $KILL_AFTER ]; then break; fi
  for pid in "${PIDS[@]}"; do
    if ! running "$pid"; then
      echo "FAIL: a rank exited before a complete checkpoint of step >= $KILL_AFTER existed in $CK" >&2
      cat "$TMP"/killed.rank*.out "$TMP"/killed.rank*.err >&2
      exit 1
    fi
  done
  if [ $SECONDS -ge $deadline ]; then
    echo "FAIL: timed out after ${KILL_TIMEOUT_S}s waiting for a complete checkpoint (MANIFEST) of step >= $KILL_AFTER in $CK" >&2
    ls -lR "$CK" >&2 2>/dev/null || true
    cat "$TMP"/killed.rank*.out "$TMP"/killed.rank*.err >&2
    exit 1
  fi
  sleep 0.005
done
kill -9 "${PIDS[@]}" 2>/dev/null || true
wait "${PIDS[@]}" 2>/dev/null || true
PIDS=()
# The newest complete checkpoint once both ranks are dead (the run may have
# completed more between the poll and the kill).
newest_checkpoint "$CK"
C=$NEWEST
losses "$TMP/killed.rank0.out" > "$TMP/killed.losses"
K=$(tail -1 "$TMP/killed.losses" | cut -d' ' -f1)
# Rank 0 prints a step's line after writing its checkpoint, so the last line
# printed is step C-2 or later.
if [ -z "$K" ] || [ "$K" -lt $((C - 2)) ]; then
  echo "FAIL: newest complete checkpoint step $C, but rank 0 printed steps only up to '$K'" >&2
  cat "$TMP/killed.rank0.out" "$TMP/killed.rank0.err" >&2
  exit 1
fi
if [ "$K" -ge $((KILL_STEPS - 1)) ] || [ "$C" -ge $KILL_STEPS ]; then
  echo "FAIL: the workers finished all $KILL_STEPS steps before the SIGKILL (last step $K, newest checkpoint $C): nothing was interrupted" >&2
  exit 1
fi
same_as_reference "$TMP/killed.losses"
# A partial checkpoint newer than any complete one (no manifest) is ignored.
mkdir -p "$CK/step-00000090"
echo garbage > "$CK/step-00000090/rank-0.ckpt"

TANDEM_LOG_DIR="$TMP/resume-logs" "$RUNNER" 2 "$TMP/ck.yaml" > "$TMP/resumed.out"
losses "$TMP/resumed.out" > "$TMP/resumed.losses"
first=$(head -1 "$TMP/resumed.losses" | cut -d' ' -f1)
last=$(tail -1 "$TMP/resumed.losses" | cut -d' ' -f1)
if [ "$first" -ne "$C" ] || [ "$last" -ne $((KILL_STEPS - 1)) ] ||
   [ "$(wc -l < "$TMP/resumed.losses")" -ne $((KILL_STEPS - C)) ]; then
  echo "FAIL: killed after step $K with newest complete checkpoint $C, the resumed run printed steps $first..$last" >&2
  cat "$TMP/resumed.out" "$TMP/resume-logs/rank0.err" >&2
  exit 1
fi
grep -q "resumed from $CK/$(printf 'step-%08d' "$C")" "$TMP/resume-logs/rank0.err"
same_as_reference "$TMP/resumed.losses"
echo "killed after step $K (newest complete checkpoint $C), resumed from step $first: losses of steps $first..$last equal the uninterrupted run"

# 3. Corrupt the newest complete checkpoint (step 32) on rank 1 and truncate
# the one before (step 30) on rank 0: both ranks fall back to step 28.
spec $REF_STEPS "$CK" > "$TMP/ck34.yaml"
f32="$CK/step-00000032/rank-1.ckpt"
f30="$CK/step-00000030/rank-0.ckpt"
/usr/bin/python3 - "$f32" "$f30" <<'PY'
import os, sys
corrupt, truncate = sys.argv[1], sys.argv[2]
data = bytearray(open(corrupt, "rb").read())
data[len(data) // 2] ^= 0x40
open(corrupt, "wb").write(data)
os.truncate(truncate, os.path.getsize(truncate) // 2)
PY
TANDEM_LOG_DIR="$TMP/fallback-logs" "$RUNNER" 2 "$TMP/ck34.yaml" > "$TMP/fallback.out"
losses "$TMP/fallback.out" > "$TMP/fallback.losses"
[ "$(head -1 "$TMP/fallback.losses" | cut -d' ' -f1)" -eq 28 ] || {
  cat "$TMP/fallback.out" "$TMP/fallback-logs/rank0.err" >&2; exit 1; }
[ "$(wc -l < "$TMP/fallback.losses")" -eq 6 ]
grep -q "step-00000032 is unusable: .*corrupted" "$TMP/fallback-logs/rank1.err"
grep -q "step-00000030 is unusable: .*truncated" "$TMP/fallback-logs/rank0.err"
grep -q "step-00000032 is unusable on another rank" "$TMP/fallback-logs/rank0.err"
grep -q "resumed from $CK/step-00000028" "$TMP/fallback-logs/rank0.err"
same_as_reference "$TMP/fallback.losses"
echo "corrupted and truncated checkpoints detected; resumed from step 28 exactly"

# 4. Another world size resumes, resharded; another model is refused,
# naming what to do.
spec $((REF_STEPS + 2)) "$CK" > "$TMP/w1.yaml"
TANDEM_LOG_DIR="$TMP/w1-logs" "$RUNNER" 1 "$TMP/w1.yaml" > "$TMP/w1.out"
losses "$TMP/w1.out" > "$TMP/w1.losses"
[ "$(cut -d' ' -f1 "$TMP/w1.losses" | tr '\n' ' ')" = "34 35 " ] || {
  cat "$TMP/w1.out" "$TMP/w1-logs/rank0.err" >&2; exit 1; }
grep -q "resharded from 2 ranks to 1" "$TMP/w1-logs/rank0.err" || {
  cat "$TMP/w1-logs/rank0.err" >&2; exit 1; }
spec $((REF_STEPS + 2)) "$CK" 3 3 > "$TMP/other_model.yaml"
if TANDEM_LOG_DIR="$TMP/model-logs" "$RUNNER" 2 "$TMP/other_model.yaml" \
    > /dev/null 2> "$TMP/model.err"; then
  echo "a checkpoint of another model was accepted" >&2; exit 1
fi
grep -q "is of another model" "$TMP/model-logs/rank0.err" || {
  cat "$TMP/model.err" "$TMP/model-logs/rank0.err" >&2; exit 1; }
echo "world-2 checkpoint resumed at world 1; other model refused"

# 5. ZeRO-1 through the CLI: the same losses as ZeRO-3.
spec 10 "" 1 > "$TMP/zero1.yaml"
"$RUNNER" 2 "$TMP/zero1.yaml" > "$TMP/zero1.out"
losses "$TMP/zero1.out" > "$TMP/zero1.losses"
/usr/bin/python3 - "$TMP/zero1.losses" "$TMP/ref.losses" <<'PY'
import sys
z = [float(l.split()[1]) for l in open(sys.argv[1])]
r = [float(l.split()[1]) for l in open(sys.argv[2])]
assert len(z) == 10 and len(r) >= 10, (z, r)
for a, b in zip(z, r[:10]):
    assert abs(a - b) <= 1e-5 * abs(b), (z, r)
PY
echo "zero1 losses match zero3"
echo PASS
