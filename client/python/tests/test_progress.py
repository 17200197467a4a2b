"""What `tandem status` and `tandem watch` say the active schedule bought."""

from tandem.progress import ProgressView, describe_outcome
from tandem.v1 import job_pb2


def job(**fields):
    j = job_pb2.Job()
    j.spec.train.steps = 40
    for k, v in fields.items():
        setattr(j, k, v)
    return j


def test_outcome_before_any_measurement():
    assert describe_outcome(job()) == "- (not measured yet)"


def test_outcome_of_a_new_plan_not_yet_measured():
    # A plan that has run fewer steps than a window: its prediction, not the
    # figures of the version it replaced.
    assert describe_outcome(job(schedule_version=3,
                                predicted_iteration_s=0.2603)) == (
        "v3 not measured yet (too few steps); predicted 0.2603 s/iter")


def test_outcome_on_the_baseline():
    assert describe_outcome(job(measured_iteration_s=0.2775,
                                measured_speedup=1.0)) == (
        "baseline; measured 0.2775 s/iter")


def test_outcome_of_a_plan_with_prediction_error():
    # The speedup as the coordinator measured it, interleaved, with its
    # interval and basis.
    text = ("1.28\u00d7 (1.21\u20131.33) faster than the baseline (v0: "
            "FSDP-style on-demand gathers), measured interleaved over 24 steps")
    line = describe_outcome(job(schedule_version=1, measured_speedup=1.28,
                                speedup_low=1.21, speedup_high=1.33,
                                speedup_steps=24, speedup_text=text,
                                measured_iteration_s=0.2171,
                                predicted_iteration_s=0.2552))
    assert line == (text + "; measured 0.2171 s/iter, predicted 0.2552 "
                    "(+17.5%)")


def test_outcome_before_the_speedup_is_measured():
    # Never a number from too few steps: the coordinator says why.
    text = "not measured yet (v2 alternates with the baseline: 1 of 4 block pairs)"
    line = describe_outcome(job(schedule_version=2, measured_iteration_s=0.1,
                                speedup_text=text))
    assert line.startswith(text + "; measured 0.1000 s/iter")
    # A coordinator that says nothing about it.
    line = describe_outcome(job(schedule_version=2, measured_iteration_s=0.1))
    assert line.startswith("speedup not measured; measured 0.1000 s/iter")


def test_watch_line_carries_the_speedup():
    import io
    view = ProgressView(out=io.StringIO(), tty=False)
    line = view.status_text(job(step=5, schedule_version=1,
                                measured_speedup=1.28, speedup_low=1.21,
                                speedup_high=1.33), bar=False)
    assert "schedule v1" in line and "1.28x (1.21-1.33) vs baseline" in line
    line = view.status_text(job(step=5), bar=False)
    assert "vs baseline" not in line


def test_waiting_job_says_for_what_and_how_long():
    from tandem.progress import describe_waiting
    import io
    text = ("1 of 2 ranks registered (rank 0 on a); missing rank 1: start "
            "it with `tandem launch --nproc 1 --job j`")
    j = job(state=job_pb2.JOB_STATE_PENDING, waiting=text,
            waiting_since_unix_s=1000.0)
    assert describe_waiting(j, now_unix=1035.0) == "waiting 35 s: " + text
    assert describe_waiting(j, now_unix=1250.4).startswith("waiting 4 min 10 s: ")
    assert describe_waiting(j, now_unix=1000.0 + 7500).startswith(
        "waiting 2 h 5 min: ")
    view = ProgressView(out=io.StringIO(), tty=False)
    assert text in view.status_text(j, bar=False)
    # A coordinator that says nothing: the count.
    j = job(state=job_pb2.JOB_STATE_PENDING)
    j.spec.parallel.world_size = 2
    assert describe_waiting(j) == "waiting for 2 workers"


def test_watch_prints_each_event_as_one_short_line():
    """Issue 37 item 5: a schedule event was a ~700-character line of the
    planner's internals. `tandem watch` prints its headline; --verbose and
    `tandem status` print it whole."""
    import io
    from tandem.progress import SHORT_MESSAGE, event_line
    e = job_pb2.JobEvent(
        seq=4, time_unix_s=1000.0, kind="schedule",
        message="v2 (trial) from step 40: predicted 0.1234 s/iter (measured "
                "0.1300), exposed comm 0.0100 s, peak 12.5 MiB; passes "
                "zero3-insert,prefetch,unshard; planned in 3.1 ms on "
                "2 ranks x cpu; assumed: link 1.2 GB/s (calibrated " +
                "x" * 500 + "); runner-up fsdp's plan predicted 0.13")
    short = event_line(e, verbose=False)
    assert short.endswith("peak 12.5 MiB [...]"), short
    assert "passes" not in short and len(short) < 200
    assert event_line(e).endswith("predicted 0.13")  # whole by default
    # A headline alone that is too long is cut.
    long_one = job_pb2.JobEvent(kind="replan", message="y" * 400)
    cut = event_line(long_one, verbose=False)
    assert cut.endswith("...") and len(cut) < SHORT_MESSAGE + 40
    # A message of one clause is printed as it is.
    plain = job_pb2.JobEvent(kind="state", message="RUNNING: all 2 ranks")
    assert event_line(plain, verbose=False).endswith(": RUNNING: all 2 ranks")
    out = io.StringIO()
    view = ProgressView(out=out, tty=False)
    view.event(job(step=0), e)
    assert out.getvalue().count("\n") == 1 and "runner-up" not in out.getvalue()
    out = io.StringIO()
    ProgressView(out=out, tty=False, verbose=True).event(job(step=0), e)
    assert "runner-up" in out.getvalue()


def test_status_shows_the_loss_scale_and_skipped_steps(capsys):
    """With dynamic loss scaling `tandem status` shows the scale and the
    steps skipped; without it, no such row."""
    import argparse
    from types import SimpleNamespace
    from tandem import cli

    for fields, want in ((dict(loss_scale=32768.0, skipped_steps=3),
                          "loss scale 32768, 3 steps skipped (a gradient "
                          "held inf or NaN)"),
                         (dict(loss_scale=65536.0, skipped_steps=1),
                          "loss scale 65536, 1 step skipped"),
                         ({}, None)):
        j = job(step=5, loss=2.5, **fields)

        class Status(tuple):
            workers = []

        client = SimpleNamespace(get=lambda _, j=j: Status((j, [])))
        assert cli.cmd_status(client, argparse.Namespace(
            job="j", spec=False, events=0)) == cli.EXIT_OK
        out = capsys.readouterr().out
        if want is None:
            assert "loss scale" not in out
        else:
            assert want in " ".join(out.split()), out
