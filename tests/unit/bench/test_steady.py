"""bench/drift/steady.py: stop_processes (workers and the coordinator end,
one that ignores SIGTERM too, killed after its grace), and the block pairs
and paired ratios that bench/e2e and bench/noise compare plans by."""

import math
import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench", "drift"))
import steady  # noqa: E402


def test_stop_processes_ends_workers_and_coordinator(monkeypatch):
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('ready', flush=True); time.sleep(60)")
    workers = [subprocess.Popen(["sleep", "60"]),
               subprocess.Popen([sys.executable, "-c", stubborn], stdout=subprocess.PIPE)]
    workers[1].stdout.readline()  # its handler is in place
    coord = subprocess.Popen(["sleep", "60"])
    done = subprocess.Popen(["true"])
    done.wait()
    # A short grace, so the stubborn worker is killed quickly.
    real_wait = subprocess.Popen.wait
    monkeypatch.setattr(subprocess.Popen, "wait",
                        lambda self, timeout=None: real_wait(self, None if timeout is None
                                                             else min(timeout, 1)))
    start = time.monotonic()
    steady.stop_processes(workers + [done], coord)
    assert time.monotonic() - start < 10
    assert workers[0].returncode == -signal.SIGTERM
    assert workers[1].returncode == -signal.SIGKILL
    assert coord.returncode == -signal.SIGTERM


def alternating(a_s, b_s, block=3, pairs=4):
    """An --alternate run's steps: step 0 --schedule's plan (A, v4), then B
    (v5) and A take turns in blocks, B first; each block's first step a
    slow switch."""
    steps = {0: (9.0, 4)}
    for k in range(pairs):
        for i in range(block):
            steps[1 + 2 * block * k + i] = (5.0 if i == 0 else b_s + 0.001 * i, 5)
            steps[1 + 2 * block * k + block + i] = (5.0 if i == 0 else a_s + 0.001 * i, 4)
    return steps


def test_block_pairs_follow_the_workers_block_order():
    full = alternating(0.30, 0.20)
    firsts, others = steady.block_pairs(full, 3)
    assert len(firsts) == len(others) == 4
    # Each block's first step (the switch) is left out.
    assert firsts[0] == [0.301, 0.302] and others[0] == [0.201, 0.202]
    steps = dict(full)
    del steps[max(steps)]  # the last A block is incomplete: its pair is dropped
    assert len(steady.block_pairs(steps, 3)[0]) == 3
    with pytest.raises(ValueError):
        steady.block_pairs(steps, 1)
    # A block that ran the memory guard's least-memory schedule (-1) ends
    # the pairs before it.
    guarded = dict(full)
    guarded[14] = (0.5, -1)  # in the third B block
    assert len(steady.block_pairs(guarded, 3)[0]) == 2
    # A B block on A's own plan: the run did not alternate from there.
    same = dict(full)
    same[8] = (0.2, 4)
    assert len(steady.block_pairs(same, 3)[0]) == 1
    # A run that never alternated: no pair.
    assert steady.block_pairs({s: (0.3, 4) for s in range(25)}, 3) == ([], [])
    assert steady.block_pairs({}, 3) == ([], [])


def test_paired_ratio_is_the_geometric_mean_with_the_coordinators_interval():
    def ratio(pairs):
        return steady.paired_ratio([[a] for a, _ in pairs], [[b] for _, b in pairs])
    assert steady.paired_ratio([], []) is None
    r, low, high = ratio([(1.01, 1.0), (0.99, 1.0), (1.02, 1.0), (0.98, 1.0)])
    assert r == pytest.approx(1.0, abs=1e-3) and low < 1.0 < high
    r, low, high = ratio([(1.05, 1.0), (1.06, 1.0), (1.04, 1.0), (1.05, 1.0)])
    assert 1.0 < low < r < high
    # Four pairs that disagree: the bootstrap alone would draw from these
    # four again and read their spread too small; Student's t with 3
    # degrees of freedom is wider, and the interval is at least that.
    pairs = [(1.2, 1.0), (0.9, 1.0), (1.1, 1.0), (0.95, 1.0)]
    logs = [math.log(a / b) for a, b in pairs]
    mean = sum(logs) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 3)
    r, low, high = ratio(pairs)
    assert low <= math.exp(mean - 3.182 * sd / 2) + 1e-12
    assert high >= math.exp(mean + 3.182 * sd / 2) - 1e-12
    assert low < 1.0 < high and high / low > 1.2
    # Seeded: the same pairs give the same interval.
    assert ratio(pairs) == (r, low, high)


def test_t975_follows_the_table_and_then_the_normal():
    assert steady.t975(1) == 12.706 and steady.t975(10) == 2.228
    assert 2.060 < steady.t975(23) < 2.086  # between the table's 20 and 25
    assert steady.t975(40) == pytest.approx(2.021, abs=0.002)
    assert steady.t975(1000) == pytest.approx(1.962, abs=0.002)


def test_wait_shares_take_the_busiest_rank_that_measured(tmp_path):
    r0 = tmp_path / "worker0.jsonl"
    r1 = tmp_path / "worker1.jsonl"
    r0.write_text('{"step":0,"iteration_s":0.3,"schedule_version":0,"cpu_wait_share":0.06}\n'
                  '{"step":1,"iteration_s":0.3,"schedule_version":0}\n'
                  'not a step line\n')
    r1.write_text('{"step":0,"iteration_s":0.3,"schedule_version":0,"cpu_wait_share":0.21}\n'
                  '{"step":1,"iteration_s":0.3,"schedule_version":0}\n')
    assert steady.wait_shares([str(r0), str(r1)]) == {0: 0.21}
