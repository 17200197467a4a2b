"""Every Grafana dashboard in dashboards/grafana type-checks against
Grafana's published schema types (npm @grafana/schema) with tsc, installed
here by npm into dashboards/typecheck/node_modules (git-ignored; reused while
the pinned versions match). Each dashboard is written as an object literal
of dashboards/typecheck/tandem-dashboard.ts's type, so wrong field types,
unknown fields and misspelled enum values fail; a planted mistake proves the
check can fail."""

import json
import pathlib
import re
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
TYPECHECK = DASHBOARDS / "typecheck"
GENERATED = TYPECHECK / "generated"


def npm_install():
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is missing: install Debian's nodejs and npm "
                    "(scripts/test.sh does)")
    wanted = json.loads((TYPECHECK / "package.json").read_text())[
        "devDependencies"]
    installed = {}
    for name in wanted:
        meta = TYPECHECK / "node_modules" / name / "package.json"
        if meta.is_file():
            installed[name] = json.loads(meta.read_text())["version"]
    if installed != wanted:
        r = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--no-package-lock",
             "--loglevel=error"], cwd=TYPECHECK, capture_output=True,
            text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
    return TYPECHECK / "node_modules" / ".bin" / "tsc"


def write_ts(name, dashboard_text):
    ident = re.sub(r"\W", "_", name)
    (GENERATED / (ident + ".ts")).write_text(
        "import { asGrafana, type TandemDashboard } from "
        "'../tandem-dashboard';\n\n"
        "const dashboard: TandemDashboard = %s;\n\n"
        "export const %s = asGrafana(dashboard);\n" % (dashboard_text, ident))


def tsc(binary):
    r = subprocess.run([str(binary), "-p", str(TYPECHECK / "tsconfig.json")],
                       capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


@pytest.fixture(scope="module")
def compiler():
    binary = npm_install()
    yield binary
    shutil.rmtree(GENERATED, ignore_errors=True)


def fresh_generated():
    shutil.rmtree(GENERATED, ignore_errors=True)
    GENERATED.mkdir()


def test_dashboards_typecheck_against_grafana_schema(compiler):
    fresh_generated()
    paths = sorted((DASHBOARDS / "grafana").glob("*.json"))
    assert len(paths) >= 2
    for p in paths:
        write_ts(p.stem, p.read_text())
    rc, out = tsc(compiler)
    assert rc == 0, out


@pytest.mark.parametrize("mistake", [
    # A number where the schema wants a string, and the reverse.
    ("schemaVersion", lambda d: d.update(schemaVersion="39")),
    ("gridPos.h", lambda d: d["panels"][1]["gridPos"].update(h="8")),
    # An enum value that does not exist.
    ("variable type", lambda d: d["templating"]["list"][1].update(
        type="quary")),
    # A misspelled Prometheus query field.
    ("target expr", lambda d: d["panels"][1]["targets"][0].update(
        exp=d["panels"][1]["targets"][0].pop("expr"))),
])
def test_planted_mistake_fails_the_check(compiler, mistake):
    label, plant = mistake
    fresh_generated()
    dashboard = json.loads(
        (DASHBOARDS / "grafana" / "tandem-job-overview.json").read_text())
    plant(dashboard)
    write_ts("broken", json.dumps(dashboard, indent=2))
    rc, out = tsc(compiler)
    assert rc != 0, "tsc accepted a dashboard with a wrong %s" % label
    assert "generated/broken.ts" in out, out
