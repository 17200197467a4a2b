"""Resume at another world size (issue "Training features", item 4).

A built-in model trains at world W with real `tandem-worker --standalone`
processes and checkpoints; a job with the same spec at world W' (2 -> 3,
3 -> 1) resumes from that checkpoint, its shards and AdamW moments
resharded on load. What it must equal is PyTorch eager continuing from the
same state: the reference of tests/reference/hf_models.py loads the
checkpoint's params (through `tandem export-weights`) and its AdamW moments
(reassembled here from the rank files' shards, as
worker/checkpoint/checkpoint_files.h documents them) into
torch.optim.AdamW at the checkpoint's step, and trains the same global
batches. So the losses after the resume and the final params match an
uninterrupted run at W' started from that state, to fp32 rounding.

The data position is kept in sequences: a job resumed with another global
batch size (here 6 -> 9 sequences a step) reads on from the sequence the
checkpoint's data stopped at.

    TANDEM_BUILD_DIR=build /usr/bin/python3 -m pytest -q tests/export/test_resume_world_size.py
"""

import json
import os
import pathlib
import sys

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "reference"))
import hf_models  # noqa: E402
import test_builtin_reference as builtin  # noqa: E402
import test_exported_numerics as numerics  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(numerics.WORKER),
                                reason=f"no {numerics.WORKER}")

FIRST = 3  # steps before the checkpoint
TOTAL = 6


def batch_at(tokens, first, count):
    """Sequences first .. first+count-1 of the token file, as documented
    (numerics.global_batch with any start and size)."""
    seq = numerics.SEQ_LEN
    windows = (len(tokens) - 1) // seq
    rows = [tokens[(i % windows) * seq:(i % windows) * seq + seq + 1]
            for i in range(first, first + count)]
    seqs = torch.stack(rows)
    return {"input_ids": seqs[:, :-1].contiguous(),
            "labels": seqs[:, 1:].contiguous()}


def checkpoint_moments(step_dir):
    """{export name: (exp_avg, exp_avg_sq)} of a checkpoint, reassembled
    from every rank's shards by the params list (the `tensors` blob)."""
    manifest = dict(line.split(" ", 1) for line in
                    open(os.path.join(step_dir, "MANIFEST")).read().split("\n")
                    if " " in line)
    world = int(manifest["world"])
    ranks = [numerics.read_rank_checkpoint(
        os.path.join(step_dir, f"rank-{r}.ckpt")) for r in range(world)]
    out = {}
    for line in ranks[0]["tensors"].decode().splitlines():
        name, dtype, shape, export = line.split("\t")
        assert dtype == "float32", line
        shape = [int(d) for d in shape.split(",")] if shape else []
        full = [numerics.full_blob(ranks, name, what, shape)
                for what in ("exp_avg", "exp_avg_sq")]
        if "*" in export:  # a stacked param: one tensor per index
            for i in range(shape[0]):
                out[export.replace("*", str(i))] = (full[0][i], full[1][i])
        else:
            out[export] = tuple(full)
    return out


def continue_reference(preset, params, moments, tokens, first_sequence,
                       global_batch, step, steps):
    """PyTorch eager from `params` and AdamW `moments` at optimizer step
    `step`: `steps` more steps of `global_batch` sequences from
    `first_sequence`. Returns (losses, final params)."""
    model = hf_models.CausalLM(builtin.CONFIGS[preset])
    model.load_state_dict(params)
    named = dict(model.named_parameters())
    opt = torch.optim.AdamW(list(named.values()), lr=numerics.LR,
                            betas=numerics.BETAS, eps=numerics.EPS,
                            weight_decay=numerics.WD)
    for name, p in named.items():
        exp_avg, exp_avg_sq = moments[name]
        opt.state[p] = {"step": torch.tensor(float(step)),
                        "exp_avg": exp_avg.clone(),
                        "exp_avg_sq": exp_avg_sq.clone()}
    losses = []
    for k in range(steps):
        opt.zero_grad()
        loss = model(**batch_at(tokens, first_sequence + k * global_batch,
                                global_batch))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(named.values()), numerics.CLIP)
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in named.items()}


@pytest.mark.parametrize("preset,old,new,micro_batch", [
    ("llama", 2, 3, None),
    ("llama", 3, 1, None),
    ("moe", 2, 3, None),
    # Another global batch: 2 x 3 = 6 sequences a step, then 3 x 3 = 9.
    ("llama", 2, 3, 3),
])
def test_resume_at_another_world_matches_pytorch(tmp_path, preset, old, new,
                                                 micro_batch):
    vocab = builtin.CONFIGS[preset].vocab
    tokens_path, tokens = builtin.tokens_file(tmp_path, vocab)
    _, _, init_path = builtin.initial_weights(tmp_path, preset)
    ckpt = tmp_path / "ckpt"

    def spec(world, steps, mb):
        return lambda _: builtin.builtin_yaml(preset, init_path, tokens_path,
                                              world, ckpt, steps=steps,
                                              micro_batch=mb)

    first_losses, _ = numerics.train(tmp_path, None, None, None, old,
                                     spec_text=spec(old, FIRST, None),
                                     tag="-first")
    assert len(first_losses) == FIRST
    step_dir = ckpt / f"step-{FIRST:08d}"
    params, meta = builtin.export_weights(step_dir,
                                          tmp_path / "mid.safetensors")
    assert meta["tandem.step"] == str(FIRST)
    moments = checkpoint_moments(step_dir)
    assert sorted(moments) == sorted(params)

    # The resumed job: same spec, another world (and maybe batch).
    runs = numerics.run_standalone(
        _write(tmp_path / "resume.yaml", spec(new, TOTAL, micro_batch)(None)),
        new)
    for r, (rc, _, err) in enumerate(runs):
        assert rc == 0, f"rank {r} failed:\n{err[-3000:]}"
    assert f"resharded from {old} ranks to {new}" in runs[0][2], runs[0][2]
    losses = [json.loads(l)["loss"] for l in runs[0][1].splitlines()
              if l.startswith('{"step"')]
    assert len(losses) == TOTAL - FIRST, runs[0][1]

    old_batch = numerics.GLOBAL_BATCH
    new_batch = (micro_batch or numerics.GLOBAL_BATCH // new) * new
    ref_losses, ref_params = continue_reference(
        preset, params, moments, tokens, FIRST * old_batch, new_batch, FIRST,
        TOTAL - FIRST)
    got, meta = builtin.export_weights(ckpt, tmp_path / "end.safetensors")
    assert meta["tandem.step"] == str(TOTAL)
    builtin.compare(f"{preset} {old} -> {new} ranks, {new_batch} a step",
                    losses, ref_losses, got, ref_params, params)


def _write(path, text):
    path.write_text(text)
    return path
