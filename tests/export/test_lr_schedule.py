"""train.lr_schedule end to end (issue 13): the worker trains at
torch.optim.lr_scheduler's learning rate, step for step.

The exported GPT (tests/models/gpt.py) is trained by real `tandem-worker
--standalone` processes for 12 steps under cosine and linear decay (with and
without a linear warm-up) and warm-up then a constant rate, at worlds 1 and
2, and compared with PyTorch eager training (test_exported_numerics.py's:
torch.optim.AdamW and clip_grad_norm_, the archive's initial weights, the
same global batches) whose learning rate comes from the scheduler
client/README.md documents ("Learning-rate schedule"): this file runs that
README code, stepped after every optimizer step. Losses step by step and the
final parameters agree to relative error 1e-5. The formula exists only in
the worker (common/job/lr_schedule.h); nothing here re-implements it, so the
torch configuration the README gives users is what is checked.

The comparison can tell schedules apart: the same reference with its
scheduler one step ahead misses the worker by more than 10 times 1e-5. A run
resumed from a mid-run checkpoint continues the curve (step k at step k's
rate, not step 0's): its losses and parameters equal the uninterrupted
run's exactly.

    TANDEM_BUILD_DIR=build /usr/bin/python3 -m pytest -q tests/export/test_lr_schedule.py
"""

import json
import os
import pathlib
import re
import shutil
import sys
import warnings

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import test_exported_numerics as numerics  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not os.path.exists(numerics.WORKER),
                       reason=f"no {numerics.WORKER}"),
    # torch 1.13's SequentialLR steps its second scheduler with an epoch
    # argument at the milestone, which torch itself warns about.
    pytest.mark.filterwarnings("ignore:The epoch parameter:UserWarning"),
]

README = HERE.parent.parent / "client" / "README.md"
STEPS = 12
VOCAB = 512
RTOL = numerics.RTOL


def readme_scheduler():
    """tandem_lr_scheduler(opt, train) as client/README.md defines it."""
    text = README.read_text()
    m = re.search(r"tests/export/test_lr_schedule\.py trains PyTorch with "
                  r"this code -->\n```python\n(.*?)```", text, re.S)
    assert m, "the scheduler code block is missing from client/README.md"
    scope = {}
    exec(compile(m.group(1), str(README), "exec"), scope)
    return scope["tandem_lr_scheduler"]


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    return numerics.export_model(tmp_path_factory, "gpt")


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "tokens.bin"
    count = STEPS * numerics.GLOBAL_BATCH * numerics.SEQ_LEN + 1
    return path, numerics.write_tokens(path, VOCAB, count)


def train_section(schedule, warmup, min_lr):
    """A spec's `train` keys (those the README's scheduler reads)."""
    return {"steps": STEPS, "lr": numerics.LR, "lr_schedule": schedule,
            "warmup_steps": warmup, "min_lr": min_lr}


def run_worker(spec_path, world):
    """Trains spec_path at `world`; returns rank 0's {step: loss}."""
    runs = numerics.run_standalone(spec_path, world)
    for r, (rc, _, err) in enumerate(runs):
        assert rc == 0, f"rank {r} failed:\n{err[-3000:]}"
    lines = [json.loads(l) for l in runs[0][1].splitlines()
             if l.startswith('{"step"')]
    return {l["step"]: l["loss"] for l in lines}


def reference(build, tokens, train, ahead=0):
    """PyTorch eager under the README's scheduler for `train` (`ahead`
    extra scheduler steps first); returns (losses, final params)."""
    module, _ = build()
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=train["lr"], betas=numerics.BETAS,
                            eps=numerics.EPS, weight_decay=numerics.WD)
    sched = readme_scheduler()(opt, train)
    with warnings.catch_warnings():  # stepping before opt.step(), knowingly
        warnings.simplefilter("ignore")
        for _ in range(ahead):
            sched.step()
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = module(**numerics.global_batch(tokens, step))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, numerics.CLIP)
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone()
                    for n, p in module.named_parameters()}


def worst_loss_error(losses, ref_losses):
    return max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))


