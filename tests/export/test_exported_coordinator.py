"""An exported model through the whole loop (issue 12): `tandem export`, a
job spec submitted with the Python client to a real coordinator, real
tandem-worker processes in agent mode that register, profile, receive the
coordinator's plan (made from measured profiles alone: an archive has no
analytic model) and switch to it between two iterations, for the three
model families (a GPT in plain torch.nn, an nn.TransformerEncoder language
model and torchvision's VisionTransformer fed by a `tensors` file). Losses
and final parameters must still equal PyTorch eager training of the same
module
(test_exported_numerics.py's reference: torch.optim.AdamW and
clip_grad_norm_, the same global batches), so the switch from the baseline
to the planned schedule changes nothing but speed.

    TANDEM_BUILD_DIR=build /usr/bin/python3 -m pytest -q tests/export
"""

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "client" / "python"))
import tandem  # noqa: E402
import test_exported_numerics as numerics  # noqa: E402
from tandem.v1 import job_pb2  # noqa: E402

import tandem_harness as harness  # noqa: E402

WORKER = pathlib.Path(numerics.WORKER)
STEPS = 14
WARMUP = 3
VOCAB = 512


def job_spec(archive, data, world, ckpt_dir, **extra):
    """`data`: the tokens file of a language model, or a dict of the
    `tensors` file's arrays' path ({"tensors": PATH})."""
    spec = {
        "name": harness.unique_name("exported"),
        "model": {"kind": "torchscript", "path": archive},
        "batch": {"micro_batch": numerics.GLOBAL_BATCH // world},
        "train": {"steps": STEPS, "lr": numerics.LR,
                  "beta1": numerics.BETAS[0], "beta2": numerics.BETAS[1],
                  "eps": numerics.EPS, "weight_decay": numerics.WD,
                  "grad_clip": numerics.CLIP, "seed": 1},
        "parallel": {"world_size": world},
        # The first plan is made from the first complete window; a drift
        # threshold out of reach keeps it to the end.
        "optimize": {"warmup_steps": WARMUP, "drift_threshold": 100},
        "checkpoint": {"dir": ckpt_dir, "every": STEPS},
    }
    if isinstance(data, dict):
        spec["data"] = {"kind": "tensors", "path": data["tensors"]}
    else:
        spec["model"]["vocab"] = VOCAB
        spec["data"] = {"kind": "tokens", "path": data, "token_bytes": 2}
        spec["batch"]["seq_len"] = numerics.SEQ_LEN
    for k, v in extra.items():
        spec.setdefault(k, {}).update(v)
    return spec


@pytest.fixture
def coordinator(tmp_path):
    if not WORKER.is_file() or not harness.coordinator_binary().is_file():
        pytest.skip("tandem-worker or tandem-coordinator is not built")
    c = harness.Coordinator(harness.coordinator_binary(),
                                    tmp_path / "coord", heartbeat_timeout_s=60)
    (tmp_path / "coord").mkdir()
    c.start()
    yield c
    c.stop()


def run_workers(tmp_path, address, job_id, world):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    procs, outs = [], []
    for r in range(world):
        out = tmp_path / f"worker{r}.jsonl"
        log = tmp_path / f"worker{r}.log"
        outs.append((out, log))
        procs.append(subprocess.Popen(
            [str(WORKER), "--coordinator", address, "--job", job_id,
             "--rank", str(r), "--threads", "1"],
            stdout=open(out, "w"), stderr=open(log, "w"), env=env))
    try:
        for r, p in enumerate(procs):
            assert p.wait(timeout=300) == 0, (
                f"rank {r} failed:\n{outs[r][1].read_text()[-3000:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [[json.loads(l) for l in out.read_text().splitlines()
             if l.startswith('{"step"')] for out, _ in outs]


