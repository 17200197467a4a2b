"""YAML/dict → tandem.v1.JobSpec, checked locally (no coordinator needed)."""

import io

import pytest
from google.protobuf.descriptor import FieldDescriptor as FD

from tandem_harness import EXAMPLE_SPEC
from tandem import SpecError
from tandem import spec as S
from tandem.progress import ProgressView, StepRate
from tandem.v1 import graph_pb2, job_pb2


def test_example_spec_loads():
    spec = S.load_spec_file(EXAMPLE_SPEC)
    assert spec.name
    assert spec.parallel.world_size >= 1
    assert spec.batch.seq_len > 0 and spec.train.steps > 0


def test_unknown_top_level_key_lists_valid_keys():
    with pytest.raises(SpecError) as e:
        S.spec_from_dict({"name": "a", "modle": {"layers": 2}})
    msg = str(e.value)
    assert "unknown key 'modle'" in msg
    assert "did you mean 'model'" in msg
    for key in ("name", "model", "data", "batch", "train", "parallel",
                "memory", "optimize", "checkpoint"):
        assert key in msg
    assert e.value.path == "modle"
    assert e.value.code is None  # found locally, no RPC


def test_deeply_nested_yaml_is_a_spec_error_not_a_traceback():
    deep = "model: " + "[" * 1000 + "]" * 1000 + "\n"
    with pytest.raises(S.SpecError) as e:
        S.parse_yaml(deep, source="deep.yaml")
    assert str(e.value).startswith("deep.yaml: invalid YAML: nested too "
                                   "deeply to read"), str(e.value)


def test_unknown_nested_key_names_path_and_valid_keys():
    with pytest.raises(SpecError) as e:
        S.parse_yaml("name: a\nbatch:\n  micro_batch: 2\n  seqlen: 128\n",
                     source="job.yaml")
    assert str(e.value) == (
        "job.yaml: unknown key 'batch.seqlen' (did you mean 'seq_len'?); "
        "valid keys of batch: micro_batch, seq_len, grad_accum")
    assert e.value.path == "batch.seqlen"


@pytest.mark.parametrize("yaml_text,expected", [
    ("batch:\n  seq_len: abc\n",
     "batch.seq_len: expected an integer, got 'abc'"),
    ("batch:\n  seq_len: 1.5\n",
     "batch.seq_len: expected an integer, got 1.5"),
    ("batch:\n  seq_len: true\n",
     "batch.seq_len: expected an integer, got True"),
    ("batch:\n  seq_len: 3000000000\n",
     "batch.seq_len: 3000000000 is out of range"),
    ("data:\n  seed: -1\n", "data.seed: -1 is out of range"),
    ("train:\n  lr: fast\n", "train.lr: expected a number, got 'fast'"),
    ("model:\n  activation_checkpointing: maybe\n",
     "model.activation_checkpointing: expected true or false, got 'maybe'"),
    ("name: 2024\n", "name: expected a string, got 2024"),
    ("model:\n  dtype: f64\n",
     "model.dtype: expected one of f32, bf16, f16, got 'f64'"),
    ("optimize:\n  passes: prefetch\n",
     "optimize.passes: expected a list, got 'prefetch'"),
    ("optimize:\n  passes: [prefetch, 3]\n",
     "optimize.passes[1]: expected a string, got 3"),
    ("batch: 4\n", "batch: expected a mapping with keys micro_batch, seq_len, "
                   "grad_accum, got 4"),
    ("memory:\n  budget_bytes: lots\n",
     "memory.budget_bytes: expected an integer (a size such as 8GiB or "
     "512MiB), got 'lots'"),
    ("- a\n- b\n", "the job spec: expected a mapping"),
])
def test_wrong_types_name_the_path(yaml_text, expected):
    with pytest.raises(SpecError) as e:
        S.parse_yaml(yaml_text)
    assert expected in str(e.value)


def test_accepted_number_forms():
    spec = S.parse_yaml(
        "train:\n  lr: 3e-4\n  steps: 1.0e3\n  eps: 1e-8\n"
        "memory:\n  budget_bytes: 512MiB\n"
        "batch:\n  seq_len: '1_024'\n"
        "optimize:\n  drift_threshold: 1\n")
    assert spec.train.lr == pytest.approx(3e-4)  # PyYAML reads 3e-4 as a str
    assert spec.train.steps == 1000
    assert spec.memory.budget_bytes == 512 * 1024 ** 2
    assert spec.batch.seq_len == 1024
    assert spec.optimize.drift_threshold == 1.0
    assert S.parse_yaml("memory:\n  budget_bytes: 2GB\n").memory \
        .budget_bytes == 2 * 10 ** 9


