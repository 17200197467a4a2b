"""Observability against the real things: Debian's Prometheus scrapes a
running coordinator and two agent-mode workers on loopback (1 s scrape
interval), and every query of every Grafana dashboard panel returns data;
promtool checks the configs, the rules and both exporters' output, and runs
the alert rules' unit tests; the Kubernetes pod-annotation config relabels
pods as intended."""

import copy
import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from processes import (COORDINATOR, WORKER, Process, free_port, http_get,
                       start_coordinator, wait_for)

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
DASHBOARDS = REPO / "dashboards"
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"

# Small and slow enough to be scraped many times; cancelled at the end.
SPEC = {
    "model": {"preset": "llama", "layers": 2, "d_model": 64, "heads": 4,
              "ffn": 128, "vocab": 256},
    "batch": {"micro_batch": 2, "seq_len": 32},
    "parallel": {"world_size": 2},
    "train": {"steps": 1000000},
    "memory": {"budget_bytes": 1 << 31},
    # No trials: a lost trial's plan is never published again, and the
    # re-plan the fixture asks for may be that plan (CI, 2026-11-28).
    "optimize": {"warmup_steps": 3, "drift_threshold": 0.5,
                 "drift_window": 4, "trial_margin": 0},
}
# Grafana's built-in variables, as Grafana would fill them for a 1 s
# scrape interval and a short range.
BUILTINS = {"$__rate_interval": "5s", "$__interval": "2s", "$__range": "5m"}


class Prometheus(Process):
    def __init__(self, config, workdir):
        self.port = free_port()
        super().__init__(
            [PROMETHEUS, "--config.file", config,
             "--storage.tsdb.path", workdir / "data",
             "--web.listen-address", "127.0.0.1:%d" % self.port,
             "--log.level", "warn"],
            workdir / "prometheus.log")
        self.url = "http://127.0.0.1:%d" % self.port
        wait_for(self.ready, 30, "Prometheus ready")

    def ready(self):
        if self.proc.poll() is not None:
            raise AssertionError("prometheus exited: " + self.log())
        try:
            return "Ready" in http_get(self.url + "/-/ready", timeout=2)
        except OSError:
            return False

    def api(self, path, **params):
        url = "%s/api/v1/%s?%s" % (self.url, path,
                                   urllib.parse.urlencode(params, doseq=True))
        body = json.loads(http_get(url))
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr):
        return self.api("query", query=expr)["result"]


def write_targets(path, targets):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(targets))
    tmp.rename(path)