def training_data(name, tmp_path):
    """(the spec's data, what the reference trains on, how it batches)."""
    if name == "vit":
        path = tmp_path / "vit.safetensors"
        arrays = numerics.write_vit_tensors(path)
        return {"tensors": str(path)}, arrays, numerics.tensors_global_batch
    path = tmp_path / "tokens.bin"
    tokens = numerics.write_tokens(
        path, VOCAB, STEPS * numerics.GLOBAL_BATCH * numerics.SEQ_LEN + 1)
    return str(path), tokens, numerics.global_batch


@pytest.mark.parametrize("name,world", [
    ("gpt", 1), ("gpt", 2), ("gpt", 3),
    ("encoder_lm", 1), ("encoder_lm", 2), ("encoder_lm", 3),
    ("vit", 1), ("vit", 2), ("vit", 3)])
def test_exported_model_planned_and_switched_matches_pytorch(
        tmp_path, coordinator, name, world):
    mod = numerics.load_model(name)
    module, batch = mod.build()
    archive = str(tmp_path / f"{name}.tandem")
    manifest = tandem.export(module, batch, path=archive)
    data, ref_data, batch_of = training_data(name, tmp_path)
    ckpt = tmp_path / "ckpt"

    with tandem.Client(coordinator.address, timeout=10) as client:
        job = client.submit(job_spec(archive, data, world, str(ckpt)))
        runs = run_workers(tmp_path, coordinator.address, job.id, world)
        final, events = client.get(job.id)
        assert final.state == job_pb2.JOB_STATE_SUCCEEDED, \
            [e.message for e in events]
        messages = [e.message for e in events]
        text, schedule = client.schedule(job.id)

    # The coordinator planned the archive's graph from its profiles and every
    # rank switched to the plan at one agreed iteration.
    assert any("v1 (initial)" in m for m in messages), messages
    assert any(f"v1 active on all {world} ranks" in m for m in messages), messages
    assert schedule.version >= 1
    versions = [[d["schedule_version"] for d in run] for run in runs]
    assert all(v == versions[0] for v in versions), versions
    v = versions[0]
    assert [d["step"] for d in runs[0]] == list(range(STEPS))
    assert v[0] == 0 and v[-1] >= 1, v
    switch = v.index(v[-1])
    assert WARMUP <= switch < STEPS - 2, v

    # The same training as PyTorch eager, across the switch.
    module, _ = mod.build()
    ref_losses, ref_params = numerics.reference(module, ref_data, steps=STEPS,
                                                batch_of=batch_of)
    for step, (d, want) in enumerate(zip(runs[0], ref_losses)):
        assert abs(d["loss"] - want) <= numerics.RTOL * abs(want), (
            f"{name} world {world} step {step} (v{d['schedule_version']}): "
            f"loss {d['loss']} vs PyTorch {want}")
    got = numerics.final_params(str(ckpt), world, manifest)
    # nn.MultiheadAttention's key biases have an exact-zero gradient, which
    # no two summation orders step alike (numerics.check_matches): left out
    # of the comparison here, checked for staying small there.
    init, _ = mod.build()
    got, _ = numerics.split_noise(got, numerics.key_biases(init))
    ref_params, _ = numerics.split_noise(ref_params, numerics.key_biases(init))
    names = sorted(got)
    total = numerics.rel_err(torch.cat([got[n].flatten() for n in names]),
                             torch.cat([ref_params[n].flatten() for n in names]))
    assert total <= numerics.RTOL, (
        f"{name} world {world}: params' relative error {total:.2e}")


VAR_STEPS = 30
VAR_SAMPLES = 30
VAR_SEQ = 128


