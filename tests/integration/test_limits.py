"""Limits a client could exhaust (issues 16 and 36): silent worker sessions
are ended at the hello timeout, and one address may keep only so many
waiting for their hello (RESOURCE_EXHAUSTED past the cap, at once).
test_hostile.py shows that they hold no server thread meanwhile."""

import threading
import time

import grpc

import tandem
from tandem.v1 import worker_service_pb2 as wpb
from tandem.v1 import worker_service_pb2_grpc as wgrpc
from tandem_harness import unique_name, wait_for


def tiny_spec():
    return {"name": unique_name(),
            "model": {"preset": "llama", "layers": 2, "d_model": 32,
                      "heads": 4, "ffn": 64, "vocab": 128},
            "batch": {"micro_batch": 2, "seq_len": 16},
            "parallel": {"world_size": 1}, "train": {"steps": 2}}


def idle_session(address, outcome, release):
    """A session that never says hello; records how it ended."""
    stub = wgrpc.WorkerServiceStub(grpc.insecure_channel(address))

    def nothing():
        release.wait()
        return
        yield  # a generator that sends nothing

    start = time.monotonic()
    try:
        for _ in stub.Session(nothing(), timeout=60):
            pass
        outcome.append(("OK", time.monotonic() - start, ""))
    except grpc.RpcError as e:
        outcome.append((e.code().name, time.monotonic() - start,
                        e.details() or ""))


def test_silent_sessions_are_ended_and_capped_per_address(cluster):
    c = cluster.coordinator(extra=["--session-hello-timeout-s", "2",
                                   "--max-pending-sessions-per-peer", "16"])
    outcome, release = [], threading.Event()
    threads = [threading.Thread(target=idle_session,
                                args=(c.address, outcome, release),
                                daemon=True) for _ in range(40)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(outcome) == len(threads), timeout=30,
                 what="every idle session ended: %s" % outcome)
    finally:
        release.set()
    codes = sorted({code for code, _, _ in outcome})
    # Past the cap a call is refused at once; the rest were cancelled by the
    # hello timeout (about 2 s), none lasted to the client's 60 s.
    assert set(codes) <= {"RESOURCE_EXHAUSTED", "CANCELLED",
                          "DEADLINE_EXCEEDED"}, outcome
    assert "RESOURCE_EXHAUSTED" in codes, outcome
    assert any(code != "RESOURCE_EXHAUSTED" for code, _, _ in outcome)
    assert max(t for _, t, _ in outcome) < 15, outcome
    # Once they are gone, the coordinator serves everyone else.
    with tandem.Client(c.address, timeout=10) as client:
        job = client.submit(tiny_spec())
        assert client.get(job.id).job.id == job.id


def test_a_session_that_says_hello_stays_open_while_it_talks(cluster):
    c = cluster.coordinator(extra=["--session-hello-timeout-s", "1"])
    with tandem.Client(c.address, timeout=10) as client:
        job = client.submit(tiny_spec())
    stub = wgrpc.WorkerServiceStub(grpc.insecure_channel(c.address))
    stub.Register(wpb.RegisterRequest(job_id=job.id, incarnation="i-1",
                                      hostname="h", requested_rank=0,
                                      device="cpu"), timeout=10)
    done, finish = threading.Event(), threading.Event()

    def messages():
        yield wpb.WorkerMessage(hello=wpb.SessionHello(
            job_id=job.id, rank=0, incarnation="i-1"))
        for _ in range(4):  # well past the hello timeout
            time.sleep(0.75)
            yield wpb.WorkerMessage(heartbeat=wpb.Heartbeat(
                time_unix_s=time.time()))
        done.set()
        finish.wait()

    call = stub.Session(messages(), timeout=30)
    try:
        wait_for(done.is_set, timeout=20, what="4 heartbeats sent")
        time.sleep(0.5)
        assert call.is_active(), call.code()  # the server kept it open
        call.cancel()
        assert call.code() == grpc.StatusCode.CANCELLED  # ours
    finally:
        finish.set()


def test_job_limits_and_roots_refuse_at_submit_with_the_flag(cluster, tmp_path):
    """--max-active-jobs-per-user and --data-roots / --checkpoint-roots on a
    real coordinator, through the Python client: each refusal names the
    limit or the field, and an ended job frees its place."""
    data = tmp_path / "data"
    ckpt = tmp_path / "ckpt"
    c = cluster.coordinator(extra=[
        "--max-active-jobs-per-user", "2",
        "--data-roots", str(data), "--checkpoint-roots", str(ckpt)])
    with tandem.Client(c.address, timeout=10) as client:
        first = client.submit(tiny_spec())
        client.submit(tiny_spec())
        try:
            client.submit(tiny_spec())
            raise AssertionError("a third job was accepted")
        except tandem.TandemError as e:
            assert e.code_name == "RESOURCE_EXHAUSTED", e
            assert "--max-active-jobs-per-user 2" in e.message, e.message
        client.cancel(first.id)
        spec = tiny_spec()
        spec["checkpoint"] = {"dir": "/home/elsewhere/ckpt", "every": 1}
        spec["data"] = {"kind": "tokens", "path": str(data / ".." / "x.bin")}
        try:
            client.submit(spec)
            raise AssertionError("paths outside the roots were accepted")
        except tandem.TandemError as e:
            assert e.code_name == "INVALID_ARGUMENT", e
            assert ("checkpoint.dir '/home/elsewhere/ckpt' is not under a "
                    "checkpoint root") in e.message, e.message
            # A ".." is refused before the roots are looked at.
            assert ("data.path '%s/../x.bin' contains '..'"
                    % data) in e.message, e.message
        spec["data"]["path"] = str(data.parent / "x.bin")
        try:
            client.submit(spec)
            raise AssertionError("a path outside the roots was accepted")
        except tandem.TandemError as e:
            assert ("data.path '%s' is not under a data root"
                    % (data.parent / "x.bin")) in e.message, e.message
        # Under the roots, in the place the cancelled job freed.
        spec["checkpoint"]["dir"] = str(ckpt / "run")
        del spec["data"]
        job = client.submit(spec)
        assert client.get(job.id).job.spec.checkpoint.dir == str(ckpt / "run")