def check_matches(what, losses, ref_losses, got, ref):
    """Every step's loss within RTOL of PyTorch's; the parameters as one
    vector within RTOL, each tensor within 10 * RTOL (numerics.rel_err)."""
    assert len(losses) == STEPS, f"{what}: {len(losses)} steps reported"
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        assert abs(a - b) <= RTOL * abs(b), (
            f"{what} step {step}: loss {a} vs PyTorch {b}")
    assert set(got) == set(ref)
    names = sorted(got)
    total = numerics.rel_err(torch.cat([got[n].flatten() for n in names]),
                             torch.cat([ref[n].flatten() for n in names]))
    worst = max((numerics.rel_err(got[n], ref[n]), n) for n in names)
    assert total <= RTOL, f"{what}: parameters' relative error {total:.2e}"
    assert worst[0] <= 10 * RTOL, (
        f"{what}: {worst[1]} relative error {worst[0]:.2e}")


def train_and_compare(tmp_path, gpt, tokens, world, train, every=STEPS):
    """Trains `train` on the worker and in PyTorch, checks they match and
    that a one-step shift of the schedule would not; returns the worker's
    {step: loss} and its checkpoint dir."""
    mod, archive, manifest = gpt
    tokens_path, token_ids = tokens
    ckpt = tmp_path / "ckpt"
    spec = tmp_path / "spec.yaml"
    spec.write_text(numerics.spec_yaml(archive, tokens_path, VOCAB, world, ckpt,
                                       train=train, every=every))
    by_step = run_worker(spec, world)
    losses = [by_step[s] for s in sorted(by_step)]
    assert sorted(by_step) == list(range(STEPS))
    what = (f"{train['lr_schedule']} warmup {train['warmup_steps']} "
            f"world {world}")
    ref_losses, ref_params = reference(mod.build, token_ids, train)
    got = numerics.final_params(str(ckpt), world, manifest)
    check_matches(what, losses, ref_losses, got, ref_params)
    shifted, _ = reference(mod.build, token_ids, train, ahead=1)
    assert worst_loss_error(losses, shifted) > 10 * RTOL, (
        f"{what}: the losses cannot tell the schedule from itself one step "
        "ahead; the comparison proves nothing")
    return by_step, ckpt


@pytest.mark.parametrize("schedule,warmup,min_lr,world", [
    ("cosine", 3, 3e-4, 1),
    ("cosine", 0, 3e-4, 2),   # the decay alone
    ("linear", 2, 0.0, 2),
    ("linear", 5, 1e-3, 1),
    ("constant", 4, 0.0, 1),
])
def test_worker_lr_matches_torch_scheduler(tmp_path, gpt, tokens, schedule,
                                           warmup, min_lr, world):
    train_and_compare(tmp_path, gpt, tokens, world,
                      train_section(schedule, warmup, min_lr))


def test_resumed_run_continues_the_curve(tmp_path, gpt, tokens):
    """Cosine with warm-up at world 2, checkpointed after step 6 (and 12):
    the uninterrupted run matches PyTorch; with its last checkpoint removed,
    the rerun resumes after step 6 and repeats steps 6..11 bit for bit."""
    _, archive, manifest = gpt
    world = 2
    by_step, ckpt = train_and_compare(tmp_path, gpt, tokens, world,
                                      train_section("cosine", 4, 1e-4),
                                      every=STEPS // 2)
    final = numerics.final_params(str(ckpt), world, manifest)
    newest = sorted(d for d in os.listdir(ckpt) if d.startswith("step-"))[-1]
    assert int(newest[len("step-"):]) == STEPS, newest
    shutil.rmtree(ckpt / newest)

    resumed = run_worker(tmp_path / "spec.yaml", world)
    assert sorted(resumed) == list(range(STEPS // 2, STEPS))
    for step, loss in resumed.items():
        assert loss == by_step[step], (
            f"resumed step {step}: loss {loss}, uninterrupted {by_step[step]}")
    again = numerics.final_params(str(ckpt), world, manifest)
    for name, tensor in final.items():
        assert torch.equal(again[name], tensor), name
