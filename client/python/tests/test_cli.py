"""The `tandem` CLI as a subprocess (python3 -m tandem) against a real
coordinator: output and exit codes (0 ok, 1 server error, 2 usage)."""

import re
import time

import yaml

from tandem_harness import (EXAMPLE_SPEC, free_port, run_cli, small_spec, unique_name)

JOB_ID = re.compile(r"submitted job (\S+): PENDING, waiting for (\d+) workers")


def write_spec(tmp_path, text):
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return p


def small_yaml(name=None, world_size=2, extra=""):
    return ("name: %s\nmodel:\n  preset: tiny-llama\nbatch:\n  micro_batch: 2"
            "\n  seq_len: 32\ntrain:\n  steps: 5\nparallel:\n  world_size: %d\n"
            % (name or unique_name("cli"), world_size)) + extra


def test_cli_submit_status_list_cancel(coordinator, tmp_path):
    addr = coordinator.address
    r = run_cli("submit", EXAMPLE_SPEC, address=addr)
    assert r.returncode == 0, r.stderr
    m = JOB_ID.search(r.stdout)
    assert m, r.stdout
    job_id = m.group(1)
    assert "tandem watch %s" % job_id in r.stdout

    r = run_cli("status", job_id, address=addr)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^state\s+PENDING$", r.stdout, re.M)
    assert re.search(r"^job\s+%s$" % re.escape(job_id), r.stdout, re.M)
    assert "tokens/step" in r.stdout
    assert "state: PENDING: submitted" in r.stdout

    r = run_cli("status", job_id, "--spec", address=addr)
    assert r.returncode == 0 and "  grad_accum: 1" in r.stdout  # defaults

    r = run_cli("list", address=addr)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split() == [
        "JOB", "STATE", "STEP", "SCHEDULE", "SUBMITTED"]
    assert re.search(r"^%s\s+PENDING\s+0/\d+" % re.escape(job_id), r.stdout,
                     re.M)

    r = run_cli("cancel", job_id, "--reason", "done testing", address=addr)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "job %s CANCELLED: done testing" % job_id

    r = run_cli("list", "--state", "cancelled", address=addr)
    assert job_id in r.stdout
    r = run_cli("list", "--state", "PENDING,RUNNING", address=addr)
    assert job_id not in r.stdout

    r = run_cli("cancel", job_id, address=addr)
    assert r.returncode == 1
    assert r.stdout == ""
    assert "already ended CANCELLED" in r.stderr


def test_cli_submit_quiet_prints_only_the_id(coordinator, tmp_path):
    r = run_cli("submit", "-q", write_spec(tmp_path, small_yaml()),
                address=coordinator.address)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()
    assert re.fullmatch(r"cli-[0-9a-f]+-[0-9a-f]+", job_id)
    assert run_cli("status", job_id,
                   address=coordinator.address).returncode == 0


def test_cli_coordinator_from_env_and_after_command(coordinator, tmp_path):
    spec = write_spec(tmp_path, small_yaml())
    r = run_cli("submit", "-q", spec,
                env={"TANDEM_COORDINATOR": coordinator.address})
    assert r.returncode == 0, r.stderr
    r = run_cli("status", r.stdout.strip(), "--coordinator",
                coordinator.address)
    assert r.returncode == 0, r.stderr


def test_cli_invalid_spec_prints_server_message_exit_1(coordinator, tmp_path):
    spec = write_spec(tmp_path, small_yaml(world_size=5000))
    r = run_cli("submit", spec, address=coordinator.address)
    assert r.returncode == 1
    assert r.stderr.strip() == ("tandem: invalid job spec: parallel.world_size "
                                "must be >= 1 and <= 4096, got 5000")


def test_cli_unknown_key_is_a_usage_error(coordinator, tmp_path):
    spec = write_spec(tmp_path, small_yaml(extra="paralel:\n  zero: 3\n"))
    r = run_cli("submit", spec, address=coordinator.address)
    assert r.returncode == 2
    assert "unknown key 'paralel' (did you mean 'parallel'?)" in r.stderr
    assert str(spec) in r.stderr
    spec = write_spec(tmp_path, small_yaml(extra="memory:\n  budget_bytes: "
                                                 "lots\n"))
    r = run_cli("submit", spec, address=coordinator.address)
    assert r.returncode == 2
    assert "memory.budget_bytes: expected an integer" in r.stderr


def test_cli_usage_errors_exit_2(coordinator):
    for args in ([], ["frobnicate"], ["status"], ["schedule", "j",
                                                 "--version", "x"],
                 ["list", "--state", "sleeping"],
                 ["submit", "/nonexistent/job.yaml"]):
        r = run_cli(*args, address=coordinator.address)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr, args


def test_cli_server_errors_exit_1(coordinator, tmp_path):
    addr = coordinator.address
    job_id = run_cli("submit", "-q", write_spec(tmp_path, small_yaml()),
                     address=addr).stdout.strip()
    r = run_cli("reoptimize", job_id, address=addr)
    assert r.returncode == 1 and "has no profile yet" in r.stderr
    r = run_cli("schedule", job_id, address=addr)
    assert r.returncode == 1 and "has no schedule yet" in r.stderr
    r = run_cli("schedule", job_id, "--version", "2", address=addr)
    assert r.returncode == 1 and "has no schedule v2; it has v0" in r.stderr
    r = run_cli("status", "no-such-job", address=addr)
    assert r.returncode == 1 and "no job 'no-such-job'" in r.stderr
    out = tmp_path / "trace.json"
    r = run_cli("timeline", job_id, "-o", str(out), address=addr)
    assert r.returncode == 1 and "no timeline of job" in r.stderr
    assert not out.exists()


