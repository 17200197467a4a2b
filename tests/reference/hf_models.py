"""Llama and Mixtral in plain PyTorch, in Hugging Face's conventions: an
independent reference for Tandem's built-in models.

Written from the structure of Hugging Face transformers' modeling_llama.py
and modeling_mixtral.py (transformers itself is not needed, nor imported),
so that `state_dict()` has exactly Hugging Face's names and layouts:

    model.embed_tokens.weight                          [vocab, d]
    model.layers.<i>.input_layernorm.weight            [d]
    model.layers.<i>.self_attn.{q,k,v,o}_proj.weight   [out, in], no biases
    model.layers.<i>.post_attention_layernorm.weight   [d]
    model.layers.<i>.mlp.{gate,up,down}_proj.weight    (llama)
    model.layers.<i>.block_sparse_moe.gate.weight      [experts, d], the
                                                       router (moe)
    model.layers.<i>.block_sparse_moe.experts.<e>.{w1,w2,w3}.weight
                                                       w1 gate [ffn, d], w3 up
                                                       [ffn, d], w2 down
                                                       [d, ffn]
    model.norm.weight                                  [d]
    lm_head.weight                                     [vocab, d] (untied)

The math: pre-norm residual blocks; RMSNorm x * rsqrt(mean(x^2) + 1e-5) *
weight; rotary embeddings (theta 10000) in the rotate-half convention, the
cos and sin of position * inv_freq repeated over both halves of a head;
grouped-query attention by repeat_kv (kv head j serves query heads
j*n_rep .. j*n_rep + n_rep - 1); causal softmax(QK^T / sqrt(head_dim)) V;
SwiGLU down(silu(gate(x)) * up(x)). Mixtral routes each token as Hugging
Face does: softmax of the router logits in float32, top_k, the top-k weights
renormalized to sum 1, and the output the weighted sum of its experts.

It shares no code with the worker (worker/models/builtin_models.cc): the
tests train both from the same weights and compare, so each checks the
other, and the Hugging Face names check `tandem export-weights` and
`model.init_from`.

`forward(input_ids, labels)` returns the mean cross-entropy over every
position; labels are already shifted (position t predicts labels[:, t]), as
the token data source feeds them.

Precision: the model computes in its params' dtype, in Hugging Face's
conventions. In float32 every cast below is the identity, so f32 is the
plain math above, op for op. In bfloat16 (`model.to(torch.bfloat16)`): the
embedding lookup, projections, SwiGLU, residual adds and lm_head are bf16;
RMSNorm computes in f32 (x.float() * rsqrt(mean(x^2) + eps)), casts the
result to bf16 and multiplies by the bf16 weight; rotary cos and sin are
computed in f32 and cast to bf16, the rotation is bf16; attention scores
are bf16, their softmax f32, cast back to bf16 for the product with V;
Mixtral's router logits are bf16, their softmax, top-k and renormalization
f32, the routing weights cast to bf16; the logits are cast to f32 for the
cross-entropy, so the loss is f32.

`train` trains a model as a data-parallel job does under a mixed-precision
policy: f32 master weights (the model's own params) and torch.optim.AdamW
on them; each step the compute copy is the masters rounded to the compute
dtype; every rank's loss and gradient are computed separately in the
compute dtype on its slice of the batch; the ranks' gradients are cast to
the reduce dtype, summed in rank order and divided by the world size, then
cast to f32 for clipping and AdamW.

Run this file to self-check it: python3 tests/reference/hf_models.py
"""

import copy
import dataclasses
import json
import math
import struct

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class Config:
    """The built-in model's sizes (job spec `model` keys); experts 0 is
    Llama, experts > 0 Mixtral."""
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    experts: int = 0
    top_k: int = 0
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def head_dim(self):
        return self.d_model // self.heads


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        # In f32 x.float() and .to(x.dtype) are x itself: x * rsqrt(..) *
        # weight. In bf16 the normalization is f32, rounded once to bf16.
        xf = x.float()
        variance = xf.pow(2).mean(-1, keepdim=True)
        return (xf * torch.rsqrt(variance + self.eps)).to(x.dtype) * \
            self.weight


