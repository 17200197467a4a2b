"""The container image, run as a user would run it: scripts/image.sh builds
tandem:VERSION (mmdebstrap rootfs from Debian packages, imported with
podman, Tandem's own Debian package installed by dpkg and the Python client
on top), then podman runs a coordinator container, a client container that
submits a job and watches it, and two worker containers that train it to
completion, all from the image, on the host network (loopback only); and
one container walks a newcomer's path on a fresh machine with the package
installed: the coordinator by its bare name, `tandem launch --nproc 2`
(which finds the installed tandem-worker on PATH), `tandem status` and
`tandem report`.

How podman runs here: with runc (Debian's crun 1.8 refuses this machine's
cgroups, v1 with an empty v2 hierarchy beside it: "cgroups in hybrid mode
not supported"), and with the open-files and process limits set below the
host's (podman raises them to 1048576 by default, and this sandbox refuses
setting a limit to its hard maximum: "setrlimit RLIMIT_NPROC: Operation
not permitted"). deploy/k8s/README.md, "The image", has the same notes."""

import os
import re
import resource
import shutil
import subprocess
import uuid

import pytest
import yaml

from processes import REPO, build_dir, free_port

IMAGE_SH = REPO / "scripts" / "image.sh"
MAX_IMAGE_BYTES = 1.5e9
SPEC = {
    "name": "image-e2e",
    "model": {"preset": "llama", "layers": 2, "d_model": 64, "heads": 4,
              "ffn": 128, "vocab": 256},
    "batch": {"micro_batch": 2, "seq_len": 32},
    "parallel": {"world_size": 2},
    "train": {"steps": 12},
    "optimize": {"warmup_steps": 3},
}


def _below_host(kind, cap):
    """A limit podman may set here: `cap`, and below the host's own."""
    soft, _ = resource.getrlimit(kind)
    n = cap if soft == resource.RLIM_INFINITY else min(cap, soft - 1)
    return "%d:%d" % (n, n)


def podman_base():
    return ["podman", "--runtime", "runc"]


def run_flags():
    return ["--network=host",
            "--ulimit", "nofile=" + _below_host(resource.RLIMIT_NOFILE, 16384),
            "--ulimit", "nproc=" + _below_host(resource.RLIMIT_NPROC, 8192)]


