"""train.lr_schedule, warmup_steps and min_lr through the client: the keys
parse locally like every JobSpec field (shape and types), and the
coordinator fills the default and refuses bad values with field-level
messages (common/job/job_spec.cc), which the client raises as they are.
The curve itself is tested against torch in
tests/export/test_lr_schedule.py."""

import grpc
import pytest

import tandem
from tandem_harness import small_spec


def test_keys_parse_with_their_types():
    spec = tandem.spec_from_dict(small_spec(
        train={"lr_schedule": "cosine", "warmup_steps": "20", "min_lr": "1e-5"}))
    assert spec.train.lr_schedule == "cosine"
    assert spec.train.warmup_steps == 20
    assert spec.train.min_lr == pytest.approx(1e-5)
    with pytest.raises(tandem.SpecError) as e:
        tandem.spec_from_dict(small_spec(train={"warmup_steps": "ten"}))
    assert str(e.value) == ("train.warmup_steps: expected an integer, "
                            "got 'ten'")
    with pytest.raises(tandem.SpecError) as e:
        tandem.spec_from_dict(small_spec(train={"lr_schedule": 1}))
    assert "train.lr_schedule: expected a string, got 1" in str(e.value)


def test_default_is_constant_and_a_schedule_is_kept(client):
    job = client.submit(small_spec(steps=10))
    assert job.spec.train.lr_schedule == "constant"
    assert (job.spec.train.warmup_steps, job.spec.train.min_lr) == (0, 0)
    job = client.submit(small_spec(steps=10, train={
        "lr": 2e-3, "lr_schedule": "linear", "warmup_steps": 9,
        "min_lr": 2e-3}))
    assert (job.spec.train.lr_schedule, job.spec.train.warmup_steps,
            job.spec.train.min_lr) == ("linear", 9, 2e-3)


@pytest.mark.parametrize("train,message", [
    ({"lr_schedule": "cos"},
     "train.lr_schedule must be one of constant, cosine, linear, got 'cos'"),
    ({"warmup_steps": -2},
     "train.warmup_steps must be >= 0 (0: no warm-up), got -2"),
    ({"lr_schedule": "cosine", "warmup_steps": 5},
     "train.warmup_steps must be < train.steps (5) so that the run reaches "
     "train.lr, got 5"),
    ({"lr_schedule": "linear", "min_lr": -1.0},
     "train.min_lr must be >= 0, got -1"),
    ({"lr": 1e-3, "lr_schedule": "cosine", "min_lr": 2e-3},
     "train.min_lr must be <= train.lr (0.001), the peak it decays from, "
     "got 0.002"),
    ({"min_lr": 1e-4},
     "train.min_lr is the floor of a decaying schedule, unused by "
     "train.lr_schedule constant: set lr_schedule to cosine or linear, or "
     "remove min_lr (got 0.0001)"),
])
def test_bad_values_are_refused_naming_the_field(client, train, message):
    with pytest.raises(tandem.TandemError) as e:
        client.submit(small_spec(steps=5, train=train))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in e.value.message
