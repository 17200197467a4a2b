"""The data ``data.kind: synthetic`` feeds a job, reproduced in Python.

The worker draws every batch from the job's ``data.seed`` alone
(worker/data/token_source.h, worker/data/synthetic_inputs.h); this module
computes the same values bit for bit, so a user, or a test comparing a
Tandem job with PyTorch eager, can rebuild any step's batch:

    import tandem.synthetic as syn
    manifest = tandem.load_archive("vit.tandem").manifest
    batch = syn.global_batch(manifest, seed=3, step=5, global_size=12,
                             seq_len=0)

Samples are numbered from 0; step s's global batch is samples s*G ...
s*G + G - 1 (G = world_size * micro_batch * grad_accum) and rank r's
micro-batch k of it is samples (s*A + k)*W*m + r*m ... + m - 1
(rank_samples). Without a role, input N's element e of sample i is drawn
from

    key = mix(seed ^ mix(fnv1a64(N) ^ mix(i)))
    x   = mix(key + e * 0x9e3779b97f4a7c15)            (mod 2**64)

(mix: SplitMix64's output function): integers and bools as low + x mod
(high - low + 1), floats as mean + (std * 1.7320508075688772) * (2u - 1) in
float64 with u = (x >> 11) / 2**53, rounded to float32 (float16 and bfloat16
round from that float32), with low, high, mean and std from the archive
(``tandem export --input-range``). Inputs of role tokens and targets are a
seeded synthetic token stream's first and last seq_len tokens (sequence i).

Needs numpy (a dependency of python3-torch); tensors come back as torch
tensors.
"""

GOLDEN = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1
SQRT3 = 1.7320508075688772


def mix(x):
    """SplitMix64's output function for state ``x`` (an int or a numpy
    uint64 array): the golden-ratio step, then the mixer."""
    import numpy as np

    if isinstance(x, int):
        x = (x + GOLDEN) & _M64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
        return x ^ (x >> 31)
    with np.errstate(over="ignore"):
        x = x + np.uint64(GOLDEN)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def fnv1a64(name):
    """FNV-1a, 64-bit, of ``name``'s UTF-8 bytes."""
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & _M64
    return h


def token_sequence(seed, vocab, seq_len, index):
    """Sequence ``index`` of the synthetic token stream: seq_len + 1 tokens
    in [0, vocab) (a walk with its own start and stride, 1 token in 8
    noise)."""
    state = mix((seed & _M64) ^ mix(index & _M64))

    def step():
        nonlocal state
        state = mix(state)
        return state

    token = step() % vocab
    stride = 1 + step() % min(vocab, 7)
    out = []
    for _ in range(seq_len + 1):
        r = step()
        out.append((r >> 3) % vocab if r & 7 == 0 else token)
        token = (token + stride) % vocab
    return out


def rank_samples(step, micro_batch, grad_accum, rank, world, per_rank,
                 first_sample=0):
    """The global sample indices rank ``rank`` reads for micro-batch
    ``micro_batch`` of step ``step``."""
    b = step * grad_accum + micro_batch
    start = first_sample + b * world * per_rank + rank * per_rank
    return list(range(start, start + per_rank))


def _sample_shape(inp, seq_len, example_seq):
    shape = list(inp.shape[1:])
    if shape and (inp.role or (example_seq is not None and
                               1 in inp.dynamic_dims and
                               inp.shape[1] == example_seq)):
        shape[0] = seq_len
    return shape


def _draw(inp, seed, samples, shape):
    import numpy as np
    import torch

    per_sample = 1
    for d in shape:
        per_sample *= d
    e = np.arange(per_sample, dtype=np.uint64)
    s = inp.synthetic
    floating = inp.dtype.startswith(("float", "bfloat"))
    rows = []
    name_key = fnv1a64(inp.name)
    for i in samples:
        key = mix((seed & _M64) ^ mix(name_key ^ mix(i & _M64)))
        with np.errstate(over="ignore"):
            x = mix(np.uint64(key) + e * np.uint64(GOLDEN))
        if floating:
            u = (x >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
            v = s.mean + (s.std * SQRT3) * (2.0 * u - 1.0)
            rows.append(v if inp.dtype == "float64" else v.astype(np.float32))
        else:
            span = (s.high - s.low + 1) & _M64
            drawn = x if span == 0 else x % np.uint64(span)
            with np.errstate(over="ignore"):
                drawn = drawn + np.uint64(s.low & _M64)
            rows.append(drawn.view(np.int64))
    array = np.ascontiguousarray(
        np.stack(rows).reshape([len(samples)] + shape))
    # float16 and bfloat16 round from the float32, integers narrow from
    # int64 (every value is within the dtype's range).
    return torch.from_numpy(array).to(getattr(torch, inp.dtype))


def inputs(manifest, seed, samples, seq_len, vocab=0):
    """{input name: tensor} for the global sample indices ``samples``, as
    data.kind synthetic feeds them to a model with ``manifest``'s inputs
    (``seq_len``: the job's batch.seq_len, ``vocab``: its model.vocab, for
    inputs of a role)."""
    import torch

    example_seq = next((i.shape[1] for i in manifest.inputs
                        if i.role == "tokens" and len(i.shape) == 2), None)
    out = {}
    rows = None
    for inp in manifest.inputs:
        shape = _sample_shape(inp, seq_len, example_seq)
        if inp.role:
            if rows is None:
                rows = torch.tensor([token_sequence(seed, vocab, seq_len, i)
                                     for i in samples], dtype=torch.int64)
            out[inp.name] = (rows[:, 1:] if inp.role == "targets"
                             else rows[:, :seq_len]).contiguous()
            continue
        if not inp.HasField("synthetic"):
            raise ValueError("input %r has no synthetic description (the "
                             "archive predates them): export the model "
                             "again" % inp.name)
        out[inp.name] = _draw(inp, seed, samples, shape)
    return out


def global_batch(manifest, seed, step, global_size, seq_len, vocab=0):
    """Step ``step``'s whole global batch (samples step*G ... step*G + G - 1,
    G = ``global_size``), as one {input name: tensor}."""
    first = step * global_size
    return inputs(manifest, seed, range(first, first + global_size), seq_len,
                  vocab)
