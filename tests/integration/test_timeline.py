"""The iteration timeline: a worker's Chrome trace of one iteration parses,
and its events match the profile of that iteration; `tandem timeline` fetches
every rank's latest trace through the coordinator."""

import json
import os
import subprocess
import sys

import pytest
import yaml

import tandem
import tandem_harness as harness
from tandem_harness import REPO, unique_name, worker_binary
from tandem.v1 import profile_pb2

SPEC = {
    "model": {"preset": "llama", "layers": 2, "d_model": 64, "heads": 4,
              "ffn": 128, "vocab": 256},
    "batch": {"micro_batch": 2, "seq_len": 32, "grad_accum": 2},
    "parallel": {"world_size": 2},
    "optimize": {"warmup_steps": 3},
}
KIND = {profile_pb2.COLLECTIVE_KIND_ALLGATHER: "allgather",
        profile_pb2.COLLECTIVE_KIND_REDUCE_SCATTER: "reduce_scatter",
        profile_pb2.COLLECTIVE_KIND_ALLREDUCE: "allreduce"}


def spans(trace, cat, pid=None):
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and
            e["cat"] == cat and (pid is None or e["pid"] == pid)]


def check_well_formed(trace, pid):
    names = {(e["tid"], e["args"]["name"]) for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name" and
             e["pid"] == pid}
    assert names == {(1, "compute"), (2, "communication"), (3, "copy")}
    for e in trace["traceEvents"]:
        if e["pid"] != pid:
            continue
        assert e["ph"] in ("M", "X", "C"), e
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0, e
            assert e["tid"] == {"node": 1, "wait": 1, "exchange": 1,
                                "collective": 2, "copy": 3}[e["cat"]], e


def test_standalone_trace_matches_the_profile(tmp_path):
    if not worker_binary().is_file():
        pytest.skip("tandem-worker is not built")
    spec = dict(SPEC, name="timeline", train={"steps": 1})
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    port = harness.free_port()
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    procs = []
    for rank in range(2):
        procs.append(subprocess.Popen(
            [str(worker_binary()), "--standalone", "--spec", str(spec_path),
             "--rank", str(rank), "--world", "2", "--rendezvous",
             "127.0.0.1:%d" % port, "--threads", "1", "--timeout-s", "60",
             "--profile-out", str(tmp_path / ("profile%d.pb" % rank)),
             # The same path on both ranks: each writes trace.json.rankR.
             "--trace-out", str(tmp_path / "trace.json")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
            text=True))
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err

    for rank in range(2):
        trace = json.loads(
            (tmp_path / ("trace.json.rank%d" % rank)).read_text())
        profile = profile_pb2.Profile.FromString(
            (tmp_path / ("profile%d.pb" % rank)).read_bytes())
        check_well_formed(trace, rank)
        assert trace["otherData"]["rank"] == rank
        assert trace["otherData"]["iteration"] == profile.last_iteration == 0
        assert trace["otherData"]["iteration_s"] == pytest.approx(
            profile.iteration_s, rel=1e-6)

        # One compute span per node, as long as the profile says.
        nodes = {e["args"]["node_id"]: e for e in spans(trace, "node")}
        assert len(nodes) == len(spans(trace, "node"))
        assert set(nodes) == {n.node_id for n in profile.nodes}
        for n in profile.nodes:
            assert nodes[n.node_id]["dur"] / 1e6 == pytest.approx(
                n.time_s, abs=2e-9), n
        assert {"fwd", "bwd", "opt"} == {
            e["args"]["phase"] for e in nodes.values()}

        # One communication span per collective, with the profile's kind,
        # issuing node, bytes, run time and exposed time.
        collectives = spans(trace, "collective")
        assert len(collectives) == len(profile.collectives) > 0
        remaining = list(collectives)
        for c in profile.collectives:
            key = (KIND[c.kind], c.node_id, c.bytes, c.group_id)
            match = [e for e in remaining if (
                e["args"]["collective"], e["args"]["issued_at_node"],
                e["args"]["bytes"], e["args"]["group_id"]) == key]
            assert match, (key, remaining)
            e = match[0]
            remaining.remove(e)
            assert e["dur"] / 1e6 == pytest.approx(c.run_s, abs=2e-9)
            assert e["args"]["exposed_s"] == pytest.approx(c.exposed_s,
                                                           abs=1e-9)
            assert e["args"]["issue_to_done_s"] == pytest.approx(
                c.issue_to_done_s, abs=1e-9)
        # Compute's waits are the exposed part of those collectives.
        waits = sum(e["dur"] for e in spans(trace, "wait")) / 1e6
        assert waits == pytest.approx(
            sum(c.exposed_s for c in profile.collectives), abs=1e-6)
        assert len(spans(trace, "exchange")) == 1
        memory = [e for e in trace["traceEvents"] if e["ph"] == "C"]
        assert memory and all(e["args"]["allocated_bytes"] > 0
                              for e in memory)


def run_cli(*args, address):
    return subprocess.run(
        [sys.executable, "-m", "tandem", "--coordinator", address, *args],
        cwd=REPO / "client" / "python", capture_output=True, text=True,
        timeout=60)


def test_tandem_timeline_fetches_every_rank(cluster, tmp_path):
    coord = cluster.coordinator()
    with tandem.Client(coord.address, timeout=10) as client:
        spec = dict(SPEC, name=unique_name("timeline"), train={"steps": 8})
        job = client.submit(spec)
        workers = [cluster.worker(coord, job.id, r) for r in range(2)]
        for w in workers:
            assert w.wait(timeout=240) == 0, w.log()
        timelines = client.timeline(job.id)
        assert [t.rank for t in timelines] == [0, 1]
        # The last step's trace.
        assert all(t.step == 7 for t in timelines), timelines
        assert [t.rank for t in client.timeline(job.id, ranks=[1])] == [1]

    out = tmp_path / "trace.json"
    r = run_cli("timeline", job.id, "-o", str(out), address=coord.address)
    assert r.returncode == 0, r.stderr
    assert "rank 0: step 7" in r.stdout and "rank 1: step 7" in r.stdout
    trace = json.loads(out.read_text())
    assert set(trace["otherData"]["ranks"]) == {"0", "1"}
    node_ids = []
    for rank in range(2):
        check_well_formed(trace, rank)
        ids = sorted(e["args"]["node_id"] for e in spans(trace, "node", rank))
        # Every node of the graph ran once in the iteration: ids 0..N-1.
        assert ids == list(range(len(ids))) and len(ids) > 2
        node_ids.append(ids)
        assert spans(trace, "collective", rank)
    assert node_ids[0] == node_ids[1]
