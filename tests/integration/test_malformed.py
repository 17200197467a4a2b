"""Malformed messages from workers, over a real coordinator process: each
gets a clear error and changes nothing."""

import math
import time
import uuid

import grpc
import pytest

import tandem
import tandem_harness as harness
from tandem_harness import unique_name, wait_for
from tandem.v1 import graph_pb2
from tandem.v1 import job_pb2
from tandem.v1 import profile_pb2
from tandem.v1 import worker_service_pb2 as wpb
from tandem.v1 import worker_service_pb2_grpc as wgrpc

ScriptedSession = harness.ScriptedSession

SPEC = {"model": {"preset": "llama", "layers": 1, "d_model": 32, "heads": 2,
                  "ffn": 64, "vocab": 64},
        "batch": {"micro_batch": 1, "seq_len": 8},
        "train": {"steps": 100}, "parallel": {"world_size": 2}}


def tiny_graph():
    """A one-node-pair graph in tandem.v1 form (the hash is left empty: the
    coordinator computes it)."""
    g = graph_pb2.Graph(name="g", world_size=2, micro_batches=1)
    g.params.add(id=0, name="w", shape=[4, 4], dtype=graph_pb2.DTYPE_F32)
    g.nodes.add(id=0, name="f", phase=graph_pb2.PHASE_FORWARD, param_ids=[0],
                forward_id=-1)
    g.nodes.add(id=1, name="f.bwd", phase=graph_pb2.PHASE_BACKWARD,
                param_ids=[0], forward_id=0)
    g.nodes.add(id=2, name="optimizer", phase=graph_pb2.PHASE_OPTIMIZER,
                forward_id=-1)
    return g


@pytest.fixture
def running(cluster):
    coord = cluster.coordinator()
    client = tandem.Client(coord.address, timeout=10)
    s = dict(SPEC, name=unique_name("bad"))
    job = client.submit(s)
    workers = [ScriptedSession(coord.address, job.id, r) for r in range(2)]
    # Running once both sessions' hellos are in.
    wait_for(lambda: client.get(job.id)[0].state == job_pb2.JOB_STATE_RUNNING,
             what="job running")
    yield coord, client, job, workers
    for w in workers:
        w.close()
    client.close()


def rejected(worker, payload, timeout=10):
    return wait_for(lambda: [m.rejected for m in worker.received
                             if m.HasField("rejected")
                             and m.rejected.payload == payload],
                    timeout=timeout, what="a %s rejection" % payload)


def test_unknown_job_is_refused(running):
    coord, _, _, _ = running
    stub = wgrpc.WorkerServiceStub(grpc.insecure_channel(coord.address))
    with pytest.raises(grpc.RpcError) as e:
        stub.Register(wpb.RegisterRequest(job_id="no-such-job",
                                          incarnation="x"), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert "tandem list" in e.value.details()


def test_wrong_incarnation_is_refused(running):
    coord, client, job, _ = running
    stub = wgrpc.WorkerServiceStub(grpc.insecure_channel(coord.address))
    hello = wpb.WorkerMessage(hello=wpb.SessionHello(
        job_id=job.id, rank=1, incarnation=uuid.uuid4().hex))
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Session(iter([hello]), timeout=10))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "unknown worker" in e.value.details()
    assert client.get(job.id)[0].state == job_pb2.JOB_STATE_RUNNING


def test_nan_and_oversized_profiles_are_rejected(running):
    _, client, job, (w0, w1) = running
    g = tiny_graph()
    w0.send(graph=wpb.GraphReport(graph=g))
    wait_for(lambda: any(e.kind == "graph" for e in client.get(job.id)[1]),
             what="graph recorded")
    graph_event = [e for e in client.get(job.id)[1] if e.kind == "graph"][0]
    graph_hash = graph_event.message.split()[1].rstrip(":")
    nan = profile_pb2.Profile(graph_hash=graph_hash, rank=0)
    nan.nodes.add(node_id=0, time_s=math.nan, samples=1)
    w0.send(profile=nan)
    r = rejected(w0, "profile")
    assert "time of n0 is nan" in r[0].message, r[0].message
    huge = profile_pb2.Profile(graph_hash=nan.graph_hash, rank=0)
    for _ in range(200001):
        huge.memory.add(node_id=0)
    w0.send(profile=huge)
    wait_for(lambda: len(rejected(w0, "profile")) >= 2, what="second rejection")
    assert "send shorter windows" in rejected(w0, "profile")[1].message
    inf = profile_pb2.Profile(graph_hash=graph_hash, rank=0)
    inf.nodes.add(node_id=0, time_s=math.inf, samples=1)
    w0.send(profile=inf)
    wait_for(lambda: len(rejected(w0, "profile")) >= 3, what="inf rejection")
    assert "is inf" in rejected(w0, "profile")[2].message
    # Progress with a non-finite time or exposed communication is refused
    # too (a NaN loss is reported as is: a diverged run is the user's to see).
    for bad in (dict(iteration_s=math.inf), dict(exposed_comm_s=math.nan),
                dict(iteration_s=0.1, work=-1)):
        w0.send(progress=wpb.IterationProgress(step=1, **bad))
    wait_for(lambda: len(rejected(w0, "progress")) >= 3,
             what="progress rejections")
    assert "non-finite" in rejected(w0, "progress")[0].message
    # Nothing was recorded: no plan, job still running.
    time.sleep(0.5)
    got = client.get(job.id)[0]
    assert got.state == job_pb2.JOB_STATE_RUNNING
    assert got.schedule_version == 0


def test_graph_hash_mismatch_fails_job(running):
    _, client, job, (w0, w1) = running
    w0.send(graph=wpb.GraphReport(graph=tiny_graph()))
    wait_for(lambda: any(e.kind == "graph" for e in client.get(job.id)[1]),
             what="graph recorded")
    w1.send(graph=wpb.GraphReport(graph_hash="00000000deadbeef"))
    wait_for(lambda: client.get(job.id)[0].state == job_pb2.JOB_STATE_FAILED,
             what="job FAILED")
    assert "graph hash mismatch: rank 1 built graph 00000000deadbeef" in \
        client.get(job.id)[0].error
