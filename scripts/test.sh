#!/usr/bin/env bash
# Runs every Tandem test: setup (packages + build), then ctest, then pytest for
# the Python client once it has tests. Exits non-zero on any failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${TANDEM_BUILD_DIR:-$ROOT/build}"

"$ROOT/scripts/setup.sh"

status=0

# Installs Debian packages when COMMAND is not on PATH; fails when it cannot.
install_for() {  # COMMAND PACKAGE...
  local cmd=$1; shift
  command -v "$cmd" >/dev/null 2>&1 && return 0
  local sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_=sudo
  $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "$@"
}

# pytest on FILES in tests/e2e.
e2e() {
  (cd "$ROOT/tests/e2e" && TANDEM_BUILD_DIR="$BUILD_DIR" \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider "$@")
}

echo "== ctest"
(cd "$BUILD_DIR" && ctest --output-on-failure -j"${TANDEM_JOBS:-2}") || status=1

if compgen -G "$ROOT/client/python/tests/test_*.py" >/dev/null; then
  echo "== pytest"
  # Debian's python3 sees the python3-grpcio/protobuf packages.
  (cd "$ROOT/client/python" && /usr/bin/python3 -m pytest -q tests) || status=1
fi

echo "== integration (real coordinator and worker processes)"
(cd "$ROOT/tests/integration" && TANDEM_BUILD_DIR="$BUILD_DIR" \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider .) || status=1

echo "== exported models against PyTorch eager (tandem export, standalone workers)"
(cd "$ROOT/tests/export" && TANDEM_BUILD_DIR="$BUILD_DIR" \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider .) || status=1

echo "== bench/e2e and bench/overhead: the drivers' selection and reports (synthetic rounds, rows and traces)"
(cd "$ROOT/tests/unit/bench" && /usr/bin/python3 -m pytest -q -p no:cacheprovider .) || status=1

echo "== deploy/k8s offline checks (kustomize, kubernetes-models, kubernetes-types + tsc)"
(cd "$ROOT/tests/unit/deploy/k8s" && TANDEM_BUILD_DIR="$BUILD_DIR" \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider .) || status=1

echo "== e2e: Slurm (munged, slurmctld, two slurmd started by the test)"
e2e test_slurm.py || status=1

echo "== e2e: observability (Prometheus scraping a coordinator and 2 workers; promtool; dashboards tsc)"
# The dashboards' type check installs @grafana/schema and typescript with npm.
install_for npm nodejs npm || true
e2e test_prometheus.py test_dashboards_typecheck.py || status=1

echo "== e2e: container image (scripts/image.sh builds tandem:VERSION; a coordinator, 2 workers and the CLI run from it under podman)"
e2e test_image.py || status=1

echo "== e2e: job report (tandem report and /jobs/JOB from a finished job, rendered in headless Chromium)"
install_for chromium chromium || status=1
e2e test_report.py || status=1
echo "report screenshot: $BUILD_DIR/test-output/report/report.png"

echo "== fuzz: libFuzzer targets under ASan+UBSan, 30 s each, after their reproducers (tests/fuzz)"
"$ROOT/scripts/fuzz.sh" --seconds "${TANDEM_FUZZ_SECONDS:-30}" || status=1

exit $status