def podman(*args, timeout=120, check=True):
    r = subprocess.run(podman_base() + [str(a) for a in args],
                       capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError("podman %s failed (%d): %s" %
                             (" ".join(map(str, args)), r.returncode,
                              r.stderr[-3000:]))
    return r


@pytest.fixture(scope="module")
def image():
    if os.geteuid() != 0:
        pytest.skip("scripts/image.sh needs root (mmdebstrap, podman's "
                    "system storage)")
    env = dict(os.environ, TANDEM_BUILD_DIR=str(build_dir()))
    r = subprocess.run(["bash", str(IMAGE_SH)], capture_output=True,
                       text=True, timeout=1800, env=env)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    m = re.search(r"^image: (\S+) id (\S+) size (\d+) bytes", r.stdout, re.M)
    assert m, r.stdout[-2000:]
    ref, size = m.group(1), int(m.group(3))
    print("\nimage %s: %d bytes (%.2f GB)" % (ref, size, size / 1e9))
    # podman must be able to run a container here; if it cannot, say why.
    probe = subprocess.run(podman_base() + ["run", "--rm"] + run_flags() +
                           [ref, "true"], capture_output=True, text=True,
                           timeout=120)
    if probe.returncode != 0:
        pytest.fail("podman cannot run containers on this machine: %s" %
                    probe.stderr.strip())
    return {"ref": ref, "size": size}


def test_image_size_under_limit(image):
    assert image["size"] < MAX_IMAGE_BYTES, image


def test_image_has_the_binaries_and_client(image):
    r = podman("run", "--rm", *run_flags(), image["ref"], "sh", "-c",
               "for b in tandem-coordinator tandem-worker tandem-health "
               "tandem-plan tandem-graph tandem; do command -v $b; done; id -u")
    lines = r.stdout.split()
    # The binaries from the package (dpkg), the CLI from pip.
    assert lines[:6] == ["/usr/bin/" + b for b in (
        "tandem-coordinator", "tandem-worker", "tandem-health", "tandem-plan",
        "tandem-graph")] + ["/usr/local/bin/tandem"], r.stdout
    assert lines[6] == "10001"  # not root
    r = podman("run", "--rm", *run_flags(), image["ref"], "dpkg-query", "-W",
               "-f", "${Package} ${Version} ${Status}", "tandem")
    assert r.stdout.startswith("tandem ") and \
        r.stdout.endswith("install ok installed"), r.stdout
    r = podman("run", "--rm", *run_flags(), image["ref"], "tandem-worker",
               "--help")
    assert "--coordinator" in r.stdout


def test_job_runs_to_completion_from_the_image(image, tmp_path):
    tag = uuid.uuid4().hex[:8]
    port, metrics = free_port(), free_port()
    address = "127.0.0.1:%d" % port
    data = tmp_path / "coordinator"
    data.mkdir()
    shutil.chown(data, 10001, 10001)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    spec.chmod(0o644)
    names = []

    def start(name, *command):
        names.append(name)
        podman("run", "-d", "--name", name, *run_flags(), *command)

    try:
        start("tandem-coordinator-" + tag,
              "-v", "%s:/var/lib/tandem" % data, image["ref"],
              "tandem-coordinator", "--listen", address, "--db",
              "/var/lib/tandem/tandem.db", "--metrics-listen",
              "127.0.0.1:%d" % metrics)
        health = podman("run", "--rm", *run_flags(), image["ref"],
                        "tandem-health", "--wait", "30", address, timeout=60,
                        check=False)
        assert health.returncode == 0, (
            health.stderr, podman("logs", names[0], check=False).stderr)

        submit = podman("run", "--rm", *run_flags(), "-v",
                        "%s:/job.yaml:ro" % spec, image["ref"], "tandem",
                        "--coordinator", address, "submit", "-q", "/job.yaml")
        job = submit.stdout.strip()
        assert job.startswith("image-e2e-"), submit.stdout
        for rank in range(2):
            start("tandem-worker-%d-%s" % (rank, tag), "-e",
                  "OPENBLAS_NUM_THREADS=1", image["ref"], "tandem-worker",
                  "--coordinator", address, "--job", job, "--rank", rank,
                  "--threads", "1")
        watch = podman("run", "--rm", *run_flags(), image["ref"], "tandem",
                       "--coordinator", address, "watch", job, timeout=300,
                       check=False)
        logs = {n: podman("logs", n, check=False).stderr[-2000:]
                for n in names}
        assert watch.returncode == 0, (watch.stdout[-2000:], watch.stderr,
                                       logs)
        assert "job %s SUCCEEDED after 12 steps" % job in watch.stdout
        status = podman("run", "--rm", *run_flags(), image["ref"], "tandem",
                        "--coordinator", address, "status", job)
        assert re.search(r"^schedule\s+v[1-9]", status.stdout, re.M), \
            status.stdout
        # The workers exit 0 once the job ended, and the coordinator's
        # database is on the volume.
        for n in names[1:]:
            code = podman("wait", n, timeout=90).stdout.strip()
            assert code == "0", (n, code, logs[n])
        assert (data / "tandem.db").is_file()
    finally:
        for n in names:
            podman("rm", "-f", "-t", "2", n, check=False)


# A newcomer's first job on a machine with the package installed, all in one
# container as on one host: the coordinator by its bare name, `tandem
# launch` starting the installed workers, then status and the report.
NEWCOMER = r"""
set -e
cd /tmp
cat > job.yaml <<'EOF'
%(spec)s
EOF
export TANDEM_COORDINATOR=127.0.0.1:%(port)d
tandem-coordinator --listen $TANDEM_COORDINATOR --db /tmp/tandem.db \
  > coordinator.log 2>&1 &
tandem-health --wait 30 $TANDEM_COORDINATOR
tandem launch --nproc 2 job.yaml > launch.out 2>&1 ||
  { cat launch.out; tail -20 coordinator.log; exit 1; }
cat launch.out
job=$(sed -n 's/^submitted job \([^;:]*\).*/\1/p' launch.out)
echo "JOB $job"
tandem status "$job"
tandem report "$job" -o /tmp/report.html
echo "REPORT $(wc -c < /tmp/report.html)"
"""


def test_newcomer_path_in_the_image(image):
    spec = dict(SPEC, name="newcomer")
    r = podman("run", "--rm", *run_flags(), "-e", "OPENBLAS_NUM_THREADS=1",
               image["ref"], "sh", "-c",
               NEWCOMER % {"spec": yaml.safe_dump(spec), "port": free_port()},
               timeout=600, check=False)
    out = r.stdout
    assert r.returncode == 0, (out[-3000:], r.stderr[-2000:])
    # launch found the installed worker, not a build tree's.
    assert "started 2 workers (/usr/bin/tandem-worker)" in out, out[-3000:]
    m = re.search(r"^JOB (newcomer-\S+)$", out, re.M)
    assert m, out[-3000:]
    assert "job %s SUCCEEDED after 12 steps" % m.group(1) in out
    assert re.search(r"^state\s+SUCCEEDED", out, re.M), out[-3000:]
    assert re.search(r"^schedule\s+v[1-9]", out, re.M), out[-3000:]
    size = int(re.search(r"^REPORT (\d+)$", out, re.M).group(1))
    assert size > 10000, out[-2000:]
