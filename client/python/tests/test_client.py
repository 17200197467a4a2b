"""tandem.Client against a real tandem-coordinator process."""

import threading

import grpc
import pytest
import yaml

import tandem
from tandem_harness import EXAMPLE_SPEC, free_port, small_spec, unique_name
from tandem.v1 import graph_pb2, job_pb2


def test_submit_example_yaml_gives_pending_job_with_defaults(client):
    job = client.submit(str(EXAMPLE_SPEC))
    expected = tandem.load_spec_file(EXAMPLE_SPEC)
    assert job.state == job_pb2.JOB_STATE_PENDING
    assert job.id.startswith(expected.name + "-")
    assert job.step == 0 and job.schedule_version == 0
    assert job.spec.parallel.world_size == expected.parallel.world_size


def test_submit_minimal_dict_applies_server_defaults(client):
    name = unique_name("defaults")
    job = client.submit(small_spec(name, world_size=1))
    s = job.spec
    assert job.state == job_pb2.JOB_STATE_PENDING
    # tiny-llama's sizes fill the model
    assert (s.model.layers, s.model.d_model, s.model.vocab) == (4, 256, 4096)
    assert s.model.dtype == graph_pb2.DTYPE_F32
    assert s.data.kind == "synthetic" and s.data.token_bytes == 2
    assert s.batch.grad_accum == 1
    assert s.train.lr == pytest.approx(1e-3) and s.train.beta2 == 0.95
    assert s.parallel.zero_stage == 3
    # The pipeline plan_bench measures: the tandem policy, no pass list.
    assert s.optimize.policy == "tandem" and list(s.optimize.passes) == []
    assert s.optimize.warmup_steps == 5 and s.optimize.drift_window == 5
    assert s.optimize.drift_threshold == pytest.approx(0.1)
    assert s.optimize.trial_margin == pytest.approx(0.1)


def test_grad_clip_zero_disables_and_unset_defaults_to_one(client, tmp_path):
    # Left out: 1.0. Written as 0 in YAML: kept 0, clipping off.
    assert client.submit(small_spec()).spec.train.grad_clip == 1.0
    spec = small_spec()
    spec.setdefault("train", {})["grad_clip"] = 0
    path = tmp_path / "noclip.yaml"
    path.write_text(yaml.safe_dump(spec))
    job = client.submit(str(path))
    assert job.spec.train.HasField("grad_clip")
    assert job.spec.train.grad_clip == 0.0


def test_trial_margin_zero_turns_trials_off_and_out_of_range_is_refused(client, tmp_path):
    # Written as 0 in YAML: kept 0 (no trials), not the default.
    spec = small_spec()
    spec.setdefault("optimize", {})["trial_margin"] = 0
    path = tmp_path / "notrials.yaml"
    path.write_text(yaml.safe_dump(spec))
    job = client.submit(str(path))
    assert job.spec.optimize.HasField("trial_margin")
    assert job.spec.optimize.trial_margin == 0.0
    spec["optimize"]["trial_margin"] = 2
    with pytest.raises(tandem.TandemError) as e:
        client.submit(spec)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "optimize.trial_margin must be between 0 (no trials) and 1" in str(e.value)


def test_submit_accepts_a_jobspec_message(client):
    spec = tandem.spec_from_dict(small_spec())
    assert client.submit(spec).spec.name == spec.name


def test_invalid_spec_raises_the_servers_field_level_message(client):
    with pytest.raises(tandem.TandemError) as e:
        client.submit(small_spec(world_size=-2))  # 0 would mean "default"
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.code_name == "INVALID_ARGUMENT"
    assert str(e.value) == ("invalid job spec: parallel.world_size must be "
                            ">= 1 and <= 4096, got -2")