def rotary_cos_sin(seq_len, head_dim, theta, device=None):
    """cos, sin [seq_len, head_dim]: position * inv_freq, repeated over
    both halves (Hugging Face's LlamaRotaryEmbedding)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device,
                                             dtype=torch.float32) / head_dim))
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x, cos, sin):
    """x [b, heads, s, head_dim]; cos and sin (f32) are cast to x's dtype
    first (the identity in f32)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


def repeat_kv(x, n_rep):
    """[b, kv_heads, s, hd] -> [b, kv_heads * n_rep, s, hd], each kv head
    repeated n_rep times in place (kv head j -> heads j*n_rep ..)."""
    b, kv, s, hd = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, hd).reshape(
        b, kv * n_rep, s, hd)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, \
            c.head_dim
        self.theta = c.rope_theta
        self.q_proj = nn.Linear(c.d_model, c.heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.d_model, c.kv_heads * c.head_dim,
                                bias=False)
        self.v_proj = nn.Linear(c.d_model, c.kv_heads * c.head_dim,
                                bias=False)
        self.o_proj = nn.Linear(c.heads * c.head_dim, c.d_model, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads,
                                self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads,
                                self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads,
                                self.head_dim).transpose(1, 2)
        cos, sin = rotary_cos_sin(s, self.head_dim, self.theta, x.device)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        n_rep = self.heads // self.kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        future = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, -1)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.d_model, c.ffn, bias=False)
        self.up_proj = nn.Linear(c.d_model, c.ffn, bias=False)
        self.down_proj = nn.Linear(c.ffn, c.d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Expert(nn.Module):
    """Mixtral's MixtralBlockSparseTop2MLP: w2(silu(w1 x) * w3 x)."""

    def __init__(self, c):
        super().__init__()
        self.w1 = nn.Linear(c.d_model, c.ffn, bias=False)
        self.w2 = nn.Linear(c.ffn, c.d_model, bias=False)
        self.w3 = nn.Linear(c.d_model, c.ffn, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.top_k = c.top_k
        self.gate = nn.Linear(c.d_model, c.experts, bias=False)
        self.experts = nn.ModuleList(Expert(c) for _ in range(c.experts))

    def forward(self, x):
        b, s, d = x.shape
        h = x.reshape(-1, d)
        weights = F.softmax(self.gate(h), dim=1, dtype=torch.float32)
        weights, chosen = torch.topk(weights, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(h.dtype)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)
            if token.numel() == 0:
                continue
            y = expert(h[token]) * weights[token, slot, None]
            out = out.index_add(0, token, y)
        return out.reshape(b, s, d)


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c.d_model, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.d_model, c.rms_norm_eps)
        if c.experts:
            self.block_sparse_moe = SparseMoE(c)
        else:
            self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        ffn = self.block_sparse_moe if hasattr(self, "block_sparse_moe") \
            else self.mlp
        return x + ffn(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """Hugging Face's `model.` prefix (LlamaModel / MixtralModel)."""

    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab, c.d_model)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.d_model, c.rms_norm_eps)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class CausalLM(nn.Module):
    """LlamaForCausalLM (config.experts 0) or MixtralForCausalLM, returning
    the mean cross-entropy of already-shifted labels."""

    def __init__(self, config):
        super().__init__()
        assert config.d_model % config.heads == 0, "heads divide d_model"
        assert config.heads % config.kv_heads == 0, "kv_heads divide heads"
        assert not config.experts or 0 < config.top_k <= config.experts
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab, bias=False)

    def logits(self, input_ids):
        return self.lm_head(self.model(input_ids))

    def forward(self, input_ids, labels):
        logits = self.logits(input_ids)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                               labels.reshape(-1))


