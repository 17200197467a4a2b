"""The `tensors` data source with real workers (worker/README.md, "Exported
models"): exported models fed named arrays from a safetensors file, trained
8 steps by `tandem-worker --standalone` at worlds 1, 2 and 3 and compared
with PyTorch eager training (torch.optim.AdamW and clip_grad_norm_) of the
same module in this process.

- An MLP classifier (tests/models/mlp_classifier.py) over `features` float
  [n, 16] and `label` int64 [n] (role targets), some labels -100: each
  micro-batch's loss is the mean over its counted labels, so the worker must
  weight micro-batches by their counts to get the global batch's mean.
- The GPT (tests/models/gpt.py) with a `lengths` array: every micro-batch is
  cut to its longest sample, so ranks run different shapes in one step.

The reference shares no code with the worker. It reads the file as
documented: step s's global batch is samples s*G .. s*G+G-1 modulo N, and
runs the module once on the whole global batch, with labels past each
sample's length set to -100: PyTorch's own mean over the global batch's
counted items. Helpers (workers, checkpoints, the comparison) come from
test_exported_numerics.py.

    TANDEM_BUILD_DIR=build /usr/bin/python3 -m pytest -q tests/export
"""

import os
import pathlib
import sys

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "client" / "python"))
import tandem  # noqa: E402
import test_exported_numerics as numerics  # noqa: E402

STEPS = numerics.STEPS
GLOBAL = numerics.GLOBAL_BATCH  # samples per step, all ranks and micro-batches
SEQ = 32
MLP_SAMPLES = 20  # not a multiple of GLOBAL: steps 3 and 6 wrap
GPT_SAMPLES = 28

needs_worker = pytest.mark.skipif(not os.path.exists(numerics.WORKER),
                                  reason=f"no {numerics.WORKER}")


def write_tensors(path, arrays):
    with open(path, "wb") as f:
        tandem.export.write_safetensors(list(arrays.items()), f)


def step_rows(step, samples, size=GLOBAL):
    """File rows of step `step`'s global batch, as documented."""
    return torch.tensor([i % samples for i in range(step * size,
                                                    (step + 1) * size)])


def reference(module, batch_of):
    """PyTorch eager, one process: the module on each step's whole global
    batch, AdamW with clipping."""
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=numerics.LR, betas=numerics.BETAS,
                            eps=numerics.EPS, weight_decay=numerics.WD)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = module(**batch_of(step))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, numerics.CLIP)
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in module.named_parameters()}


def train_and_compare(tmp_path, mod, archive, manifest, data, world,
                      grad_accum, batch_of, what):
    module, _ = mod.build()
    ref_losses, ref_params = reference(module, batch_of)
    losses, ckpt = numerics.train(
        tmp_path, archive, None, None, world, tag=f"-a{grad_accum}",
        spec_text=lambda ckpt: numerics.tensors_spec_yaml(
            archive, data, world, ckpt, grad_accum))
    init, _ = mod.build()
    numerics.check_matches(what, losses, ref_losses,
                           numerics.final_params(ckpt, world, manifest),
                           ref_params, dict(init.named_parameters()), manifest)


# ------------------------------------------------------------------- MLP

@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    mod = numerics.load_model("mlp_classifier")
    module, batch = mod.build()
    path = str(tmp_path_factory.mktemp("mlp") / "mlp.tandem")
    manifest = tandem.export(module, batch, path=path,
                             dynamic_dims={"features": [0], "label": [0]},
                             roles={"label": "targets"})
    return mod, path, manifest


def mlp_arrays():
    g = torch.Generator().manual_seed(5)
    label = torch.randint(0, 5, (MLP_SAMPLES,), generator=g)
    # Every 4th sample from 1 is ignored: micro-batches count 1 to 3
    # labels, and no aligned pair (micro_batch 2) is all ignored.
    label[1::4] = -100
    return {"features": torch.randn(MLP_SAMPLES, 16, generator=g),
            "label": label}