def test_several_invalid_fields_are_all_reported(client):
    spec = small_spec(data={"kind": "tokens"}, train={"lr": -1.0})
    with pytest.raises(tandem.TandemError) as e:
        client.submit(spec)
    assert "data.path must name the token file" in e.value.message
    assert "train.lr must be > 0, got -1" in e.value.message


# Mixed precision (model.dtype, train.master_dtype, train.reduce_dtype):
# defaults and checks are the coordinator's (common/job/job_spec.cc).
def test_reduce_dtype_defaults_to_model_dtype(client):
    f32 = client.submit(small_spec()).spec
    assert f32.train.master_dtype == graph_pb2.DTYPE_F32
    assert f32.train.reduce_dtype == graph_pb2.DTYPE_F32
    bf16 = client.submit(small_spec(model={"dtype": "bf16"})).spec
    assert bf16.model.dtype == graph_pb2.DTYPE_BF16
    assert bf16.train.master_dtype == graph_pb2.DTYPE_F32
    assert bf16.train.reduce_dtype == graph_pb2.DTYPE_BF16


@pytest.mark.parametrize("dtype,reduce", [
    ("f32", "f32"), ("bf16", "f32"), ("bf16", "bf16")])
def test_precision_combinations_accepted(client, dtype, reduce):
    job = client.submit(small_spec(
        model={"dtype": dtype},
        train={"master_dtype": "f32", "reduce_dtype": reduce}))
    assert job.state == job_pb2.JOB_STATE_PENDING
    assert tandem.spec_to_dict(job.spec)["train"]["reduce_dtype"] == reduce
    client.cancel(job.id)


@pytest.mark.parametrize("model,train,message", [
    ({"dtype": "bf16"}, {"master_dtype": "bf16"},
     "train.master_dtype must be f32, got bf16: the shards keep the master "
     "weights and Adam moments in f32 whatever model.dtype is; write f32 or "
     "remove it"),
    ({}, {"reduce_dtype": "bf16"},
     "train.reduce_dtype bf16 would round the f32 gradients of model.dtype "
     "f32: use f32, or set model.dtype bf16"),
    ({}, {"reduce_dtype": "f16"},
     "train.reduce_dtype f16 would round the f32 gradients of model.dtype "
     "f32: use f32"),
    ({"dtype": "bf16"}, {"reduce_dtype": "f16"},
     "train.reduce_dtype f16 must be f32 or model.dtype (bf16), the dtype "
     "the gradients are computed in: use f32 or bf16"),
    ({"dtype": "f16"}, {"loss_scale": {"backoff_factor": 1.5}},
     "train.loss_scale.backoff_factor must be in (0, 1) (0: 0.5), got 1.5"),
    ({}, {"loss_scale": {"mode": "dynamc"}},
     "train.loss_scale.mode must be dynamic or none, got 'dynamc' (did you "
     "mean 'dynamic'?)"),
])
def test_precision_refusals_say_what_to_write(client, model, train, message):
    with pytest.raises(tandem.TandemError) as e:
        client.submit(small_spec(model=model, train=train))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(e.value) == "invalid job spec: " + message


def test_f16_refused_on_declared_cpu_accepted_otherwise(client):
    with pytest.raises(tandem.TandemError) as e:
        client.submit(small_spec(model={"dtype": "f16"},
                                 hardware={"device": "cpu"}))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(e.value) == (
        "invalid job spec: model.dtype f16 needs CUDA devices, but "
        "hardware.device is cpu, where libtorch has no f16 kernels: use bf16 "
        "(the same memory, f32's exponent range), or run the ranks on GPUs")
    # Undeclared: the ranks' devices are checked when they register.
    job = client.submit(small_spec(model={"dtype": "f16"}))
    scale = job.spec.train.loss_scale
    assert (scale.mode, scale.init_scale, scale.growth_factor,
            scale.backoff_factor, scale.growth_interval) == (
                "dynamic", 65536, 2, 0.5, 2000)
    client.cancel(job.id)