def draw_init(model, seed, std=0.02):
    """Fresh initial weights as a state dict: normal(0, std) for every
    matrix and the embedding, ones for the norms (every 1-D param)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in model.state_dict().items():
        out[name] = (torch.ones_like(p) if p.dim() == 1 else
                     torch.randn(p.shape, generator=g) * std)
    return out


# ------------------------------------------------------- mixed precision

def rank_slice(batch, world, grad_accum, rank, micro):
    """Rank `rank`'s part of micro-batch `micro` of a global batch ({name:
    tensor [G, ...]}), as the worker splits it: the batch is grad_accum
    contiguous micro-batches, each cut into `world` contiguous rank slices."""
    size = len(next(iter(batch.values())))
    n = size // (world * grad_accum)
    assert n * world * grad_accum == size, (
        f"{size} rows do not split over {world} ranks x {grad_accum}")
    first = (micro * world + rank) * n
    rows = slice(first, first + n)
    return {name: t[rows] for name, t in batch.items()}


def reduce_grads(grads, reduce_dtype):
    """The ranks' gradients of one param (rank order; None: the rank's
    graph did not reach it, a zero) cast to reduce_dtype, summed in rank
    order in reduce_dtype, divided by the world size in reduce_dtype, and
    cast to f32: the master's gradient. At a world size that is a power of
    two, dividing here equals weighting each rank's loss by 1 / world
    before backward (both scalings are exact)."""
    assert any(g is not None for g in grads)
    like = next(g for g in grads if g is not None)
    acc = None
    for g in grads:
        g = (torch.zeros_like(like) if g is None else g).to(reduce_dtype)
        acc = g if acc is None else acc + g
    return (acc / len(grads)).to(torch.float32)


def train(model, batch_of, steps, adamw, clip, world=1, grad_accum=1,
          dtype=torch.float32, reduce_dtype=None, grads=None):
    """Trains `model` in place for `steps` steps as a data-parallel job of
    `world` ranks under a mixed-precision policy; returns (the global loss
    of every step, {name: final master param}).

    batch_of(step) is the step's global batch ({"input_ids", "labels"}).
    The model's own params are the f32 master weights, stepped by
    torch.optim.AdamW(**adamw) after torch.nn.utils.clip_grad_norm_(clip) on
    f32 gradients. Each step the compute copy is the masters cast to `dtype`
    (for bf16: rounded to nearest even); each rank runs forward and backward
    on the compute copy for its slices of the batch (rank_slice), its loss
    the mean over its tokens (grad_accum > 1: each micro-batch's mean loss
    / grad_accum, gradients accumulated in `dtype` by autograd); the ranks'
    gradients are reduced in `reduce_dtype` (default `dtype`; reduce_grads);
    the step's loss is the mean of the ranks' losses. `grads`, a list,
    receives every step's {name: f32 gradient AdamW steps with} (reduced
    and clipped).

    With dtype f32, world 1 and grad_accum 1 this is plain eager training:
    loss.backward(), clip, AdamW.step() on the model itself, bit for bit."""
    reduce_dtype = reduce_dtype or dtype
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    masters = dict(model.named_parameters())
    assert all(masters[n].dtype == torch.float32 for n in names), \
        "master weights are f32"
    masters = [masters[n] for n in names]
    opt = torch.optim.AdamW(masters, **adamw)
    compute = copy.deepcopy(model).to(dtype)
    params = dict(compute.named_parameters())
    params = [params[n] for n in names]
    losses = []
    for step in range(steps):
        batch = batch_of(step)
        with torch.no_grad():
            for c, m in zip(params, masters):
                c.copy_(m)
        rank_losses, rank_grads = [], []
        for rank in range(world):
            for c in params:
                c.grad = None
            total = None
            for micro in range(grad_accum):
                loss = compute(**rank_slice(batch, world, grad_accum, rank,
                                            micro))
                # The policy's models compute the loss in f32; a module
                # cast whole (`model.to(dtype)`) may compute it in dtype.
                assert loss.dtype in (torch.float32, dtype), loss.dtype
                (loss / grad_accum if grad_accum > 1 else loss).backward()
                value = loss.detach().float()
                total = value if total is None else total + value
            rank_losses.append(total / grad_accum if grad_accum > 1 else total)
            rank_grads.append([c.grad for c in params])
        for i, m in enumerate(masters):
            m.grad = reduce_grads([g[i] for g in rank_grads], reduce_dtype)
        torch.nn.utils.clip_grad_norm_(masters, clip)
        if grads is not None:
            grads.append({n: m.grad.clone() for n, m in zip(names, masters)})
        opt.step()
        loss = rank_losses[0]
        for other in rank_losses[1:]:
            loss = loss + other
        losses.append((loss / world if world > 1 else loss).item())
    return losses, {n: p.detach().clone() for n, p in
                    model.named_parameters()}


# ------------------------------------------------------------ safetensors

_DTYPES = {torch.float32: ("F32", 4), torch.bfloat16: ("BF16", 2),
           torch.float16: ("F16", 2), torch.int64: ("I64", 8)}
_BY_NAME = {name: (dtype, size) for dtype, (name, size) in _DTYPES.items()}


def _raw_bytes(t):
    """t's little-endian bytes (numpy has no bfloat16: its bits as int16)."""
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def write_safetensors(tensors, path, metadata=None):
    """Writes {name: tensor} (f32, bf16, f16 or int64) as a safetensors
    file: an 8-byte little-endian header length, the JSON header (padded
    with spaces to 8 bytes) mapping names to dtype, shape and data_offsets,
    then the raw little-endian data in the header's order."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        dtype, size = _DTYPES[t.dtype]
        data = _raw_bytes(t) if t.numel() else b""
        assert len(data) == t.numel() * size
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


def read_safetensors(path):
    """(tensors {name: tensor} in the header's order, metadata) of a
    safetensors file, checking that the offsets tile the data."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw)
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    metadata = header.pop("__metadata__", {})
    out, end_max = {}, 0
    for name, e in sorted(header.items(),
                          key=lambda kv: kv[1]["data_offsets"]):
        dtype, size = _BY_NAME[e["dtype"]]
        begin, end = e["data_offsets"]
        assert begin == end_max, f"{path}: {name} leaves a gap or overlaps"
        numel = math.prod(e["shape"])
        assert end - begin == numel * size, f"{path}: {name} mis-sized"
        out[name] = torch.frombuffer(bytearray(data[begin:end]) or
                                     bytearray(size), dtype=dtype)[
            :numel].reshape(e["shape"]).clone()
        end_max = end
    assert end_max == len(data), f"{path}: trailing bytes after the tensors"
    return {name: out[name] for name in header}, metadata


# ------------------------------------------------------------- self-check

def check_precision():
    """`train` and the bf16 conventions: f32 at world 1 is plain eager
    training bit for bit; the bf16 forward rounds where the conventions say
    (RMSNorm against its f32 computation rounded once, the f32 loss) and
    stays close to f32; the reduction sums in the reduce dtype."""
    c = Config(2, 32, 4, 2, 48, 64)
    adamw = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    g = torch.Generator().manual_seed(3)
    data = torch.randint(0, c.vocab, (4, 4, 13), generator=g)

    def batch_of(step):
        return {"input_ids": data[step, :, :-1], "labels": data[step, :, 1:]}

    def fresh():
        m = CausalLM(c)
        m.load_state_dict(draw_init(m, 2))
        return m

    m = fresh()
    opt = torch.optim.AdamW(m.parameters(), **adamw)
    want = []
    for step in range(4):
        opt.zero_grad()
        loss = m(**batch_of(step))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(m.parameters()), 1.0)
        opt.step()
        want.append(loss.item())
    losses, params = train(fresh(), batch_of, 4, adamw, 1.0)
    assert losses == want
    assert all(torch.equal(params[n], p) for n, p in m.named_parameters())

    # bf16: RMSNorm normalizes in f32 and rounds once before the weight.
    norm = RMSNorm(32, 1e-5).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 32).to(torch.bfloat16)
    xf = x.float()
    y = (xf / (xf.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt())
    got = norm(x)
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), (y.to(torch.bfloat16) *
                                        norm.weight).float(), rtol=2 ** -7)
    # The model: a bf16 forward, an f32 loss, near the f32 model's.
    m = fresh()
    lo = copy.deepcopy(m).to(torch.bfloat16)
    b = batch_of(0)
    with torch.no_grad():
        l32, l16 = m(**b), lo(**b)
        assert lo.logits(b["input_ids"]).dtype == torch.bfloat16
    assert l16.dtype == torch.float32 and l16.item() != l32.item()
    assert abs(l16.item() - l32.item()) < 2 ** -8 * l32.item()
    # The reduction: cast, summed and divided in the reduce dtype.
    a = torch.tensor([1.0, 3.0]).to(torch.bfloat16)
    b_ = torch.tensor([2 ** -8, 2 ** -7]).to(torch.bfloat16)
    assert reduce_grads([a, b_], torch.bfloat16).tolist() == [0.5, 1.5]
    assert reduce_grads([a, b_], torch.float32).tolist() == [
        (1 + 2 ** -8) / 2, (3 + 2 ** -7) / 2]
    assert reduce_grads([None, b_], torch.float32).tolist() == [
        2 ** -9, 2 ** -8]
    # bf16 training at world 2 stays near f32 and differs from it; the
    # reduce dtype matters at world 2 and not at world 1.
    runs = {(w, r): train(fresh(), batch_of, 4, adamw, 1.0, world=w,
                          dtype=torch.bfloat16, reduce_dtype=r)
            for w in (1, 2) for r in (torch.bfloat16, torch.float32)}
    for (w, r), (losses, params) in runs.items():
        assert all(p.dtype == torch.float32 for p in params.values())
        for a_, b_ in zip(losses, want):
            assert a_ != b_ and abs(a_ - b_) < 2 ** -8 * b_, (w, r, a_, b_)
    def same(a, b):
        return a[0] == b[0] and all(torch.equal(a[1][n], b[1][n])
                                    for n in a[1])

    assert same(runs[1, torch.bfloat16], runs[1, torch.float32])
    assert not same(runs[2, torch.bfloat16], runs[2, torch.float32])


