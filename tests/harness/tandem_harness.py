"""The harness the Python system suites share (client/python/tests,
tests/integration, tests/e2e, tests/export) and bench/chaos: the built
binaries, a real tandem-coordinator process, tandem-worker processes in agent
mode, a scripted session that speaks WorkerService, and polling helpers. An
ordinary module: the suites import it (their pytest configuration puts
tests/harness on the path) and keep only their fixtures in conftest.py.

The binaries are $TANDEM_BUILD_DIR/..., default <repo>/build/...; a test
that needs one is skipped, saying so, only when it has not been built
(scripts/test.sh always builds them)."""

import os
import pathlib
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PY_ROOT = REPO / "client" / "python"
if str(PY_ROOT) not in sys.path:
    sys.path.insert(0, str(PY_ROOT))

from tandem import _gen  # noqa: E402

# A checkout that was not built with CMake yet: generate the stubs here.
_gen.ensure()

import grpc  # noqa: E402

from tandem.v1 import job_pb2  # noqa: E402
from tandem.v1 import worker_service_pb2 as wpb  # noqa: E402
from tandem.v1 import worker_service_pb2_grpc as wgrpc  # noqa: E402

EXAMPLE_SPEC = REPO / "deploy" / "local" / "tiny-llama.yaml"


def build_dir():
    env = os.environ.get("TANDEM_BUILD_DIR")
    if not env:
        return REPO / "build"
    p = pathlib.Path(env)
    if p.is_absolute():
        return p
    for base in (REPO, pathlib.Path.cwd()):
        if (base / p).is_dir():
            return base / p
    return REPO / p


def coordinator_binary():
    return build_dir() / "coordinator" / "tandem-coordinator"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def terminate(proc, timeout=10):
    """SIGTERM, then SIGKILL if `proc` has not exited within `timeout` s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Coordinator:
    """A tandem-coordinator process; `address` once started."""

    def __init__(self, binary, workdir, heartbeat_timeout_s=60, extra=(),
                 host="127.0.0.1"):
        self.binary = str(binary)
        self.extra = [str(a) for a in extra]
        self.host = host
        self.db = str(workdir / "tandem.db")
        self.log_path = workdir / "coordinator.log"
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.proc = None
        self.port = None
        self.metrics_port = None

    @property
    def address(self):
        return "%s:%d" % ("127.0.0.1" if self.host == "0.0.0.0" else self.host,
                          self.port)

    def start(self, port=0, timeout=20):
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [self.binary, "--listen", "%s:%d" % (self.host, port), "--db",
             self.db, "--heartbeat-timeout-s", str(self.heartbeat_timeout_s)]
            + self.extra,
            stdout=subprocess.PIPE, stderr=log, text=True)
        log.close()
        lines = queue.Queue()

        def drain(out):
            for line in out:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=drain, args=(self.proc.stdout,),
                         daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                raise RuntimeError("tandem-coordinator did not start; log:\n" +
                                   self.log_path.read_text())
            if "listening on port" in line:
                self.port = int(line.split("listening on port")[1].split()[0]
                                .rstrip(","))
                if "metrics on port" in line:
                    self.metrics_port = int(
                        line.split("metrics on port")[1].split()[0])
                return self

    def stop(self):
        if self.proc is None:
            return
        terminate(self.proc)
        self.proc = None

    def kill(self):
        """SIGKILL, as a crash."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


class DelayProxy:
    """A TCP proxy on loopback that delivers every byte `delay_s` after it
    arrived, in each direction: a link with a round trip of twice that,
    for whatever runs over it (TLS included; it does not look inside).
    `address` is its HOST:PORT; close() ends it and its connections."""

    def __init__(self, target_address, delay_s):
        host, port = target_address.rsplit(":", 1)
        self.target = (host, int(port))
        self.delay_s = delay_s
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.address = "127.0.0.1:%d" % self._listener.getsockname()[1]
        self._sockets = [self._listener]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._closed:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                return
            self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                chunks = queue.Queue()
                threading.Thread(target=self._read, args=(src, chunks),
                                 daemon=True).start()
                threading.Thread(target=self._deliver, args=(chunks, dst),
                                 daemon=True).start()

    def _read(self, src, chunks):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            chunks.put((time.monotonic() + self.delay_s, data))
            if not data:
                return

    def _deliver(self, chunks, dst):
        while True:
            due, data = chunks.get()
            time.sleep(max(0.0, due - time.monotonic()))
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return

    def close(self):
        self._closed = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        except OSError:
            pass
        for s in self._sockets:
            try:
                s.close()
            except OSError:
                pass


def require_coordinator_binary():
    binary = coordinator_binary()
    if not binary.is_file():
        pytest.skip("tandem-coordinator is not built at %s: build it with "
                    "`cmake --build build --target tandem-coordinator` (or "
                    "scripts/setup.sh), or set TANDEM_BUILD_DIR" % binary)
    return binary


def unique_name(prefix="t"):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:8])


