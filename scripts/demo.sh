#!/usr/bin/env bash
# The main job, end to end on this machine: a coordinator and two local
# workers train a small Llama (deploy/local/demo.yaml) on CPU with Gloo. The
# job is submitted and watched with the Python CLI; the coordinator profiles
# the baseline, plans, and pushes a schedule that both ranks switch to
# mid-run. At the end it prints the schedule versions, what the plan bought
# (measured interleaved with the baseline, with its interval), and how close
# the simulator's prediction came; then it runs the same job again, which the
# plan cache starts on the first job's plan from step 1. Prometheus
# (Debian's) scrapes the coordinator
# and both workers meanwhile, with the alert rules of dashboards/; the script
# prints where to look.
#
#   scripts/demo.sh [SPEC]                  a job spec (default: demo.yaml)
#   scripts/demo.sh --model FILE.py:BUILD [EXPORT OPTIONS]
#                                           your own nn.Module: exported with
#                                           `tandem export` (the options after
#                                           it go there: --wrap, --input-range,
#                                           --dynamic, ...), then trained by
#                                           deploy/local/exported.yaml
#
# e.g. scripts/demo.sh --model tests/models/gpt.py:build_demo
#      scripts/demo.sh --model tests/models/vit.py:build --input-range labels=0:9
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${TANDEM_BUILD_DIR:-$ROOT/build}"
MODEL=""
EXPORT_ARGS=()
if [ "${1:-}" = "--model" ]; then
  [ -n "${2:-}" ] || { echo "$0: --model needs FILE.py:BUILD" >&2; exit 2; }
  MODEL="$2"
  EXPORT_ARGS=("${@:3}")
  SPEC="$ROOT/deploy/local/exported.yaml"
else
  SPEC="${1:-$ROOT/deploy/local/demo.yaml}"
fi

"$ROOT/scripts/setup.sh"

WORK="$(mktemp -d -t tandem-demo.XXXXXX)"
if [ -n "$MODEL" ]; then
  # The archive goes next to a copy of the spec, whose model.path names it
  # relative to the spec file.
  echo "== tandem export $MODEL ${EXPORT_ARGS[*]}"
  (cd "$ROOT" && PYTHONPATH="$ROOT/client/python" /usr/bin/python3 -m tandem \
    export "$MODEL" ${EXPORT_ARGS[@]+"${EXPORT_ARGS[@]}"} -o "$WORK/model.tandem")
  cp "$SPEC" "$WORK/exported.yaml"
  SPEC="$WORK/exported.yaml"
fi
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

echo "== tandem demo (logs in $WORK)"
"$BUILD_DIR/coordinator/tandem-coordinator" --listen 127.0.0.1:0 \
  --db "$WORK/tandem.db" --metrics-listen 127.0.0.1:0 \
  > "$WORK/coordinator.out" 2> "$WORK/coordinator.log" &
pids+=($!)
for _ in $(seq 100); do
  grep -q "listening on port" "$WORK/coordinator.out" 2>/dev/null && break
  sleep 0.1
done
PORT=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$WORK/coordinator.out")
METRICS=$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$WORK/coordinator.out")
[ -n "$PORT" ] || { cat "$WORK/coordinator.log"; exit 1; }
export TANDEM_COORDINATOR="127.0.0.1:$PORT"
echo "coordinator on $TANDEM_COORDINATOR, metrics on http://127.0.0.1:$METRICS/metrics"

# Prometheus, as dashboards/prometheus/prometheus-local.yml: config, rules and
# the file_sd targets the workers are added to below.
PROM_DIR="$WORK/prometheus"
mkdir -p "$PROM_DIR/targets"
cp "$ROOT/dashboards/prometheus/prometheus-local.yml" "$PROM_DIR/prometheus.yml"
cp "$ROOT/dashboards/alerts/tandem-alerts.yml" "$PROM_DIR/"
echo "[{\"targets\": [\"127.0.0.1:$METRICS\"], \"labels\": {\"component\": \"coordinator\"}}]" \
  > "$PROM_DIR/targets/coordinator.json"