@pytest.mark.parametrize("text,value", [
    ("bf16", graph_pb2.DTYPE_BF16), ("BF16", graph_pb2.DTYPE_BF16),
    ("DTYPE_BF16", graph_pb2.DTYPE_BF16), ("bfloat16", graph_pb2.DTYPE_BF16),
    ("f32", graph_pb2.DTYPE_F32), ("fp16", graph_pb2.DTYPE_F16),
])
def test_dtype_spellings(text, value):
    assert S.parse_yaml("model:\n  dtype: %s\n" % text).model.dtype == value


@pytest.mark.parametrize("key", ["master_dtype", "reduce_dtype"])
@pytest.mark.parametrize("text,value", [
    ("f32", graph_pb2.DTYPE_F32), ("float32", graph_pb2.DTYPE_F32),
    ("bf16", graph_pb2.DTYPE_BF16), ("DTYPE_BF16", graph_pb2.DTYPE_BF16),
])
def test_train_dtypes_parse_like_model_dtype(key, text, value):
    spec = S.parse_yaml("train:\n  %s: %s\n" % (key, text))
    assert getattr(spec.train, key) == value
    with pytest.raises(SpecError) as e:
        S.parse_yaml("train:\n  %s: f64\n" % key)
    assert str(e.value) == ("train.%s: expected one of f32, bf16, f16, "
                            "got 'f64'" % key)
    assert e.value.path == "train." + key


def test_unspecified_enum_value_is_not_accepted():
    with pytest.raises(SpecError, match="expected one of f32, bf16, f16"):
        S.parse_yaml("model:\n  dtype: unspecified\n")


def test_empty_values_are_left_unset():
    spec = S.parse_yaml("name: a\nmemory:\ncheckpoint:\n  dir:\n")
    assert spec.name == "a"
    assert spec.memory.budget_bytes == 0 and spec.checkpoint.dir == ""


def test_duplicate_key_is_an_error():
    with pytest.raises(SpecError, match="duplicate key 'seq_len'"):
        S.parse_yaml("batch:\n  seq_len: 1\n  seq_len: 2\n")


