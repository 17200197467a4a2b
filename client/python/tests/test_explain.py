"""`tandem schedule JOB --explain` and ``Client.explain``: a real
coordinator plans a job from scripted sessions' graph and profile, stores the
explanation with the schedule, and still has it after a restart."""

import pytest

import tandem
from tandem_harness import run_cli, small_spec, wait_for
from tandem.v1 import graph_pb2
from tandem.v1 import profile_pb2
from tandem.v1 import worker_service_pb2 as wpb

LAYERS = 4


def layered_graph():
    """LAYERS forward nodes, each with a 1024x1024 f32 param, their backward
    twins and the optimizer (the hash is left for the coordinator)."""
    g = graph_pb2.Graph(name="layers", world_size=2, micro_batches=1)
    for i in range(LAYERS):
        g.params.add(id=i, name="layers.%d.weight" % i, shape=[1024, 1024],
                     dtype=graph_pb2.DTYPE_F32, unit="layers.%d" % i)
    for i in range(LAYERS):
        g.nodes.add(id=i, name="layers.%d" % i, phase=graph_pb2.PHASE_FORWARD,
                    param_ids=[i], forward_id=-1, time_s=0.01)
    for k, i in enumerate(reversed(range(LAYERS))):
        g.nodes.add(id=LAYERS + k, name="layers.%d.bwd" % i,
                    phase=graph_pb2.PHASE_BACKWARD, param_ids=[i],
                    forward_id=i, time_s=0.02)
    g.nodes.add(id=2 * LAYERS, name="optimizer",
                phase=graph_pb2.PHASE_OPTIMIZER, forward_id=-1, time_s=0.001)
    return g


def planned_job(address, client, scripted_sessions):
    """A job planned from one profile window: (job id, schedule version)."""
    job = client.submit(small_spec(optimize={"warmup_steps": 1}, steps=100))
    w0, w1 = scripted_sessions(address, job.id, 2)
    graph = layered_graph()
    w0.send(graph=wpb.GraphReport(graph=graph))
    event = wait_for(lambda: [e for e in client.get(job.id).events
                              if e.kind == "graph"], what="graph recorded")[0]
    graph_hash = event.message.split()[1].rstrip(":")
    w1.send(graph=wpb.GraphReport(graph_hash=graph_hash))
    for w in (w0, w1):
        p = profile_pb2.Profile(graph_hash=graph_hash, rank=w.rank,
                                schedule_version=0, first_iteration=0,
                                last_iteration=0, iteration_s=0.2)
        for n in graph.nodes:
            p.nodes.add(node_id=n.id, time_s=n.time_s, samples=1)
        w.send(profile=p)
    # The job reports a version once every rank applied it; the schedule
    # event comes when it is planned and stored.
    wait_for(lambda: [e for e in client.get(job.id).events
                      if e.kind == "schedule"], timeout=20,
             what="a planned schedule")
    return job.id, client.schedule(job.id).schedule.version


def check_explanation(e, version):
    assert e.version == version
    assert e.decisions, e.text
    predicted = e.baseline_iteration_s - e.plan_iteration_s
    total = sum(d.gain_s for d in e.decisions)
    # The listed gains add up to the predicted difference (within 5%).
    assert total == pytest.approx(predicted, rel=0.05, abs=1e-9), e.text
    exposed = e.baseline_exposed_comm_s - e.plan_exposed_comm_s
    assert sum(d.exposed_gain_s for d in e.decisions) == pytest.approx(
        exposed, rel=0.05, abs=1e-9)
    kinds = {"prefetch", "fuse", "keep", "persist", "offload", "return",
             "zero1-buckets", "pass", "policy", "least-memory"}
    for d in e.decisions:
        assert d.kind in kinds, d
        assert d.pass_name and d.what, d
        assert d.binding.kind in ("none", "memory", "link", "host-link"), d
        if d.binding.kind == "memory":
            assert d.binding.node_id is not None and d.binding.limit_bytes > 0
    assert "# baseline: iteration" in e.text
    assert "# total gain" in e.text


def test_explain_api_and_cli_survive_a_restart(new_coordinator,
                                               scripted_sessions):
    coord = new_coordinator()
    with tandem.Client(coord.address, timeout=10) as client:
        job_id, version = planned_job(coord.address, client, scripted_sessions)
        e = client.explain(job_id)
        check_explanation(e, version)
        # The same decisions as the text form stored with the schedule.
        text, _ = client.schedule(job_id)
        assert text.count("\ndecision ") == len(e.decisions)

    r = run_cli("schedule", job_id, "--explain", address=coord.address)
    assert r.returncode == 0, r.stderr
    assert "# schedule v%d of job %s: %d decisions" % (
        version, job_id, len(e.decisions)) in r.stdout
    assert e.decisions[0].what in r.stdout
    assert "# total gain" in r.stdout

    # A restarted coordinator reads the schedule, explanation included,
    # back from its database.
    coord.stop()
    coord.start()
    with tandem.Client(coord.address, timeout=10) as client:
        again = client.explain(job_id, version=version)
        assert again == e
    r = run_cli("schedule", job_id, "--version", str(version), "--explain",
                address=coord.address)
    assert r.returncode == 0, r.stderr
    assert e.decisions[-1].what in r.stdout


def test_explain_before_any_schedule_is_not_found(coordinator, client):
    job = client.submit(small_spec())
    with pytest.raises(tandem.TandemError, match="has no schedule yet"):
        client.explain(job.id)
    r = run_cli("schedule", job.id, "--explain", address=coordinator.address)
    assert r.returncode == 1 and "has no schedule yet" in r.stderr