@needs_worker
@pytest.mark.parametrize("world,grad_accum", [(1, 2), (2, 1), (3, 1)])
def test_mlp_named_inputs_weighted_by_counted_labels(tmp_path, mlp, world,
                                                     grad_accum):
    mod, archive, manifest = mlp
    assert [(i.name, i.role) for i in manifest.inputs] == [
        ("features", ""), ("label", "targets")]
    arrays = mlp_arrays()
    data = tmp_path / "mlp.safetensors"
    write_tensors(data, arrays)

    def batch_of(step):
        rows = step_rows(step, MLP_SAMPLES)
        return {n: a[rows] for n, a in arrays.items()}

    # Micro-batches do count different numbers of labels (else equal
    # weights would pass too).
    m = GLOBAL // (world * grad_accum)
    counts = {int((batch_of(s)["label"][i:i + m] != -100).sum())
              for s in range(STEPS) for i in range(0, GLOBAL, m)}
    assert len(counts) > 1 or world * grad_accum == 1, counts
    train_and_compare(tmp_path, mod, archive, manifest, data, world,
                      grad_accum, batch_of,
                      f"MLP world {world} grad_accum {grad_accum}")


@needs_worker
def test_missing_array_refused_naming_it(tmp_path, mlp):
    """A file without the model's `label` is refused before training, with
    the input and the names the file holds."""
    _, archive, _ = mlp
    data = tmp_path / "bad.safetensors"
    write_tensors(data, {"features": torch.zeros(4, 16),
                         "labels": torch.zeros(4, dtype=torch.long)})
    spec = tmp_path / "spec.yaml"
    spec.write_text(numerics.tensors_spec_yaml(archive, data, 1, tmp_path / "ckpt"))
    (rc, out, err), = numerics.run_standalone(spec, 1, timeout_s=20)
    assert rc != 0
    assert (f"data.path: '{data}' has no array 'label', which the model "
            "takes as int64 [*]; it holds 'features', 'labels'") in err, err


# ------------------------------------------------------------------- GPT

@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    mod = numerics.load_model("gpt")
    module, batch = mod.build()
    path = str(tmp_path_factory.mktemp("gpt") / "gpt.tandem")
    manifest = tandem.export(module, batch, path=path)
    return mod, path, manifest


def gpt_arrays():
    g = torch.Generator().manual_seed(9)
    seqs = torch.randint(0, 512, (GPT_SAMPLES, SEQ + 1), generator=g)
    lengths = torch.randint(1, SEQ + 1, (GPT_SAMPLES,), generator=g)
    lengths[::5] = SEQ
    labels = seqs[:, 1:].clone()
    # A few targets ignored inside the lengths too (never position 0, so
    # every sample counts at least one).
    labels[2::7, 1::3] = -100
    return {"input_ids": seqs[:, :-1].contiguous(), "labels": labels,
            "lengths": lengths}


@needs_worker
@pytest.mark.parametrize("world,grad_accum", [(1, 1), (2, 1), (3, 2)])
def test_gpt_variable_lengths_global_token_mean(tmp_path, gpt, world,
                                                grad_accum):
    mod, archive, manifest = gpt
    assert all(1 in i.dynamic_dims for i in manifest.inputs)
    arrays = gpt_arrays()
    data = tmp_path / "gpt.safetensors"
    write_tensors(data, arrays)

    def batch_of(step):
        """The whole global batch, labels past each length ignored: the
        model's causal attention makes the positions past a length
        irrelevant to those before it."""
        rows = step_rows(step, GPT_SAMPLES)
        labels = arrays["labels"][rows].clone()
        past = (torch.arange(SEQ)[None, :] >=
                arrays["lengths"][rows][:, None])
        labels[past] = -100
        return {"input_ids": arrays["input_ids"][rows], "labels": labels}

    # The ranks' micro-batches are cut to different lengths within a step.
    m = GLOBAL // (world * grad_accum)
    if world > 1:
        cuts = [[int(arrays["lengths"][step_rows(s, GPT_SAMPLES)]
                     [r * m:(r + 1) * m].max()) for r in range(world)]
                for s in range(STEPS)]
        assert any(len(set(c)) > 1 for c in cuts), cuts
    train_and_compare(tmp_path, mod, archive, manifest, data, world,
                      grad_accum, batch_of,
                      f"GPT lengths world {world} grad_accum {grad_accum}")