def test_bad_yaml_empty_and_missing_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("batch: [1, 2\n")
    with pytest.raises(SpecError, match="bad.yaml: invalid YAML"):
        S.load_spec_file(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    with pytest.raises(SpecError, match="empty"):
        S.load_spec_file(empty)
    with pytest.raises(SpecError, match="cannot read job spec .*nope.yaml"):
        S.load_spec_file(tmp_path / "nope.yaml")


def test_relative_paths_resolve_against_the_spec_file(tmp_path):
    (tmp_path / "jobs").mkdir()
    f = tmp_path / "jobs" / "job.yaml"
    f.write_text("model: {kind: torchscript, path: ../model.tandem, vocab: 16}\n"
                 "data: {kind: tokens, path: data/tokens.bin}\n"
                 "checkpoint: {dir: /abs/ckpt}\n")
    spec = S.load_spec_file(f)
    assert spec.model.path == str(tmp_path / "model.tandem")
    assert spec.data.path == str(tmp_path / "jobs" / "data" / "tokens.bin")
    assert spec.checkpoint.dir == "/abs/ckpt"  # absolute: kept
    # A dict or YAML text has no file to be relative to: kept as written.
    assert S.spec_from_dict({"data": {"path": "x.bin"}}).data.path == "x.bin"


def _sample_value(field):
    if field.type == FD.TYPE_MESSAGE:
        return _sample_dict(field.message_type)
    if field.type == FD.TYPE_ENUM:
        return S.enum_choices(field.enum_type)[0]
    if field.type in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        return 0.5
    if field.type == FD.TYPE_BOOL:
        return True
    if field.type == FD.TYPE_STRING:
        return "x"
    return 7


def _sample_dict(desc):
    out = {}
    for f in desc.fields:
        v = _sample_value(f)
        out[f.name] = [v] if f.label == FD.LABEL_REPEATED else v
    return out


def test_every_jobspec_field_is_accepted_and_round_trips():
    """The loader follows job.proto: a document naming every field of
    JobSpec (walked from the descriptor) loads, and prints back the same."""
    data = _sample_dict(job_pb2.JobSpec.DESCRIPTOR)
    spec = S.spec_from_dict(data)
    assert S.spec_to_dict(spec) == data
    assert S.parse_yaml(S.spec_to_yaml(spec)) == spec


def test_to_job_spec_accepts_dict_path_and_message(tmp_path):
    p = tmp_path / "j.yaml"
    p.write_text("name: a\nbatch: {seq_len: 8}\n")
    from_path = S.to_job_spec(str(p))
    assert from_path == S.to_job_spec(p) == S.to_job_spec(
        {"name": "a", "batch": {"seq_len": 8}})
    assert S.to_job_spec(from_path) is from_path
    with pytest.raises(TypeError):
        S.to_job_spec(42)


def test_global_tokens_per_step():
    spec = S.spec_from_dict({"parallel": {"world_size": 2},
                             "batch": {"micro_batch": 4, "seq_len": 128,
                                       "grad_accum": 3}})
    assert S.global_tokens_per_step(spec) == 2 * 4 * 128 * 3


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _job(step, steps=10, loss=2.5, version=0,
         state=job_pb2.JOB_STATE_RUNNING):
    return job_pb2.Job(id="j", state=state, step=step, loss=loss,
                       schedule_version=version,
                       spec=S.spec_from_dict({
                           "train": {"steps": steps},
                           "parallel": {"world_size": 2},
                           "batch": {"micro_batch": 4, "seq_len": 128,
                                     "grad_accum": 1}}))


def test_step_rate_window():
    clock = FakeClock()
    r = StepRate(window_s=10, clock=clock)
    assert r.rate() is None
    for step in range(5):
        r.observe(step)
        clock.t += 0.5
    assert r.rate() == pytest.approx(2.0)
    r.observe(4)  # the same step again changes nothing
    assert r.rate() == pytest.approx(2.0)


def test_progress_view_tty_redraws_in_place():
    out, clock = io.StringIO(), FakeClock()
    view = ProgressView(out=out, tty=True, clock=clock)
    view.update(_job(0))
    for step in (1, 2, 3):
        clock.t += 0.5
        view.update(_job(step, loss=2.0 - 0.1 * step, version=1))
    event = job_pb2.JobEvent(seq=3, kind="schedule", message="v1 active",
                             time_unix_s=0)
    view.event(_job(3, version=1), event)
    view.finish()
    text = out.getvalue()
    assert text.count("\r") >= 5
    # 2 steps/s x (2 ranks x 4 x 128) tokens = 2048 tokens/s
    assert "step 3/10 (30%)" in text and "loss 1.7000" in text
    assert "2.05k tok/s" in text and "schedule v1" in text
    assert "] schedule: v1 active\n" in text
    assert text.endswith("\n")


def test_progress_view_exportedModel_countsSamples():
    """A model fed named inputs (the coordinator says samples, 8 a step)
    shows samples/s, and `tandem status` its own description."""
    out, clock = io.StringIO(), FakeClock()
    view = ProgressView(out=out, tty=True, clock=clock)
    for step in (0, 1, 2, 3):
        job = _job(step)
        job.throughput_unit, job.items_per_step = "samples", 8
        view.update(job)
        clock.t += 0.5
    view.finish()
    assert "16 samples/s" in out.getvalue(), out.getvalue()

    from tandem import cli
    job.model_text = "Conformer (exported): 3 units"
    model, batch = cli._describe_spec(job.spec, job)
    assert model.startswith("Conformer (exported): 3 units")
    assert batch == "2 ranks x micro_batch 4 x grad_accum 1 = 8 samples/step"


def test_progress_view_plain_lines_are_throttled():
    out, clock = io.StringIO(), FakeClock()
    view = ProgressView(out=out, tty=False, min_interval=1.0, clock=clock)
    for step in range(1, 11):
        clock.t += 0.25
        view.update(_job(step))
    view.finish()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0].startswith("RUNNING  step 1/10 (10%)")
    assert lines[-1].startswith("RUNNING  step 10/10 (100%)")
    assert 3 <= len(lines) <= 5  # every ~1 s, and the last step


def test_every_problem_in_one_pass():
    # Two key typos and a value of the wrong type: all three named at once,
    # each with its own hint, not one per run.
    with pytest.raises(SpecError) as e:
        S.parse_yaml("modle:\n  layers: 2\nbatch:\n  micro_bach: 2\n"
                     "  seq_len: many\ntrain:\n  steps: 5\n")
    text = str(e.value)
    assert text.startswith("3 problems:\n"), text
    assert "unknown key 'modle' (did you mean 'model'?)" in text
    assert "unknown key 'batch.micro_bach' (did you mean 'micro_batch'?)" in text
    assert "batch.seq_len" in text
    assert e.value.path == "modle"


def test_enum_value_typo_gets_a_hint():
    with pytest.raises(SpecError) as e:
        S.parse_yaml("model:\n  dtype: bf61\n")
    assert str(e.value).endswith("got 'bf61' (did you mean 'bf16'?)")