def small_spec(name=None, world_size=2, steps=5, **overrides):
    """A valid job spec dict (tiny-llama sizes)."""
    spec = {
        "name": name or unique_name(),
        "model": {"preset": "tiny-llama"},
        "batch": {"micro_batch": 2, "seq_len": 32},
        "train": {"steps": steps},
        "parallel": {"world_size": world_size},
    }
    for section, values in overrides.items():
        if isinstance(values, dict):
            spec.setdefault(section, {}).update(values)
        else:
            spec[section] = values
    return spec


def worker_processes(job_id):
    """[(pid, argv as bytes)] of the tandem-worker processes of job `job_id`
    on this host (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"tandem-worker") and \
                job_id.encode() in args:
            found.append((int(entry), args))
    return found


def worker_pids(job_id):
    """Pids of the tandem-worker processes of job `job_id` on this host:
    what chaos tests kill."""
    return [pid for pid, _ in worker_processes(job_id)]


def wait_for(predicate, timeout=10.0, interval=0.05, what="condition"):
    """Polls predicate until it returns a true value. `what` names it in the
    timeout's message; a callable `what` is called then (e.g. to read logs
    as they are when the wait gives up)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %gs waiting for %s" %
                                 (timeout, what() if callable(what) else what))
        time.sleep(interval)


def wait_for_state(client, job_id, state, timeout=10.0):
    return wait_for(lambda: client.get(job_id).job.state == state,
                    timeout=timeout,
                    what="job %s to be %s" % (job_id,
                                              job_pb2.JobState.Name(state)))


class ScriptedSession:
    """Registers as one rank of a job and opens a session stream, like
    tandem-worker's agent, but sends only what a test writes: progress,
    graphs, profiles, errors, malformed messages. It has no behaviour of a
    worker's (no steps, no schedule switches, no profile windows): the one
    fake worker that has is bench/load/fake_worker.h's, which the load bench
    and the coordinator's RPC tests run."""

    def __init__(self, address, job_id, rank):
        self.job_id = job_id
        self.channel = grpc.insecure_channel(address)
        self.stub = wgrpc.WorkerServiceStub(self.channel)
        self.incarnation = uuid.uuid4().hex
        r = self.stub.Register(wpb.RegisterRequest(
            job_id=job_id, incarnation=self.incarnation,
            hostname="fake-%d" % rank, requested_rank=rank, device="cpu"),
            timeout=10)
        self.rank = r.rank
        self.world_size = r.world_size
        self.received = []
        self._outbox = queue.Queue()
        self._outbox.put(wpb.WorkerMessage(hello=wpb.SessionHello(
            job_id=job_id, rank=self.rank, incarnation=self.incarnation)))
        self._call = self.stub.Session(iter(self._outbox.get, None))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        try:
            for m in self._call:
                self.received.append(m)
        except grpc.RpcError:
            pass

    def send(self, **payload):
        self._outbox.put(wpb.WorkerMessage(**payload))

    def progress(self, step, loss, iteration_s=0.05, version=0):
        self.send(progress=wpb.IterationProgress(
            step=step, loss=loss, iteration_s=iteration_s,
            schedule_version=version))

    def heartbeat(self):
        self.send(heartbeat=wpb.Heartbeat(time_unix_s=time.time()))

    def commands(self):
        return [m.command for m in self.received if m.HasField("command")]

    def close(self):
        self._outbox.put(None)
        self._reader.join(timeout=5)
        self._call.cancel()
        self.channel.close()


def run_cli(*args, address=None, env=None, timeout=60, input=None):
    """Runs `python3 -m tandem ARGS` from the source tree."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(PY_ROOT)
    full_env.pop("TANDEM_COORDINATOR", None)
    if env:
        full_env.update(env)
    cmd = [sys.executable, "-m", "tandem"]
    if address:
        cmd += ["--coordinator", address]
    return subprocess.run(cmd + [str(a) for a in args], capture_output=True,
                          text=True, env=full_env, timeout=timeout,
                          cwd=str(PY_ROOT), input=input)


def worker_binary():
    return build_dir() / "worker" / "tandem-worker"


class Worker:
    """A tandem-worker process in agent mode, one thread, its step lines in
    workerR.jsonl and its log in workerR.log under `workdir`."""

    def __init__(self, workdir, coordinator, job_id, rank, extra=(),
                 env_extra=None):
        self.log_path = workdir / ("worker%d.log" % rank)
        self.out_path = workdir / ("worker%d.jsonl" % rank)
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        env.update(env_extra or {})
        self.proc = subprocess.Popen(
            [str(worker_binary()), "--coordinator", coordinator.address,
             "--job", job_id, "--rank", str(rank), "--threads", "1", *extra],
            stdout=open(self.out_path, "w"), stderr=open(self.log_path, "w"),
            env=env)

    def wait(self, timeout):
        return self.proc.wait(timeout=timeout)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self):
        return self.log_path.read_text() + self.out_path.read_text()[-2000:]
