#!/usr/bin/env bash
# The standalone CLI end to end over loopback: world 2 and world 1 with twice
# the micro-batch print the same losses and checksum; a bad spec and a bad
# schedule fail with field-level errors; the profile is written.
#   standalone_cli_test.sh TANDEM_WORKER RUN_STANDALONE_SH
set -euo pipefail
WORKER=$1
RUNNER=$2
TMP=$(mktemp -d -t tandem-cli-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export TANDEM_WORKER="$WORKER" OPENBLAS_NUM_THREADS=1

spec() {  # micro_batch
  cat <<YAML
name: cli-test
model: {preset: llama, layers: 2, d_model: 32, heads: 4, kv_heads: 2, ffn: 48, vocab: 64}
data: {kind: synthetic, seed: 3}
batch: {micro_batch: $1, seq_len: 16}
train: {steps: 3, lr: 0.01, seed: 5}
parallel: {world_size: 2, zero_stage: 3}
YAML
}
spec 2 > "$TMP/w2.yaml"
spec 4 > "$TMP/w1.yaml"

TANDEM_LOG_DIR="$TMP/logs" "$RUNNER" 2 "$TMP/w2.yaml" \
  --profile-out "$TMP/profile.txt" > "$TMP/w2.out"
"$RUNNER" 1 "$TMP/w1.yaml" > "$TMP/w1.out"

/usr/bin/python3 - "$TMP/w2.out" "$TMP/w1.out" "$TMP/logs/rank1.out" <<'PY'
import json, sys
def load(path):
    lines = [json.loads(l) for l in open(path) if l.strip()]
    steps = [l for l in lines if "step" in l and "loss" in l]
    final = [l for l in lines if "param_digests" in l]
    assert len(steps) == 3 and len(final) == 1, lines
    for s in steps:
        for key in ("iteration_s", "exposed_comm_s", "peak_bytes"):
            assert key in s, (key, s)
    return [s["loss"] for s in steps], final[0]["param_digests"]
l2, c2 = load(sys.argv[1])
l1, c1 = load(sys.argv[2])
r1, rc1 = load(sys.argv[3])
assert (r1, rc1) == (l2, c2), ("ranks differ", r1, rc1, l2, c2)
for a, b in zip(l2, l1):
    assert abs(a - b) <= 1e-5 * abs(b), (l2, l1)
# One digest per param, each sensitive to where every value sits: world 2's
# shards put back together are world 1's params, to fp32 rounding.
assert list(c2) == list(c1) and len(c1) > 2, (c2, c1)
for name in c1:
    assert abs(c2[name] - c1[name]) <= 1e-4 * max(1.0, abs(c1[name])), (
        name, c2[name], c1[name])
assert l2[-1] < l2[0], l2
print("losses", l2, "digests", len(c2))
PY
grep -q "^profile graph=" "$TMP/profile.txt.rank0"
# The first two steps' one-time costs are left out of the profile, as in
# agent mode (kUnprofiledProcessSteps), keeping at least the last step.
grep -q "^profile graph=.* window=2..2 " "$TMP/profile.txt.rank0"
grep -q "^collective allgather" "$TMP/profile.txt.rank1"

# A bad spec names the field and fails.
printf 'model: {layers: four}\n' > "$TMP/bad.yaml"
if "$RUNNER" 1 "$TMP/bad.yaml" > /dev/null 2> "$TMP/bad.err"; then
  echo "bad spec was accepted" >&2; exit 1
fi
grep -q "model.layers" "$TMP/bad.err" || { cat "$TMP/bad.err" >&2; exit 1; }

# A schedule for another graph is rejected before training.
printf 'schedule v1 graph=0123456789abcdef\n' > "$TMP/bad_schedule.txt"
if "$WORKER" --standalone --spec "$TMP/w1.yaml" --rank 0 --world 1 \
    --rendezvous 127.0.0.1:1 --schedule "$TMP/bad_schedule.txt" \
    > /dev/null 2> "$TMP/sched.err"; then
  echo "bad schedule was accepted" >&2; exit 1
fi
grep -q "planned for graph" "$TMP/sched.err" || { cat "$TMP/sched.err" >&2; exit 1; }

# Flags (abseil, common/flags/command_line.h): --help lists every flag and
# exits 0; an unknown or malformed one exits 2 naming it and what to write.
"$WORKER" --help > "$TMP/help.out"
grep -q -- "--metrics-listen" "$TMP/help.out"
grep -q -- "--standalone" "$TMP/help.out"
expect_usage_error() {  # PATTERN ARGS...
  local pattern=$1; shift
  if "$WORKER" "$@" > /dev/null 2> "$TMP/usage.err"; then
    echo "accepted: $*" >&2; exit 1
  fi
  grep -q -- "$pattern" "$TMP/usage.err" || { cat "$TMP/usage.err" >&2; exit 1; }
}
expect_usage_error "unknown flag '--rnak' (did you mean --rank?)" --rnak 1
expect_usage_error "--device: expected one of auto, cpu, cuda" --device tpu
expect_usage_error "--metrics-listen: expected HOST:PORT" \
  --standalone --metrics-listen nowhere
expect_usage_error "standalone mode needs --spec" --standalone --spec "$TMP/w1.yaml"
set +e
"$WORKER" --rnak 1 > /dev/null 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "an unknown flag exited $rc, not 2" >&2; exit 1; }

# torchrun's variables stand in for --rank, --world and --rendezvous.
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  "$WORKER" --standalone --spec "$TMP/w1.yaml" --threads 1 \
  > "$TMP/env.out" 2> "$TMP/env.err"
grep -q "rank 0 from \$RANK" "$TMP/env.err" || { cat "$TMP/env.err" >&2; exit 1; }
grep -q "rendezvous 127.0.0.1:$port from" "$TMP/env.err"
/usr/bin/python3 - "$TMP/env.out" "$TMP/w1.out" <<'PY'
import json, sys
def losses(path):
    return [json.loads(l)["loss"] for l in open(path) if '"loss"' in l]
assert losses(sys.argv[1]) == losses(sys.argv[2]), (losses(sys.argv[1]),
                                                   losses(sys.argv[2]))
PY
echo PASS