def local_config(workdir, scrape_interval="1s"):
    """dashboards/prometheus/prometheus-local.yml laid out as demo.sh does:
    config, rules and targets/ in one directory."""
    config = yaml.safe_load(
        (DASHBOARDS / "prometheus" / "prometheus-local.yml").read_text())
    config["global"]["scrape_interval"] = scrape_interval
    config["global"]["evaluation_interval"] = scrape_interval
    shutil.copy(DASHBOARDS / "alerts" / "tandem-alerts.yml", workdir)
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    for binary in (COORDINATOR, WORKER):
        if not binary.is_file():
            pytest.skip("%s is not built (scripts/setup.sh builds it)" %
                        binary)
    for tool in (PROMETHEUS, PROMTOOL):
        if not os.access(tool, os.X_OK):
            pytest.skip("%s is missing (Debian package prometheus)" % tool)
    import tandem  # client/python, on the path by tests/pytest.ini

    work = tmp_path_factory.mktemp("prometheus-e2e")
    procs = []
    try:
        coordinator, address, coordinator_metrics = start_coordinator(work)
        procs.append(coordinator)

        client = tandem.Client(address, timeout=10)
        spec = copy.deepcopy(SPEC)
        spec["name"] = "e2e-prometheus"
        job = client.submit(spec)
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        workers = []
        for rank in range(2):
            w = Process([WORKER, "--coordinator", address, "--job", job.id,
                         "--rank", rank, "--threads", "1",
                         "--metrics-listen", "127.0.0.1:0"],
                        work / ("worker%d.log" % rank), env=env)
            procs.append(w)
            port = w.wait_log(r"metrics on port (\d+)").group(1)
            workers.append("127.0.0.1:%s" % port)

        prom_dir = work / "prometheus"
        prom_dir.mkdir()
        config = local_config(prom_dir)
        write_targets(prom_dir / "targets" / "coordinator.json",
                      [{"targets": [coordinator_metrics],
                        "labels": {"component": "coordinator"}}])
        write_targets(prom_dir / "targets" / "workers.json",
                      [{"targets": [t], "labels": {
                          "component": "worker", "tandem_job": job.id,
                          "rank": str(r)}} for r, t in enumerate(workers)])
        prometheus = Prometheus(config, prom_dir)
        procs.append(prometheus)
        started = time.time()

        # The loop closed (a planned schedule is running on both ranks), and
        # Prometheus saw it: several scrapes of every target since.
        wait_for(lambda: client.get(job.id)[0].schedule_version >= 1, 180,
                 "schedule v1 active")
        wait_for(lambda: prometheus.query(
            'min(tandem_worker_schedule_version{job="%s"}) >= 1' % job.id),
            60, "Prometheus scraped schedule v1 from both ranks")
        # A re-plan while Prometheus watches: planning passes and re-plans
        # move inside the dashboards' time range.
        # Re-plan only once Prometheus has scraped the coordinator's counters,
        # so the re-plan shows up as an increase (a drift re-plan may already
        # have happened before the first scrape on a fast machine).
        wait_for(lambda: prometheus.query(
            'tandem_replans_total{job="%s"}' % job.id), 60,
            "Prometheus scraped the coordinator's re-plan counters")
        before = client.get(job.id)[0].schedule_version
        client.reoptimize(job.id, reason="reoptimize")
        wait_for(lambda: prometheus.query(
            'min(tandem_worker_schedule_version{job="%s"}) >= %d'
            % (job.id, before + 1)),
            120, "Prometheus scraped the re-planned schedule from both ranks")
        wait_for(lambda: prometheus.query(
            'sum(increase(tandem_replans_total{job="%s"}[1m])) > 0' % job.id),
            60, "Prometheus saw the re-plan counter rise")
        wait_for(lambda: len(prometheus.query(
            'count_over_time(up[1m]) >= 8')) == 3, 60,
            "8 scrapes of each of the 3 targets")
        yield {"prometheus": prometheus, "job": job.id, "client": client,
               "coordinator_metrics": coordinator_metrics,
               "workers": workers, "started": started, "work": work,
               "prom_dir": prom_dir}
        client.cancel(job.id, reason="e2e test done")
        client.close()
    finally:
        for p in reversed(procs):
            p.stop()


def substitute(expr, job, rank_regex=".*"):
    expr = expr.replace("$job", job).replace("$rank", rank_regex)
    for name, value in BUILTINS.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


def dashboards():
    return sorted((DASHBOARDS / "grafana").glob("*.json"))


def panels(dashboard):
    for p in dashboard.get("panels", []):
        yield p
        yield from p.get("panels", [])