def test_cli_watch_of_cancelled_job_exits_1(coordinator, tmp_path):
    addr = coordinator.address
    job_id = run_cli("submit", "-q", write_spec(tmp_path, small_yaml()),
                     address=addr).stdout.strip()
    assert run_cli("cancel", job_id, "--reason", "bye",
                   address=addr).returncode == 0
    r = run_cli("watch", job_id, address=addr, timeout=30)
    assert r.returncode == 1
    assert "state: CANCELLED: bye" in r.stdout
    assert "\r" not in r.stdout  # not a terminal: plain lines
    assert "job %s CANCELLED: bye" % job_id in r.stderr


def test_cli_unreachable_coordinator(tmp_path):
    addr = "127.0.0.1:%d" % free_port()
    r = run_cli("list", address=addr, timeout=30)
    assert r.returncode == 1
    assert "cannot reach the tandem coordinator at %s" % addr in r.stderr
    assert "tandem-coordinator --listen" in r.stderr
    assert "--coordinator" in r.stderr


def test_cli_help_exits_0():
    r = run_cli("--help")
    assert r.returncode == 0
    for cmd in ("submit", "status", "watch", "list", "cancel", "reoptimize",
                "schedule", "timeline"):
        assert cmd in r.stdout


def test_cli_status_lists_workers_and_the_last_events(coordinator, tmp_path,
                                                      scripted_sessions):
    addr = coordinator.address
    r = run_cli("submit", "-q", write_spec(tmp_path, small_yaml()),
                address=addr)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()
    r = run_cli("status", job_id, address=addr)
    assert "workers:   none registered yet" in r.stdout

    workers = scripted_sessions(addr, job_id, 2)
    workers[1].progress(1, 5.0)
    deadline = time.monotonic() + 20
    while True:
        r = run_cli("status", job_id, "--events", "1", address=addr)
        assert r.returncode == 0, r.stderr
        if re.search(r"^\s+1\s+fake-1\s+cpu\s+\S+\s+1\s+connected\s+\d+s ago$",
                     r.stdout, re.M) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    lines = r.stdout.splitlines()
    header = lines.index("workers:") + 1
    assert lines[header].split() == ["RANK", "HOST", "DEVICE", "INCARNATION",
                                     "STEP", "SESSION", "LAST", "HEARD"]
    assert re.search(r"^\s+0\s+fake-0\s+cpu\s+\S+\s+0\s+connected\s+\d+s ago$",
                     r.stdout, re.M), r.stdout
    assert re.search(r"^\s+1\s+fake-1\s+cpu\s+\S+\s+1\s+connected\s+\d+s ago$",
                     r.stdout, re.M), r.stdout
    m = re.search(r"^events \(the last 1 of (\d+); --events N for more\):$",
                  r.stdout, re.M)
    assert m and int(m.group(1)) >= 2, r.stdout
    assert "all 2 workers registered" in r.stdout  # the newest event

    r = run_cli("status", job_id, "--events", "0", address=addr)
    assert re.search(r"^events \(the last 0 of \d+", r.stdout, re.M)
    assert "submitted" not in r.stdout.split("events (")[1]


def test_cli_schedule_versions_baseline_and_unknown(coordinator, tmp_path):
    addr = coordinator.address
    r = run_cli("submit", "-q", write_spec(tmp_path, small_yaml()),
                address=addr)
    job_id = r.stdout.strip()
    # No graph yet: no baseline either, and it says why.
    r = run_cli("schedule", job_id, "--version", "0", address=addr)
    assert r.returncode == 1
    assert "has no graph yet, so no baseline (v0)" in r.stderr
    r = run_cli("schedule", job_id, "--version", "4", address=addr)
    assert r.returncode == 1
    assert ("job %s has no schedule v4; it has v0 (the baseline)" % job_id
            in r.stderr)


def test_cli_absurd_values_and_system_paths_refused_at_submit(coordinator,
                                                              tmp_path):
    addr = coordinator.address
    cases = [
        (("model", "vocab", 2147483647), "model.vocab must be <= 16777216"),
        (("train", "lr", 1e308), "train.lr must be <= 10"),
        (("data", "path", "/etc/shadow"),
         "data.path '/etc/shadow' is under /etc, a system directory"),
        (("checkpoint", "dir", "/etc"),
         "checkpoint.dir '/etc' is under /etc, a system directory"),
    ]
    for (section, key, value), message in cases:
        spec = small_spec(name="absurd")
        spec.setdefault(section, {})[key] = value
        if section == "data":
            spec["data"]["kind"] = "tokens"
        if section == "checkpoint":
            spec["checkpoint"]["every"] = 5
        path = tmp_path / "absurd.yaml"
        path.write_text(yaml.safe_dump(spec))
        r = run_cli("submit", path, address=addr)
        assert r.returncode == 1, (spec, r.stdout, r.stderr)
        assert message in r.stderr, (spec, r.stderr)
    r = run_cli("list", address=addr)
    assert "absurd" not in r.stdout  # nothing was accepted