def test_reference_policy_and_own_passes_are_accepted(client):
    job = client.submit(small_spec(optimize={"policy": "fsdp"}))
    assert job.spec.optimize.policy == "fsdp"
    job = client.submit(small_spec(
        optimize={"passes": ["zero3-insert:grouping=unit", "offload-lend",
                             "unshard"]}))
    assert list(job.spec.optimize.passes)[0] == "zero3-insert:grouping=unit"
    assert job.spec.optimize.policy == ""


def test_unknown_policy_and_pass_are_refused_at_submit(client):
    with pytest.raises(tandem.TandemError) as e:
        client.submit(small_spec(optimize={"policy": "zero-infinity"}))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "optimize.policy 'zero-infinity' is not a policy; use" in str(e.value)
    with pytest.raises(tandem.TandemError) as e:
        client.submit(small_spec(
            optimize={"passes": ["zero3-insert", "prefetsh"]}))
    assert ("optimize.passes[1]: 'prefetsh' is not a pass; use one of"
            in str(e.value))
    with pytest.raises(tandem.TandemError) as e:
        client.submit(small_spec(optimize={"policy": "fsdp",
                                           "passes": ["prefetch"]}))
    assert "are both set" in str(e.value)


def test_unknown_yaml_key_fails_locally_before_any_call(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text("name: a\ntrain:\n  stpes: 3\n")
    # No coordinator at this address: the error must come from the loader.
    with tandem.Client("127.0.0.1:%d" % free_port(), timeout=2) as c:
        with pytest.raises(tandem.SpecError) as e:
            c.submit(str(p))
    assert e.value.code is None
    assert "unknown key 'train.stpes' (did you mean 'steps'?)" in str(e.value)
    assert "valid keys of train: steps, lr, seed" in str(e.value)


def test_get_returns_job_and_events(client):
    job = client.submit(small_spec())
    status = client.get(job.id)
    got, events = status  # a (job, events) tuple
    assert got.id == job.id and got.state == job_pb2.JOB_STATE_PENDING
    assert [e.kind for e in events] == ["state"]
    assert events[0].message.startswith("PENDING")


def test_get_unknown_job_is_not_found(client):
    with pytest.raises(tandem.TandemError) as e:
        client.get("no-such-job")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert "no job 'no-such-job'" in e.value.message


def test_list_filters_by_state_and_limits(client):
    a = client.submit(small_spec()).id
    b = client.submit(small_spec()).id
    client.cancel(b)
    ids = [j.id for j in client.list()]
    assert ids.index(b) < ids.index(a)  # newest first
    pending = [j.id for j in client.list(states="PENDING")]
    cancelled = [j.id for j in client.list(states=["cancelled"])]
    assert a in pending and b not in pending
    assert b in cancelled and a not in cancelled
    both = [j.id for j in client.list(
        states=[job_pb2.JOB_STATE_PENDING, "JOB_STATE_CANCELLED"])]
    assert a in both and b in both
    assert len(client.list(limit=1)) == 1
    with pytest.raises(tandem.TandemError, match="unknown job state 'bogus'"):
        client.list(states="bogus")


def test_cancel_then_cancel_again(client):
    job = client.submit(small_spec())
    cancelled = client.cancel(job.id, reason="no longer needed")
    assert cancelled.state == job_pb2.JOB_STATE_CANCELLED
    assert cancelled.error == "no longer needed"
    assert client.get(job.id).events[-1].message == \
        "CANCELLED: no longer needed"
    with pytest.raises(tandem.TandemError) as e:
        client.cancel(job.id)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "already ended CANCELLED" in e.value.message
    assert "submit it again to rerun" in e.value.message


def test_reoptimize_before_any_profile_is_a_clear_error(client):
    job = client.submit(small_spec())
    with pytest.raises(tandem.TandemError) as e:
        client.reoptimize(job.id, reason="try")
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "has no profile yet; re-optimize after its warm-up steps" in \
        e.value.message


def test_schedule_before_any_is_not_found(client):
    job = client.submit(small_spec())
    with pytest.raises(tandem.TandemError) as e:
        client.schedule(job.id)
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert e.value.message == ("job %s has no schedule yet; schedules appear "
                               "after the warm-up steps" % job.id)
    with pytest.raises(tandem.TandemError,
                       match=r"has no schedule v3; it has v0 \(the baseline\)"):
        client.schedule(job.id, version=3)


def test_watch_of_a_cancelled_job_replays_and_ends(client):
    job = client.submit(small_spec())
    client.cancel(job.id, reason="stop")
    updates = list(client.watch(job.id))
    assert updates[0][1] is None  # the job as it is, first
    events = [e for _, e in updates if e is not None]
    assert [e.message for e in events] == [
        events[0].message, "CANCELLED: stop"]
    assert updates[-1][0].state == job_pb2.JOB_STATE_CANCELLED


def test_watch_ends_when_the_job_is_cancelled_meanwhile(client):
    job = client.submit(small_spec())
    seen = []
    done = threading.Event()

    def follow():
        for j, e in client.watch(job.id):
            seen.append((j.state, e.message if e else None))
        done.set()

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    client.cancel(job.id, reason="changed my mind")
    assert done.wait(10), "watch did not end after the job was cancelled"
    assert seen[-1] == (job_pb2.JOB_STATE_CANCELLED,
                        "CANCELLED: changed my mind")


def test_watch_after_seq_skips_earlier_events(client):
    job = client.submit(small_spec())
    client.cancel(job.id)
    events = [e for _, e in client.watch(job.id, after_seq=1) if e]
    assert [e.seq for e in events] == [2]


def test_watch_unknown_job_raises(client):
    with pytest.raises(tandem.TandemError) as e:
        list(client.watch("missing-job"))
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_unreachable_coordinator_names_address_and_what_to_do():
    address = "127.0.0.1:%d" % free_port()
    with tandem.Client(address, timeout=5) as c:
        with pytest.raises(tandem.TandemError) as e:
            c.list()
    msg = str(e.value)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert msg.startswith("cannot reach the tandem coordinator at %s" % address)
    assert "tandem-coordinator --listen %s" % address in msg
    assert "--coordinator" in msg and "TANDEM_COORDINATOR" in msg


def test_address_defaults_to_env(monkeypatch):
    monkeypatch.setenv("TANDEM_COORDINATOR", "10.1.2.3:999")
    with tandem.Client() as c:
        assert c.address == "10.1.2.3:999"
    monkeypatch.delenv("TANDEM_COORDINATOR")
    with tandem.Client() as c:
        assert c.address == "127.0.0.1:50051"


def test_credentials_from_arguments_and_environment(client, tmp_path,
                                                    monkeypatch):
    # Without authentication the coordinator takes calls with or without a
    # token; each job still has a join secret, which Get returns.
    monkeypatch.setenv("TANDEM_TOKEN", "env-token-0123456789abcdef")
    with tandem.Client(client.address, timeout=10) as c:
        job = c.submit(small_spec(unique_name("creds"), world_size=1))
        assert job.owner == ""
        secret = c.join_secret(job.id)
        assert secret.startswith("tjs-") and len(secret) == 68
        assert c.join_secret(job.id) == secret
    with pytest.raises(tandem.TandemError) as e:
        tandem.Client(client.address, token="two words")
    assert "one word" in e.value.message
    with pytest.raises(tandem.TandemError) as e:
        tandem.Client(client.address, tls_ca=str(tmp_path / "none.pem"))
    assert "none.pem" in e.value.message and "--tls-ca" in e.value.message
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("hello")
    monkeypatch.setenv("TANDEM_TLS_CA", str(not_pem))
    with pytest.raises(tandem.TandemError) as e:
        tandem.Client(client.address)
    assert "is not PEM" in e.value.message