echo "[]" > "$PROM_DIR/targets/workers.json"
PROM_URL=""
if [ -x /usr/bin/prometheus ]; then
  PROM_PORT=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  /usr/bin/prometheus --config.file "$PROM_DIR/prometheus.yml" \
    --storage.tsdb.path "$PROM_DIR/data" --log.level warn \
    --web.listen-address "127.0.0.1:$PROM_PORT" 2> "$PROM_DIR/prometheus.log" &
  pids+=($!)
  PROM_URL="http://127.0.0.1:$PROM_PORT"
  echo "prometheus on $PROM_URL (targets: $PROM_URL/targets, alerts: $PROM_URL/alerts)"
else
  echo "prometheus: /usr/bin/prometheus not found (Debian package prometheus); metrics are still served"
fi

tandem_cli() { (cd "$ROOT/client/python" && /usr/bin/python3 -m tandem "$@"); }

JOB=$(tandem_cli submit -q "$SPEC")
echo "submitted job $JOB"
WORLD=$(/usr/bin/python3 -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['parallel']['world_size'])" "$SPEC")
worker_targets=()
for r in $(seq 0 $((WORLD - 1))); do
  OPENBLAS_NUM_THREADS=1 "$BUILD_DIR/worker/tandem-worker" \
    --coordinator "$TANDEM_COORDINATOR" --job "$JOB" --rank "$r" --threads 1 \
    --metrics-listen 127.0.0.1:0 \
    > "$WORK/worker$r.jsonl" 2> "$WORK/worker$r.log" &
  pids+=($!)
  for _ in $(seq 100); do
    grep -q "metrics on port" "$WORK/worker$r.log" 2>/dev/null && break
    sleep 0.1
  done
  WPORT=$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$WORK/worker$r.log" | head -1)
  if [ -n "$WPORT" ]; then
    echo "worker rank $r metrics on http://127.0.0.1:$WPORT/metrics"
    worker_targets+=("{\"targets\": [\"127.0.0.1:$WPORT\"], \"labels\": {\"component\": \"worker\", \"tandem_job\": \"$JOB\", \"rank\": \"$r\"}}")
  fi
done
(IFS=,; echo "[${worker_targets[*]}]") > "$PROM_DIR/targets/workers.json.tmp"
mv "$PROM_DIR/targets/workers.json.tmp" "$PROM_DIR/targets/workers.json"

status=0
tandem_cli watch "$JOB" || status=$?
echo
tandem_cli status "$JOB" | sed -n '1,200p' | grep -E "^(model|batch) |schedule|state|drift|replan|rollback|bought" || true
echo
tandem_cli schedule "$JOB" > "$WORK/schedule.txt" || true
# The first plan, for its own prediction error (a later version may be a
# rollback or a trial: its figures are another plan's).
tandem_cli schedule "$JOB" --version 1 > "$WORK/schedule-v1.txt" 2>/dev/null || true
head -12 "$WORK/schedule.txt"
echo "..."
echo

/usr/bin/python3 - "$WORK/worker0.jsonl" "$WORK/schedule-v1.txt" <<'PY'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"step"')]
by_version = {}
for s in steps:
    by_version.setdefault(s["schedule_version"], []).append(s["iteration_s"])
base = by_version.get(0, [])[1:]  # the first step warms up
print("iterations by schedule version (rank 0, median seconds):")
for v in sorted(by_version):
    xs = by_version[v][1:] if v == 0 else by_version[v]
    if xs:
        print("  v%d: %d steps, median %.4f s, exposed comm %.4f s" % (
            v, len(by_version[v]), statistics.median(xs),
            statistics.median(s["exposed_comm_s"] for s in steps
                              if s["schedule_version"] == v)))
# What the plan bought is the coordinator's interleaved measurement against
# the baseline, with its interval: the "bought" line of `tandem status`
# above. The medians here are each version's steps, one after the other.
# The first plan's prediction against its own steps (the first after the
# switch left out), never against another version's.
predicted = None
try:
    for line in open(sys.argv[2]):
        if line.startswith("predict "):
            for tok in line.split():
                if tok.startswith("iteration="):
                    predicted = float(tok.split("=")[1])
except OSError:
    pass
