"""`tandem report` as a person sees it: a real coordinator and two
agent-mode workers train a small job to the end; the report comes from the
CLI and from /jobs/JOB on the coordinator's metrics port, and Debian's
headless Chromium renders it: every chart drew data, the page raised no
error and loaded nothing, and a screenshot of the whole page is saved in
the test output (build/test-output/report/, printed)."""

import copy
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

import browser
from processes import (COORDINATOR, REPO, WORKER, Process, build_dir,
                       http_get, start_coordinator, wait_for)

CLIENT = REPO / "client" / "python"
SPEC = {
    "name": "e2e-report",
    "model": {"preset": "llama", "layers": 2, "d_model": 64, "heads": 4,
              "ffn": 128, "vocab": 256},
    "batch": {"micro_batch": 2, "seq_len": 32},
    "parallel": {"world_size": 2},
    "train": {"steps": 24},
    "memory": {"budget_bytes": 1 << 31},
    "optimize": {"warmup_steps": 3},
}
CHARTS = {"loss", "iteration-time", "throughput", "peak-by-step",
          "predicted-vs-measured", "exposed-communication", "overlap",
          "memory", "timeline"}


def output_dir():
    d = build_dir() / "test-output" / "report"
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def finished_job(tmp_path_factory):
    """A job trained to SUCCEEDED: its id, the coordinator's address and
    metrics address, and the work folder."""
    for binary in (COORDINATOR, WORKER):
        if not binary.is_file():
            pytest.skip("%s is not built (scripts/setup.sh builds it)" %
                        binary)
    sys.path.insert(0, str(CLIENT))
    import tandem

    work = tmp_path_factory.mktemp("report-e2e")
    procs = []
    try:
        coordinator, address, metrics = start_coordinator(work)
        procs.append(coordinator)
        client = tandem.Client(address, timeout=10)
        job = client.submit(copy.deepcopy(SPEC))
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        for rank in range(2):
            procs.append(Process(
                [WORKER, "--coordinator", address, "--job", job.id,
                 "--rank", rank, "--threads", "1"],
                work / ("worker%d.log" % rank), env=env))
        final = wait_for(
            lambda: (lambda j: j if tandem.is_terminal(j.state) else None)(
                client.get(job.id)[0]), 240, "the job to end")
        assert tandem.state_name(final.state) == "SUCCEEDED", (
            procs[1].log(), procs[2].log())
        assert final.schedule_version >= 1, "no planned schedule ran"
        client.close()
        yield {"job": job.id, "address": address, "metrics": metrics,
               "work": work, "procs": procs}
    finally:
        for p in reversed(procs):
            p.stop()


def run_cli(address, *args):
    return subprocess.run(
        [sys.executable, "-m", "tandem", "--coordinator", address] +
        [str(a) for a in args], cwd=str(CLIENT), capture_output=True,
        text=True, timeout=60)


def charts_in(html):
    return set(re.findall(r'<svg class="chart" data-chart="([^"]+)"', html))


def test_cli_report_renders_in_chromium_every_chart_drawn(finished_job):
    why = browser.missing()
    if why:
        pytest.skip(why)
    out = output_dir()
    html_path = out / "report.html"
    r = run_cli(finished_job["address"], "report", finished_job["job"], "-o",
                html_path)
    assert r.returncode == 0, r.stderr
    assert "wrote the report of job %s to %s" % (finished_job["job"],
                                                 html_path) in r.stdout
    html = html_path.read_text(encoding="utf-8")
    assert finished_job["job"] in html
    assert charts_in(html) == CHARTS
    # Self-contained: no script, nothing from the network.
    assert "<script" not in html.lower()
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html)

    shot = out / "report.png"
    if shot.exists():
        shot.unlink()
    seen = browser.render(html_path, shot)
    print("\nreport screenshot: %s (%d px high)" % (shot, seen["height"]))
    assert seen["errors"] == [], seen["errors"]
    assert seen["console"] == [], seen["console"]
    assert seen["resources"] == [], seen["resources"]
    drawn = {c["chart"]: c for c in seen["charts"]}
    assert set(drawn) == CHARTS
    for name, c in drawn.items():
        assert c["width"] > 100 and c["height"] > 50, (name, c)
        assert c["marks"] > 0 and c["drawn"] > 0, (name, c)
    assert shot.stat().st_size > 10000


def test_report_served_on_the_metrics_port(finished_job):
    url = "http://%s/jobs/%s" % (finished_job["metrics"], finished_job["job"])
    html = http_get(url)
    assert finished_job["job"] in html
    assert charts_in(html) == CHARTS
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen("http://%s/jobs/no-such-job" %
                               finished_job["metrics"], timeout=10)
    assert e.value.code == 404
    assert "no-such-job" in e.value.read().decode()


def test_cli_report_unknown_job_says_so(finished_job, tmp_path):
    target = tmp_path / "r.html"
    r = run_cli(finished_job["address"], "report", "no-such-job", "-o",
                target)
    assert r.returncode == 1
    assert "no-such-job" in r.stderr
    assert not target.exists()


def test_status_schedule_versions_of_the_finished_job(finished_job):
    address, job = finished_job["address"], finished_job["job"]
    r = run_cli(address, "status", job, "--events", "3")
    assert r.returncode == 0, r.stderr
    # Both ranks, from the real workers' registrations: this host, cpu, the
    # last step, their sessions closed once the job ended.
    for rank in (0, 1):
        assert re.search(r"^\s+%d\s+\S+\s+cpu\s+\S+\s+2[34]\s+closed\s+"
                         r"\d+[smh] ago$" % rank, r.stdout, re.M), r.stdout
    assert re.search(r"^events \(the last 3 of \d+; --events N for more\):$",
                     r.stdout, re.M), r.stdout

    r = run_cli(address, "schedule", job, "--version", "0")
    assert r.returncode == 0, r.stderr
    assert re.match(r"schedule v0 graph=\S+", r.stdout), r.stdout[:200]
    assert "provenance" not in r.stdout or "baseline" in r.stdout
    active = run_cli(address, "schedule", job)
    assert active.returncode == 0 and active.stdout != r.stdout
    r = run_cli(address, "schedule", job, "--version", "99")
    assert r.returncode == 1
    assert re.search(r"has no schedule v99; it has v0 \(the baseline\), v1",
                     r.stderr), r.stderr


def test_timeline_and_report_survive_a_coordinator_restart(finished_job,
                                                           tmp_path):
    """Last in the module: it replaces the fixture's coordinator."""
    work = finished_job["work"]
    finished_job["procs"][0].stop()
    restarted, address, metrics = start_coordinator(work)
    finished_job["procs"][0] = restarted
    job = finished_job["job"]
    trace = tmp_path / "trace.json"
    r = run_cli(address, "timeline", job, "-o", trace)
    assert r.returncode == 0, r.stderr
    assert "rank 0: step" in r.stdout and "rank 1: step" in r.stdout
    html = http_get("http://%s/jobs/%s" % (metrics, job))
    assert charts_in(html) == CHARTS
