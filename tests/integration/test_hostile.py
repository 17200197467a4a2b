"""Hostile load on a real coordinator (issue 36 items 1 and 5). Sessions
that never say hello, rendezvous gets waiting for keys that never come, and
watches each held a server thread: a few thousand of them locked every user
out. Now they hold none (the coordinator's thread count stays flat while
hundreds are open), sessions awaiting their hello are capped per address,
watches per user, and a client that goes away frees its waiting gets at
once. The figures at scale are bench/load's hostile mode (bench/README.md,
"hostile")."""

import asyncio
import subprocess
import sys
import threading
import time
import urllib.request

import grpc

import tandem
from tandem.v1 import job_pb2
from tandem.v1 import job_service_pb2 as jpb
from tandem.v1 import job_service_pb2_grpc as jgrpc
from tandem.v1 import worker_service_pb2 as wpb
from tandem.v1 import worker_service_pb2_grpc as wgrpc
from tandem_harness import REPO, unique_name, wait_for

# Threads a coordinator runs at rest is about 20 (gRPC's pollers, the
# planner, the watchers, the metrics port); a thread per stream would put
# hundreds on top.
MAX_THREADS = 64


def tiny_spec(world=1):
    return {"name": unique_name(),
            "model": {"preset": "llama", "layers": 2, "d_model": 32,
                      "heads": 4, "ffn": 64, "vocab": 128},
            "batch": {"micro_batch": 2, "seq_len": 16},
            "parallel": {"world_size": world}, "train": {"steps": 2}}


def threads_of(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads line for pid %d" % pid)


def metric(port, name):
    """The value of an unlabelled or single series `name` (a sum over its
    series), from the coordinator's /metrics."""
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                timeout=10) as r:
        body = r.read().decode()
    total, found = 0.0, False
    for line in body.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, "no %s in /metrics" % name
    return total


def stream_metric(port, kind):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                timeout=10) as r:
        body = r.read().decode()
    needle = 'tandem_open_streams{kind="%s"} ' % kind
    for line in body.splitlines():
        if line.startswith(needle):
            return float(line[len(needle):])
    return 0.0


class Background:
    """An asyncio loop on its own thread, for many streams at once."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever,
                                       daemon=True)
        self.thread.start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


async def idle_session(stub, release):
    """A session that never says hello; how it ended and after how long."""
    start = time.monotonic()
    call = stub.Session()
    try:
        async for _ in call:
            pass
        return ("OK", time.monotonic() - start, "")
    except grpc.aio.AioRpcError as e:
        return (e.code().name, time.monotonic() - start, e.details() or "")
    finally:
        if not release.is_set():
            call.cancel()


def test_idle_sessions_hold_no_thread_and_one_address_is_capped(cluster):
    c = cluster.coordinator(extra=[
        "--session-hello-timeout-s", "6",
        "--max-pending-sessions-per-peer", "100",
        "--metrics-listen", "127.0.0.1:0"])
    bg = Background()
    release = threading.Event()

    async def many(n):
        channel = grpc.aio.insecure_channel(c.address)
        stub = wgrpc.WorkerServiceStub(channel)
        try:
            return await asyncio.gather(
                *[idle_session(stub, release) for _ in range(n)])
        finally:
            await channel.close()

    outcome = bg.run(many(300))
    try:
        wait_for(lambda: stream_metric(c.metrics_port, "pending_session")
                 == 100, timeout=30, what="100 sessions awaiting a hello")
        # Held, and no thread each; everyone else is served meanwhile.
        assert threads_of(c.proc.pid) < MAX_THREADS, threads_of(c.proc.pid)
        start = time.monotonic()
        with tandem.Client(c.address, timeout=10) as client:
            job = client.submit(tiny_spec())
            assert client.get(job.id).job.id == job.id
        assert time.monotonic() - start < 5
        results = outcome.result(timeout=60)
    finally:
        release.set()
        bg.stop()
    refused = [r for r in results if r[0] == "RESOURCE_EXHAUSTED"]
    ended = [r for r in results if r[0] != "RESOURCE_EXHAUSTED"]
    assert len(refused) == 200, sorted({r[0] for r in results})
    assert all("--max-pending-sessions-per-peer" in d for _, _, d in refused)
    assert all(t < 3 for _, t, _ in refused), refused[:3]
    # The ones held were ended at the hello timeout, not the client's.
    assert {code for code, _, _ in ended} <= {"CANCELLED",
                                              "DEADLINE_EXCEEDED"}, ended[:3]
    assert all(4 < t < 20 for _, t, _ in ended), ended[:3]
    wait_for(lambda: stream_metric(c.metrics_port, "pending_session") == 0,
             timeout=10, what="no session left")


KV_CLIENT = r"""
import sys, time, grpc
sys.path.insert(0, sys.argv[1])
from tandem.v1 import worker_service_pb2 as wpb
from tandem.v1 import worker_service_pb2_grpc as wgrpc
address, prefix, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
stub = wgrpc.WorkerServiceStub(grpc.insecure_channel(address))
calls = [stub.KvGet.future(wpb.KvGetRequest(key="%s/k%d" % (prefix, i),
                                            timeout_ms=60000), timeout=90)
         for i in range(n)]