def variable_length_arrays(size):
    """GPT sequences of lengths 1..VAR_SEQ: each step's `size` samples are
    capped by one of 16, 128, 32, 64 or 128 tokens (so whole steps differ
    several times over in work), and every micro-batch is cut to its longest
    sample (so ranks differ within a step)."""
    g = torch.Generator().manual_seed(11)
    seqs = torch.randint(0, VOCAB, (VAR_SAMPLES, VAR_SEQ + 1), generator=g)
    caps = torch.tensor([16, 128, 32, 64, 128])[
        torch.arange(VAR_SAMPLES) // size % 5]
    lengths = 1 + (torch.rand(VAR_SAMPLES, generator=g) * caps).long()
    return {"input_ids": seqs[:, :-1].contiguous(),
            "labels": seqs[:, 1:].contiguous(), "lengths": lengths}


def build_variable_gpt():
    """The test GPT, wide and long enough (width 128, 128 positions) that a
    step's compute, which follows its lengths, outweighs the machine's
    noise."""
    gpt = numerics.load_model("gpt")
    torch.manual_seed(0)
    module = gpt.GPT(vocab=VOCAB, d_model=128, n_head=4, n_layer=3,
                     block_size=VAR_SEQ)
    return module, gpt.example_batch(vocab=VOCAB, batch=4, seq=VAR_SEQ)


def test_variable_lengths_no_replan(tmp_path, coordinator):
    """Variable-length batches through the coordinator: ranks run different
    lengths within a step and steps differ several times over in work, yet
    the job is planned once, never re-planned or rolled back (the
    coordinator judges step times scaled to one work, coordinator/README.md
    "Variable work"), and trains like PyTorch eager on the global token mean
    for VAR_STEPS steps.

    The drift threshold is 0.3, not the default 0.1: unscaled, the steps'
    several-fold differences in work would score far above it, while this
    shared 2-core machine alone moved a 5-step median by 21% (score 0.21
    against the default's noise bound of 0.17) in a CI-like run. Telling
    such noise from a real change at the defaults is issue 15's drift
    statistic, not this test's subject."""
    world = 2
    module, batch = build_variable_gpt()
    archive = str(tmp_path / "gpt.tandem")
    manifest = tandem.export(module, batch, path=archive)
    size = numerics.GLOBAL_BATCH
    arrays = variable_length_arrays(size)
    data = tmp_path / "gpt.safetensors"
    with open(data, "wb") as f:
        tandem.export.write_safetensors(list(arrays.items()), f)

    def batch_of(_, step):
        rows = torch.tensor([i % VAR_SAMPLES
                             for i in range(step * size, (step + 1) * size)])
        labels = arrays["labels"][rows].clone()
        past = (torch.arange(VAR_SEQ)[None, :] >=
                arrays["lengths"][rows][:, None])
        labels[past] = -100
        return {"input_ids": arrays["input_ids"][rows], "labels": labels}

    # The ranks' cuts differ within a step, and steps differ.
    m = size // world
    cuts = [[int(arrays["lengths"][[(s * size + r * m + i) % VAR_SAMPLES
                                    for i in range(m)]].max())
             for r in range(world)] for s in range(VAR_STEPS)]
    assert sum(len(set(c)) > 1 for c in cuts) >= VAR_STEPS // 4, cuts
    assert len({max(c) for c in cuts}) >= 4, cuts

    ckpt = tmp_path / "ckpt"
    spec = job_spec(archive, {"tensors": str(data)}, world, str(ckpt),
                    train={"steps": VAR_STEPS},
                    checkpoint={"every": VAR_STEPS})
    spec["optimize"] = {"warmup_steps": WARMUP, "drift_threshold": 0.3}
    with tandem.Client(coordinator.address, timeout=10) as client:
        job = client.submit(spec)
        runs = run_workers(tmp_path, coordinator.address, job.id, world)
        final, events = client.get(job.id)
    messages = [f"{e.kind}: {e.message}" for e in events]
    assert final.state == job_pb2.JOB_STATE_SUCCEEDED, messages
    assert any("v1 (initial)" in m for m in messages), messages
    unplanned = [m for m in messages
                 if m.split(":")[0] in ("drift", "replan", "rollback",
                                        "memory-guard")]
    assert not unplanned, messages
    # Planned once: every later version reruns a plan already made. The
    # trial of v1's runner-up (optimize.trial_margin is on by default), then
    # the comparison's verdict (the trial kept, or v1's plan again), then the
    # baseline check of the plan that settled; each is judged on the same
    # scaled step times, and none is a new plan from a profile.
    published = [m for m in messages if re.match(r"schedule: v\d+ \(", m)]
    later = [m for m in published if not m.startswith("schedule: v1 (")]
    reruns = ("(trial)", "(rollback)", "(kept)", "(baseline-check)")
    assert all(any(r in m for r in reruns) for m in later), messages
    assert len(later) <= 3, messages
    versions = [d["schedule_version"] for d in runs[0]]
    # The ranks ran only published versions (a comparison alternates two of
    # them in blocks, so the sequence need not rise); a version published
    # near the end may never reach them.
    numbers = {int(re.match(r"schedule: v(\d+)", m).group(1))
               for m in published}
    assert versions[0] == 0 and 1 in versions, versions
    assert set(versions) <= numbers | {0}, (versions, messages)

    module, _ = build_variable_gpt()
    ref_losses, ref_params = numerics.reference(module, None, steps=VAR_STEPS,
                                                batch_of=batch_of)
    init, _ = build_variable_gpt()
    numerics.check_matches(
        "GPT variable lengths under the coordinator",
        [d["loss"] for d in runs[0]], ref_losses,
        numerics.final_params(str(ckpt), world, manifest), ref_params,
        dict(init.named_parameters()), manifest, steps=VAR_STEPS)


def test_archive_budget_below_its_params_refused_at_submit(tmp_path, coordinator):
    gpt = numerics.load_model("gpt")
    module, batch = gpt.build()
    archive = str(tmp_path / "gpt.tandem")
    tandem.export(module, batch, path=archive)
    tokens_path = tmp_path / "tokens.bin"
    numerics.write_tokens(tokens_path, VOCAB, 4096)
    spec = job_spec(archive, str(tokens_path), 2, str(tmp_path / "ckpt"),
                    memory={"budget_bytes": 64 << 10})
    with tandem.Client(coordinator.address, timeout=10) as client:
        with pytest.raises(tandem.TandemError) as e:
            client.submit(spec)
        message = str(e.value)
        assert "memory.budget_bytes 65536 B is below" in message, message
        assert "archive's params" in message, message
        assert "memory.budget_bytes: " in message and "MiB" in message, message
        # A broken archive is refused at submit too, naming the field.
        with open(archive, "r+b") as f:
            f.seek(200)
            f.write(b"\xff" * 64)
        spec["memory"] = {}
        with pytest.raises(tandem.TandemError) as e:
            client.submit(spec)
        assert "model.path" in str(e.value), str(e.value)


def test_archive_budget_below_its_activations_refused_at_submit(
        tmp_path, coordinator):
    """The archive records what each unit's forward saves for backward on
    the example batch; the coordinator scales it to the job's micro-batch,
    builds the graph the workers derive and refuses, at submit, a budget
    below the peak of its least-memory schedule by the memory model (which
    the workers' memory guard uses too), naming one that fits and the knob
    that saves the activations."""
    gpt = numerics.load_model("gpt")
    module, batch = gpt.build()
    archive = str(tmp_path / "gpt.tandem")
    manifest = tandem.export(module, batch, path=archive)
    saved = manifest.saved_activation_bytes
    assert saved > 0
    world = 2
    shards = sum(-(-math.prod(p.shape) // world) * 4 for p in manifest.params)
    example_mb, example_seq = manifest.inputs[0].shape[:2]
    micro_batch = numerics.GLOBAL_BATCH // world
    r = numerics.SEQ_LEN / example_seq
    activations = int(saved * micro_batch / example_mb *
                      (r if r >= 1 else r * r))
    tokens_path = tmp_path / "tokens.bin"
    numerics.write_tokens(tokens_path, VOCAB, 4096)
    # Every shard and half the activations: enough for the params, not for
    # a forward.
    budget = shards + activations // 2
    spec = job_spec(archive, str(tokens_path), world, str(tmp_path / "ckpt"),
                    memory={"budget_bytes": budget})
    with tandem.Client(coordinator.address, timeout=10) as client:
        with pytest.raises(tandem.TandemError) as e:
            client.submit(spec)
        message = str(e.value)
        assert "memory.budget_bytes %d B is below" % budget in message, message
        assert "activations its forward saves for backward at " \
            "batch.micro_batch %d" % micro_batch in message, message
        assert "model.activation_checkpointing" in message, message
        named = int(re.search(r"set memory.budget_bytes: (\d+)MiB",
                              message).group(1)) << 20
        smallest = int(re.search(r"is below [^(]*\((\d+) B\)",
                                 message).group(1))
        # The memory model's least-memory peak holds the shards, a unit
        # gathered and the activations at least.
        assert smallest >= shards + activations, (smallest, shards,
                                                  activations)
        assert named >= smallest
        # The budget it names is accepted, and so is exactly the peak.
        spec["memory"] = {"budget_bytes": named}
        client.submit(spec)
        spec["memory"] = {"budget_bytes": smallest}
        client.submit(spec)
        # Activation checkpointing saves no block's internals: the smallest
        # budget is lower, and accepted.
        spec["model"]["activation_checkpointing"] = True
        spec["memory"] = {"budget_bytes": budget}
        with pytest.raises(tandem.TandemError) as e:
            client.submit(spec)
        checkpointed = int(re.search(r"is below [^(]*\((\d+) B\)",
                                     str(e.value)).group(1))
        assert checkpointed < smallest, (checkpointed, smallest)
        assert "model.activation_checkpointing" not in str(e.value)
        spec["memory"] = {"budget_bytes": checkpointed}
        client.submit(spec)


@pytest.mark.parametrize("name,checkpointing", [
    ("gpt", False), ("gpt", True), ("seq2seq", False),
    # Recomputed inside a glue: until the exporter recomputed units as the
    # worker does (tandem/export/memory.py, _Recompute), each layer's
    # backward net read its param gradients above the worker's (34,176 B
    # for an encoder layer, 51,328 B for a decoder layer).
    ("seq2seq", True)])
def test_exported_unit_memory_is_what_the_worker_measures(tmp_path, name,
                                                          checkpointing):
    """The exporter's measurement of each unit's own memory (ArchiveUnit.
    memory, which the coordinator calibrates its check at submit with) is
    what a tandem-worker's profile measures for the unit's forward and
    backward nodes, at the example's micro-batch, with and without
    activation checkpointing: rises within 1%, nets within one [micro-batch,
    seq, 64] f32 tensor (the head's backward keeps one more in the
    exporter's run than in the worker's). seq2seq's units run inside a glue
    (nn.Transformer), which the exporter runs as the worker does."""
    if not WORKER.is_file():
        pytest.skip("tandem-worker is not built")
    module, batch = numerics.load_model(name).build()
    archive = str(tmp_path / (name + ".tandem"))
    manifest = tandem.export(module, batch, path=archive)
    assert bool(manifest.glues) == (name == "seq2seq")
    micro_batch, seq = manifest.inputs[0].shape[:2]
    tokens = tmp_path / "tokens.bin"
    numerics.write_tokens(tokens, VOCAB, 4096)
    spec = tmp_path / "spec.yaml"
    model = "  vocab: %d\n" % VOCAB
    if checkpointing:
        model += "  activation_checkpointing: true\n"
    spec.write_text(numerics.job_yaml(
        archive, 1, tmp_path / "ckpt", model,
        "  kind: tokens\n  path: %s\n  token_bytes: 2\n" % tokens,
        "  seq_len: %d\n" % seq, train={"steps": 4, "lr": numerics.LR},
        micro_batch=micro_batch))
    runs = numerics.run_standalone(
        spec, 1, extra=("--profile-out", str(tmp_path / "profile.{rank}")))
    assert runs[0][0] == 0, runs[0][2][-3000:]
    measured = {}
    for line in (tmp_path / "profile.0").read_text().splitlines():
        if line.startswith("memory "):
            f = dict(kv.split("=") for kv in line.split()[2:])
            measured[int(line.split()[1][1:])] = (int(f["rise"]), int(f["net"]))
    n = len(manifest.units)
    residual = micro_batch * seq * 64 * 4
    for k, u in enumerate(manifest.units):
        recompute = checkpointing and k + 1 < n
        x = [x for x in u.memory
             if x.micro_batch == micro_batch and x.recompute == recompute][0]
        for node, rise, net in ((k, x.forward_rise_bytes, x.forward_net_bytes),
                                (2 * n - 1 - k, x.backward_rise_bytes,
                                 x.backward_net_bytes)):
            got_rise, got_net = measured[node]
            assert abs(rise - got_rise) <= 0.01 * got_rise + 1024, (
                u.name, node, rise, got_rise)
            assert abs(net - got_net) <= residual, (u.name, node, net, got_net)


def named_at_submit(client, spec):
    """The least-memory peak the coordinator names when it refuses `spec`
    (its budget too small)."""
    with pytest.raises(tandem.TandemError) as e:
        client.submit(spec)
    return int(re.search(r"is below [^(]*\((\d+) B\)", str(e.value)).group(1))


@pytest.mark.parametrize("name,world,checkpointing,dtype",
                         [("gpt", 2, False, "f32"), ("gpt", 2, True, "f32"),
                          ("gpt", 3, False, "f32"),
                          ("seq2seq", 2, False, "f32"),
                          ("seq2seq", 2, True, "f32"),
                          ("gpt", 2, False, "bf16"),
                          ("gpt", 2, True, "bf16")])
def test_archive_budget_named_at_submit_trains(tmp_path, coordinator, name,
                                               world, checkpointing, dtype):
    """A budget the submit check accepts never fails at step 1 for memory
    (issue 37): the least-memory peak the coordinator names for an archive
    at submit, from the exporter's measurements, is a budget its workers
    train in, with and without activation checkpointing, and at world 3,
    where on Gloo a reduce-scatter holds scratch beyond its buffers (one
    peer's contribution, in pieces here), counted at submit for a job that
    declares its device; for a model whose layers run inside a glue
    (seq2seq: nn.Transformer); and at model.dtype bf16, where the units'
    f32 measurements are scaled to the job's dtype."""
    module, batch = numerics.load_model(name).build()
    archive = str(tmp_path / (name + ".tandem"))
    tandem.export(module, batch, path=archive)
    data, _, _ = training_data(name, tmp_path)
    spec = job_spec(archive, data, world, str(tmp_path / "ckpt"),
                    memory={"budget_bytes": 64 << 10},
                    model={"activation_checkpointing": checkpointing,
                           **({"dtype": dtype} if dtype != "f32" else {})},
                    comm={"chunk_bytes": 64 << 10})
    with tandem.Client(coordinator.address, timeout=10) as client:
        undeclared = named_at_submit(client, spec)
        spec["hardware"] = {"device": "cpu"}
        smallest = named_at_submit(client, spec)
        # The scratch only adds (where the least-memory peak falls during
        # a reduce-scatter); at world 2 there is none.
        assert smallest >= undeclared, (smallest, undeclared)
        if world == 2:
            assert smallest == undeclared, (smallest, undeclared)
        spec["memory"] = {"budget_bytes": smallest}
        job = client.submit(spec)
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        procs = [subprocess.Popen(
            [str(WORKER), "--coordinator", coordinator.address, "--job",
             job.id, "--rank", str(r), "--threads", "1"],
            stdout=open(tmp_path / f"worker{r}.jsonl", "w"),
            stderr=open(tmp_path / f"worker{r}.log", "w"), env=env)
            for r in range(world)]
        for p in procs:
            p.wait(timeout=300)
        final, events = client.get(job.id)
        steps = [[json.loads(l) for l in
                  (tmp_path / f"worker{r}.jsonl").read_text().splitlines()
                  if l.startswith('{"step"')] for r in range(world)]
        # Step 0 runs the baseline, whose peak the guard sees above the
        # band; every rank runs the least-memory schedule from step 1.
        peaks = [max(d["peak_bytes"] for d in run[1:]) for run in steps]
        print("named at submit %d B; the least-memory steps peaked at %s B" %
              (smallest, peaks))
        assert final.state == job_pb2.JOB_STATE_SUCCEEDED, (
            smallest, peaks, [e.message for e in events])
        assert [len(run) for run in steps] == [STEPS] * world
        # The figure is the peak the workers reach, not one far above it:
        # within 2%, and within 5% for a model whose layers run inside a
        # glue (seq2seq is named 4.1-4.4% above what its workers reach,
        # 68-100 kB, though each unit's figures equal the worker's without
        # checkpointing: how the model composes them around the glue is
        # not yet traced). At bf16 the exporter's f32 measurements of the
        # units are halved (job_plan.cc, DTypeScale), an estimate: not
        # every value a unit keeps is a bf16 one. These cases check that
        # it stays above what the workers reach: the GPT is named 6.2%
        # (6.7% with checkpointing) above its workers' peak (2026-12-02),
        # so within 8%.
        slack = {"seq2seq": 1.05}.get(name, 1.02)
        if dtype == "bf16":
            slack = 1.08
        assert max(peaks) <= smallest <= slack * max(peaks), (smallest, peaks)


def strip_synthetic(archive):
    """The archive as an exporter from before ArchiveSynthetic wrote it: the
    manifest without the inputs' synthetic descriptions (the manifest is
    not among the checksummed entries)."""
    import zipfile
    with zipfile.ZipFile(archive) as z:
        entries = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
        for name, data in entries:
            if name.endswith("manifest.json"):
                manifest = json.loads(data)
                for i in manifest["inputs"]:
                    i.pop("synthetic", None)
                data = json.dumps(manifest).encode()
            z.writestr(name, data)


def test_vit_synthetic_data_through_the_coordinator(tmp_path, coordinator):
    """`data.kind: synthetic` for a model with named inputs, submitted to a
    real coordinator (no model.vocab or batch.seq_len: the ViT takes no
    tokens), planned and switched at world 2, equal to PyTorch eager on the
    batches tandem.synthetic rebuilds; an archive without the synthetic
    descriptions is refused at submit, naming the input."""
    import tandem.synthetic

    world, seed = 2, 5
    mod = numerics.load_model("vit")
    module, batch = mod.build()
    archive = str(tmp_path / "vit.tandem")
    manifest = tandem.export(module, batch, path=archive,
                             input_ranges={"labels": (0, 9)})
    ckpt = tmp_path / "ckpt"
    spec = job_spec(archive, {"tensors": "unused"}, world, str(ckpt))
    spec["data"] = {"kind": "synthetic", "seed": seed}

    with tandem.Client(coordinator.address, timeout=10) as client:
        job = client.submit(spec)
        runs = run_workers(tmp_path, coordinator.address, job.id, world)
        final, events = client.get(job.id)
        messages = [e.message for e in events]
        assert final.state == job_pb2.JOB_STATE_SUCCEEDED, messages
        assert any(f"v1 active on all {world} ranks" in m
                   for m in messages), messages

        old = str(tmp_path / "old.tandem")
        tandem.export(module, batch, path=old)
        strip_synthetic(old)
        stale = dict(spec, name=harness.unique_name("stale"),
                     model={"kind": "torchscript", "path": old})
        with pytest.raises(tandem.TandemError) as e:
            client.submit(stale)
        assert ("model.path: input 'images' has no synthetic description"
                in str(e.value)), str(e.value)

    def batch_of(_, step):
        return tandem.synthetic.global_batch(manifest, seed, step,
                                             numerics.GLOBAL_BATCH, seq_len=0)

    module, _ = mod.build()
    ref_losses, _ = numerics.reference(module, None, steps=STEPS,
                                       batch_of=batch_of)
    assert [d["schedule_version"] for d in runs[0]][-1] >= 1
    for step, (d, want) in enumerate(zip(runs[0], ref_losses)):
        assert abs(d["loss"] - want) <= numerics.RTOL * abs(want), (
            f"step {step} (v{d['schedule_version']}): loss {d['loss']} vs "
            f"PyTorch {want}")