first = by_version.get(1, [])[1:]
if predicted and first:
    measured = statistics.median(first)
    print("first plan (v1): simulator predicted %.4f s/iter, its own %d steps "
          "measured median %.4f s (%+.1f%%)" % (
              predicted, len(first), measured,
              100 * (predicted - measured) / measured))
PY
# The plan cache: the same job again starts on the plan the first one ended
# on, from step 1, instead of re-learning it through the warm-up.
echo
echo "== the same job again (plan cache)"
JOB2=$(tandem_cli submit -q "$SPEC")
echo "submitted job $JOB2"
again=()
for r in $(seq 0 $((WORLD - 1))); do
  OPENBLAS_NUM_THREADS=1 "$BUILD_DIR/worker/tandem-worker" \
    --coordinator "$TANDEM_COORDINATOR" --job "$JOB2" --rank "$r" --threads 1 \
    > "$WORK/again$r.jsonl" 2> "$WORK/again$r.log" &
  again+=($!)
  pids+=($!)
done
for pid in "${again[@]}"; do wait "$pid" || status=1; done
tandem_cli status "$JOB2" | grep -E "^(state|schedule|bought)" || true
tandem_cli status "$JOB2" | grep -E "\(cached\)" | head -1 || true
/usr/bin/python3 - "$WORK/worker0.jsonl" "$WORK/again0.jsonl" <<'PY'
import json, statistics, sys
def steps(path):
    return [json.loads(l) for l in open(path) if l.startswith('{"step"')]
first, second = steps(sys.argv[1]), steps(sys.argv[2])
print("second job, first steps: " + ", ".join(
    "step %d v%d %.4f s" % (s["step"], s["schedule_version"], s["iteration_s"])
    for s in second[:4]))
base = [s["iteration_s"] for s in first[1:] if s["schedule_version"] == 0]
# Its plan's steps from step 2 (not the baseline blocks of its own check).
planned = [s["iteration_s"] for s in second[2:] if s["schedule_version"] > 0]
if base and planned:
    print("first job's baseline median %.4f s; second job's plan from step "
          "2: median %.4f s" % (statistics.median(base),
                                statistics.median(planned)))
PY

if [ -n "$METRICS" ]; then
  curl -s "http://127.0.0.1:$METRICS/metrics" 2>/dev/null \
    | grep -E "^tandem_(predicted|measured)_iteration_seconds|^tandem_replans_total" || true
fi
tandem_cli timeline "$JOB" -o "$WORK/timeline.json" || true
tandem_cli report "$JOB" -o "$WORK/report.html" || true
if [ -n "$PROM_URL" ]; then
  q() { curl -s --get "$PROM_URL/api/v1/query" --data-urlencode "query=$1" |
        /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(", ".join("%s=%s" % (s["metric"].get("rank", s["metric"].get("reason", "")), s["value"][1]) for s in r) or "-")' 2>/dev/null || echo "-"; }
  echo
  echo "prometheus ($PROM_URL), job $JOB (last values scraped):"
  echo "  overlap ratio by rank:    $(q "last_over_time(tandem_worker_overlap_ratio{job=\"$JOB\"}[10m])")"
  echo "  peak memory bytes:        $(q "last_over_time(tandem_worker_memory_bytes{job=\"$JOB\",kind=\"peak\"}[10m])")"
  echo "  re-plans by reason:       $(q "tandem_replans_total{job=\"$JOB\"} > 0")"
fi
echo
echo "where to look:"
[ -n "$PROM_URL" ] && echo "  prometheus:  $PROM_URL/graph?g0.expr=tandem_worker_overlap_ratio  (alerts: $PROM_URL/alerts)"
echo "  grafana:     import dashboards/grafana/*.json, with $PROM_URL as the Prometheus data source"
echo "  report:      $WORK/report.html (open in a browser; also http://127.0.0.1:$METRICS/jobs/$JOB while the coordinator runs)"
echo "  timeline:    $WORK/timeline.json (open in https://ui.perfetto.dev)"
if [ -t 0 ] && [ -n "$PROM_URL" ] && [ "${TANDEM_DEMO_WAIT:-1}" = "1" ]; then
  read -r -p "press Enter to stop the coordinator and Prometheus " _ || true
fi
exit $status