print(calls[0].result().value.decode(), flush=True)  # k0 is set for us
time.sleep(600)
"""


def test_waiting_kv_gets_hold_no_thread_and_go_with_their_client(cluster):
    c = cluster.coordinator(extra=["--metrics-listen", "127.0.0.1:0"])
    with tandem.Client(c.address, timeout=10) as client:
        job = client.submit(tiny_spec())
    prefix = "jobs/%s" % job.id
    proc = subprocess.Popen(
        [sys.executable, "-c", KV_CLIENT, str(REPO / "client" / "python"),
         c.address, prefix, "300"], stdout=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: metric(c.metrics_port, "tandem_waiting_kv_gets")
                 == 300, timeout=30, what="300 gets waiting")
        assert threads_of(c.proc.pid) < MAX_THREADS, threads_of(c.proc.pid)
        # A key set is answered at once.
        stub = wgrpc.WorkerServiceStub(grpc.insecure_channel(c.address))
        stub.KvSet(wpb.KvSetRequest(key=prefix + "/k0", value=b"here"),
                   timeout=10)
        assert proc.stdout.readline().strip() == "here"
        assert metric(c.metrics_port, "tandem_waiting_kv_gets") == 299
        # The client goes away: its gets are dropped now, not in 60 s.
        proc.kill()
        proc.wait()
        start = time.monotonic()
        wait_for(lambda: metric(c.metrics_port, "tandem_waiting_kv_gets")
                 == 0, timeout=10, what="the gets freed")
        assert time.monotonic() - start < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_watches_hold_no_thread_and_are_capped_per_user(cluster):
    c = cluster.coordinator(extra=["--max-streams-per-user", "40",
                                   "--metrics-listen", "127.0.0.1:0"])
    with tandem.Client(c.address, timeout=10) as client:
        job = client.submit(tiny_spec())
    bg = Background()
    first_seen = []

    async def watch(stub):
        events = []
        try:
            async for update in stub.Watch(jpb.WatchJobRequest(
                    job_id=job.id)):
                if not events:
                    first_seen.append(1)
                events.append(update)
            return ("OK", events)
        except grpc.aio.AioRpcError as e:
            return (e.code().name, e.details() or "")

    async def many(n):
        channel = grpc.aio.insecure_channel(c.address)
        stub = jgrpc.JobServiceStub(channel)
        try:
            return await asyncio.gather(*[watch(stub) for _ in range(n)])
        finally:
            await channel.close()

    held = bg.run(many(40))
    try:
        wait_for(lambda: len(first_seen) == 40, timeout=30,
                 what="40 watches open")
        assert threads_of(c.proc.pid) < MAX_THREADS, threads_of(c.proc.pid)
        assert stream_metric(c.metrics_port, "watch") == 40
        # The 41st of the same user is refused, and says what to do.
        stub = jgrpc.JobServiceStub(grpc.insecure_channel(c.address))
        try:
            next(iter(stub.Watch(jpb.WatchJobRequest(job_id=job.id),
                                 timeout=10)))
            raise AssertionError("a 41st watch was accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
            assert "--max-streams-per-user" in e.details(), e.details()
        # Every open watch sees the job end, and ends with it.
        with tandem.Client(c.address, timeout=10) as client:
            client.cancel(job.id)
        results = held.result(timeout=30)
    finally:
        bg.stop()
    for code, events in results:
        assert code == "OK", (code, events)
        assert events[-1].job.state == job_pb2.JOB_STATE_CANCELLED, events[-1]
    wait_for(lambda: stream_metric(c.metrics_port, "watch") == 0,
             timeout=10, what="the watches gone")
    # Places are given back: a new watch is served.
    first = next(iter(stub.Watch(jpb.WatchJobRequest(job_id=job.id),
                                 timeout=10)))
    assert first.job.id == job.id