def wait_until(predicate, seconds):
    """Whether `predicate` held within `seconds` (polled)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


def has_value(result):
    for series in result:
        values = [series["value"]] if "value" in series else series["values"]
        if any(math.isfinite(float(v)) for _, v in values):
            return True
    return False


def test_every_dashboard_panel_query_returns_data(stack):
    prom = stack["prometheus"]
    checked, empty = 0, []
    for path in dashboards():
        for panel in panels(json.loads(path.read_text())):
            for target in panel.get("targets", []):
                expr = substitute(target["expr"], stack["job"])
                # Each rank on its own, and all of them.
                for rank in ([".*", "0", "1"] if "$rank" in target["expr"]
                             else [".*"]):
                    e = substitute(target["expr"], stack["job"], rank)
                    checked += 1
                    if has_value(prom.query(e)):
                        continue
                    # The speedup is NaN until the active plan has been
                    # measured interleaved with the baseline (never the
                    # previous version's figure): an empty panel is right
                    # exactly when the coordinator says so.
                    if "tandem_schedule_speedup_ratio" in e:
                        job = stack["client"].get(stack["job"])[0]
                        if (job.measured_speedup == 0
                                and job.speedup_text.startswith("not measured")):
                            continue
                        # Measured since the query: the next scrapes have it.
                        if job.measured_speedup > 0 and wait_until(
                                lambda: has_value(prom.query(e)), 10):
                            continue
                    empty.append("%s / %s: %s" % (path.name,
                                                  panel["title"], e))
                assert expr
    assert checked >= 30
    assert not empty, "panel queries without data:\n" + "\n".join(empty)


def test_annotation_queries_mark_schedule_changes(stack):
    prom = stack["prometheus"]
    for path in dashboards():
        for a in json.loads(path.read_text())["annotations"]["list"]:
            if "target" not in a:
                continue
            expr = substitute(a["target"]["expr"], stack["job"])
            end = time.time()
            data = prom.api("query_range", query=expr,
                            start=stack["started"], end=end, step="1s")
            if has_value(data["result"]):
                continue
            # Say what Prometheus saw: the versions and the failed scrapes.
            seen = prom.api(
                "query_range", start=stack["started"], end=end, step="1s",
                query='tandem_worker_schedule_version{job="%s"}'
                % stack["job"])["result"]
            failed = prom.query('count_over_time((up == 0)[10m:1s])')
            raise AssertionError("%s / %s: no annotation from %s\n"
                                 "versions: %s\nfailed scrapes: %s" % (
                                     path.name, a["name"], expr,
                                     [(s["metric"].get("rank"),
                                       sorted({v for _, v in s["values"]}))
                                      for s in seen], failed))


def test_template_variables_list_the_job_and_ranks(stack):
    prom = stack["prometheus"]
    for path in dashboards():
        for v in json.loads(path.read_text())["templating"]["list"]:
            if v["type"] != "query":
                continue
            query = v["query"]["query"]
            m = re.fullmatch(r"label_values\((.*), (\w+)\)", query)
            assert m, query
            selector = substitute(m.group(1), stack["job"])
            values = prom.api("label/%s/values" % m.group(2),
                              **{"match[]": selector})
            expected = {"job": [stack["job"]], "rank": ["0", "1"]}[
                m.group(2)]
            for e in expected:
                assert e in values, (path.name, v["name"], values)


def test_every_target_is_up(stack):
    targets = stack["prometheus"].api("targets")["activeTargets"]
    assert {t["labels"]["job"] for t in targets} == {"tandem-coordinator",
                                                     "tandem-workers"}
    assert len(targets) == 3
    assert all(t["health"] == "up" for t in targets), targets
    # honor_labels: the exporters' job label (the Tandem job) wins.
    series = stack["prometheus"].query("tandem_worker_step")
    assert {s["metric"]["job"] for s in series} == {stack["job"]}
    assert {s["metric"]["rank"] for s in series} == {"0", "1"}


def promtool(*args, stdin=None, cwd=None):
    r = subprocess.run([PROMTOOL, *args], input=stdin, cwd=cwd,
                       capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def test_promtool_check_config_and_rules(stack):
    rc, out = promtool("check", "config", str(stack["prom_dir"] /
                                               "prometheus.yml"))
    assert rc == 0, out
    assert "SUCCESS" in out and "rule files found" in out, out
    rc, out = promtool("check", "rules",
                       str(DASHBOARDS / "alerts" / "tandem-alerts.yml"))
    assert rc == 0, out


def test_promtool_test_rules():
    if not os.access(PROMTOOL, os.X_OK):
        pytest.skip("promtool is missing")
    rc, out = promtool("test", "rules", "tandem-alerts_test.yml",
                       cwd=DASHBOARDS / "alerts")
    assert rc == 0 and "SUCCESS" in out, out


def test_promtool_check_metrics_on_both_exporters(stack):
    for address in [stack["coordinator_metrics"]] + stack["workers"]:
        text = http_get("http://%s/metrics" % address)
        assert "# TYPE" in text
        rc, out = promtool("check", "metrics", stdin=text)
        assert rc == 0 and not out.strip(), (address, out)


def test_k8s_pod_annotation_config_relabels_pods(stack, tmp_path):
    """Debian's Prometheus is built without Kubernetes service discovery, so
    the pods come from a file_sd file carrying the __meta_kubernetes_* labels
    Kubernetes SD would set; everything else (relabelling, honor_labels, the
    rules) is the real config, scraping the real exporters."""
    config = yaml.safe_load(
        (DASHBOARDS / "prometheus" / "prometheus-k8s.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    for sc in config["scrape_configs"]:
        assert sc.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        sc["file_sd_configs"] = [{"files": ["pods.json"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    shutil.copy(DASHBOARDS / "alerts" / "tandem-alerts.yml", tmp_path)

    def pod(name, address, component, scrape="true", phase="Running",
            index=None):
        host, port = address.split(":")
        labels = {
            "__meta_kubernetes_namespace": "tandem",
            "__meta_kubernetes_pod_name": name,
            "__meta_kubernetes_pod_phase": phase,
            "__meta_kubernetes_pod_label_app_kubernetes_io_name": "tandem",
            "__meta_kubernetes_pod_label_app_kubernetes_io_component":
                component,
            "__meta_kubernetes_pod_annotation_prometheus_io_scrape": scrape,
            "__meta_kubernetes_pod_annotation_prometheus_io_port": port,
            "__meta_kubernetes_pod_annotation_prometheus_io_path": "/metrics",
        }
        if index is not None:
            labels["__meta_kubernetes_pod_annotation_batch_kubernetes_io_"
                   "job_completion_index"] = str(index)
        # Kubernetes SD's address for a pod port nobody declared: the pod IP
        # with another port; the annotation picks the metrics port.
        return {"targets": ["%s:8081" % host], "labels": labels}

    write_targets(tmp_path / "pods.json", [
        pod("tandem-coordinator-0", stack["coordinator_metrics"],
            "coordinator"),
        pod("tandem-workers-0-abc", stack["workers"][0], "worker", index=0),
        pod("tandem-workers-1-def", stack["workers"][1], "worker", index=1),
        pod("unrelated", stack["workers"][1], "worker", scrape="false"),
        pod("tandem-workers-old", stack["workers"][0], "worker",
            phase="Succeeded", index=0),
    ])
    rc, out = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert rc == 0, out
    prom = Prometheus(tmp_path / "prometheus.yml", tmp_path)
    try:
        def scraped():
            up = prom.query("up == 1")
            return len(up) == 3 and up
        up = wait_for(scraped, 30, "3 pods scraped")
        by_pod = {s["metric"]["pod"]: s["metric"] for s in up}
        assert set(by_pod) == {"tandem-coordinator-0", "tandem-workers-0-abc",
                               "tandem-workers-1-def"}
        w1 = by_pod["tandem-workers-1-def"]
        assert w1["job"] == "tandem-workers"
        assert w1["rank"] == "1" and w1["component"] == "worker"
        assert w1["instance"] == stack["workers"][1]
        assert by_pod["tandem-coordinator-0"]["component"] == "coordinator"
        steps = wait_for(lambda: prom.query("tandem_worker_step"), 30,
                         "worker series")
        assert {s["metric"]["job"] for s in steps} == {stack["job"]}
    finally:
        prom.stop()