def hf_names(c):
    names = ["model.embed_tokens.weight"]
    for i in range(c.layers):
        p = f"model.layers.{i}."
        names.append(p + "input_layernorm.weight")
        names += [p + f"self_attn.{x}_proj.weight" for x in "qkvo"]
        names.append(p + "post_attention_layernorm.weight")
        if c.experts:
            names.append(p + "block_sparse_moe.gate.weight")
            for e in range(c.experts):
                names += [p + f"block_sparse_moe.experts.{e}.{w}.weight"
                          for w in ("w1", "w2", "w3")]
        else:
            names += [p + f"mlp.{x}_proj.weight"
                      for x in ("gate", "up", "down")]
    return names + ["model.norm.weight", "lm_head.weight"]


def self_check():
    """Checks the reference against definitions written another way: the
    names and shapes; causality; GQA head sharing against an explicit
    per-head loop; rotary as a complex rotation of (x_i, x_{i+half}) pairs;
    the MoE block against a per-token loop; the safetensors round trip."""
    torch.manual_seed(0)
    for c in (Config(2, 32, 4, 2, 48, 64),
              Config(2, 32, 4, 1, 48, 64, experts=4, top_k=2)):
        m = CausalLM(c)
        sd = m.state_dict()
        assert sorted(sd) == sorted(hf_names(c)), sorted(set(sd) ^
                                                         set(hf_names(c)))
        hd = c.head_dim
        assert sd["model.layers.0.self_attn.k_proj.weight"].shape == (
            c.kv_heads * hd, c.d_model)
        assert sd["lm_head.weight"].data_ptr() != \
            sd["model.embed_tokens.weight"].data_ptr()
        if c.experts:
            assert sd["model.layers.1.block_sparse_moe.experts.3.w2.weight"
                      ].shape == (c.d_model, c.ffn)
            assert sd["model.layers.1.block_sparse_moe.gate.weight"].shape \
                == (c.experts, c.d_model)
        m.load_state_dict(draw_init(m, 1))
        with torch.no_grad():
            # Causal: changing later tokens leaves earlier logits alone.
            x = torch.randint(0, c.vocab, (2, 12))
            y = x.clone()
            y[:, 7:] = (y[:, 7:] + 1) % c.vocab
            a, b = m.logits(x), m.logits(y)
            assert torch.equal(a[:, :7], b[:, :7])
            assert not torch.allclose(a[:, 7:], b[:, 7:])

            # Attention against an explicit loop over query heads.
            attn = m.model.layers[0].self_attn
            h = torch.randn(2, 9, c.d_model)
            got = attn(h)
            n_rep = c.heads // c.kv_heads
            q = attn.q_proj(h).view(2, 9, c.heads, hd)
            k = attn.k_proj(h).view(2, 9, c.kv_heads, hd)
            v = attn.v_proj(h).view(2, 9, c.kv_heads, hd)
            half = hd // 2
            freq = c.rope_theta ** (-torch.arange(half, dtype=torch.float64)
                                    * 2 / hd)
            rot = torch.polar(torch.ones(9, half, dtype=torch.float64),
                              torch.arange(9, dtype=torch.float64)[:, None]
                              * freq)

            def rope(t):  # pairs (i, i + half) as complex numbers
                z = torch.complex(t[..., :half].double(),
                                  t[..., half:].double()) * rot[:, None]
                return torch.cat([z.real, z.imag], -1).float()

            q, k = rope(q), rope(k)
            outs = []
            for head in range(c.heads):
                kv = head // n_rep
                s = q[:, :, head] @ k[:, :, kv].transpose(1, 2) / math.sqrt(hd)
                s = s + torch.full((9, 9), float("-inf")).triu(1)
                outs.append(torch.softmax(s, -1) @ v[:, :, kv])
            want = attn.o_proj(torch.cat(outs, -1))
            assert torch.allclose(got, want, atol=1e-5), \
                (got - want).abs().max()

            if c.experts:
                moe = m.model.layers[0].block_sparse_moe
                moe.gate.weight.normal_(0, 0.5)  # decisive routing
                h = torch.randn(3, 5, c.d_model)
                got = moe(h)
                want = torch.zeros_like(h)
                for i in range(3):
                    for t in range(5):
                        p = torch.softmax(moe.gate(h[i, t]), -1)
                        top = torch.argsort(p, descending=True)[:c.top_k]
                        w = p[top] / p[top].sum()
                        for wi, e in zip(w, top.tolist()):
                            want[i, t] += wi * moe.experts[e](h[i, t])
                assert torch.allclose(got, want, atol=1e-6), \
                    (got - want).abs().max()

            # Loss: the mean over every position, labels not shifted again.
            labels = torch.randint(0, c.vocab, (2, 12))
            logp = torch.log_softmax(m.logits(x), -1)
            want = -logp.gather(-1, labels[..., None]).mean()
            assert torch.allclose(m(x, labels), want, atol=1e-6)
    check_precision()
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "w.safetensors")
        sd = dict(m.state_dict(), count=torch.arange(3),
                  half=torch.randn(5).to(torch.bfloat16))
        write_safetensors(sd, path, {"k": 1})
        back, meta = read_safetensors(path)
        assert list(back) == list(sd) and meta == {"k": "1"}
        assert all(torch.equal(back[n], sd[n]) for n in sd)
    print("hf_models self-check passed")


if __name__ == "__main__":
    self_check()
