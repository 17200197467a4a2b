#!/usr/bin/python3
"""PyTorch DDP peer of bench/e2e: the worker's built-in Llama in plain PyTorch.

The same architecture, shapes and param names as worker/models/builtin_models.cc
(embedding; per layer RMSNorm + causal q/k/v/o attention with rotary
embeddings, halves convention, and RMSNorm + SwiGLU MLP; final RMSNorm;
untied lm_head; mean cross-entropy), trained with AdamW (the spec's defaults:
betas 0.9/0.95, eps 1e-8, weight decay 0) and global-norm clipping at 1.0, on
per-rank micro-batches of the same shape, so the global batch matches
Tandem's. Run with Debian's python3-torch (1.13) on CPU over Gloo.

  ddp_reference.py --rank R --world W --master HOST:PORT --layers 4 \
      --d-model 256 --heads 8 --kv-heads 8 --ffn 704 --vocab 4096 \
      --seq-len 128 --micro-batch 4 [--steps N] [--warmup N] [--mode train|comm]

--module FILE.py:BUILD trains the user's own module instead (an exported
model's row): BUILD() returns the module or (module, example_batch), as for
`tandem export`; each step feeds the example batch's integer inputs as
random tokens in [0, vocab) of shape [micro_batch, seq_len], by name, and
the module returns the loss.

--mode train (default) prints one JSON line per measured step, then a summary
{"median_step_s", "model_state_bytes", "bucket_bytes", "params"}. At --world 1
it trains without DDP (PyTorch's compute alone). --mode comm replays DDP's
gradient all-reduces (its bucket sizes: the first 1 MiB, then 25 MiB, in
reverse parameter order) with no compute: DDP's communication alone.
GLOO_SOCKET_IFNAME picks the interface. Tokens are random (fixed seed): the
step time does not depend on their values.
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

NORM_EPS = 1e-5
INIT_STD = 0.02
ROPE_BASE = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.weight


def rope(x):
    s, hd = x.size(2), x.size(3)
    half = hd // 2
    # On x's device: eager.py --device cuda runs this model on a GPU.
    f32 = dict(dtype=torch.float32, device=x.device)
    inv_freq = torch.pow(ROPE_BASE, torch.arange(0, half, **f32) * (-2.0 / (2 * half)))
    angles = torch.outer(torch.arange(0, s, **f32), inv_freq)
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


class Attention(nn.Module):
    def __init__(self, d, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.wq = nn.Linear(d, heads * self.hd, bias=False)
        self.wk = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(heads * self.hd, d, bias=False)

    def forward(self, h):
        b, s, _ = h.shape
        q = self.wq(h).view(b, s, self.heads, self.hd).transpose(1, 2)
        k = self.wk(h).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        v = self.wv(h).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        q, k = rope(q), rope(k)
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k = k.repeat_interleave(rep, 1)
            v = v.repeat_interleave(rep, 1)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.hd)
        future = torch.ones(s, s, dtype=torch.bool, device=h.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        out = torch.matmul(torch.softmax(scores, -1), v).transpose(1, 2).reshape(b, s, -1)
        return self.wo(out)


class Mlp(nn.Module):
    def __init__(self, d, ffn):
        super().__init__()
        self.w_gate = nn.Linear(d, ffn, bias=False)
        self.w_up = nn.Linear(d, ffn, bias=False)
        self.w_down = nn.Linear(ffn, d, bias=False)

    def forward(self, h):
        return self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class Block(nn.Module):
    def __init__(self, d, heads, kv_heads, ffn):
        super().__init__()
        # Param names as the worker's: layers.i.attn_norm.weight, ...
        self.attn_norm = RMSNorm(d)
        self.attn = Attention(d, heads, kv_heads)
        self.mlp_norm = RMSNorm(d)
        self.mlp = Mlp(d, ffn)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = nn.Embedding(a.vocab, a.d_model)
        self.layers = nn.ModuleList(
            Block(a.d_model, a.heads, a.kv_heads, a.ffn) for _ in range(a.layers))
        self.norm = RMSNorm(a.d_model)
        self.lm_head = nn.Linear(a.d_model, a.vocab, bias=False)
        out_std = INIT_STD / math.sqrt(2.0 * a.layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                continue
            std = out_std if (name.endswith("wo.weight") or name.endswith("w_down.weight")) else INIT_STD
            nn.init.normal_(p, 0.0, std)
        self.vocab = a.vocab

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))


def ddp_buckets(params, first=1024 * 1024, cap=25 * 1024 * 1024):
    """DDP's default bucket byte sizes: params in reverse order, the first
    bucket capped at 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES), then 25 MiB."""
    sizes, cur, limit = [], 0, first
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if cur > 0 and cur + nbytes > limit:
            sizes.append(cur)
            cur, limit = 0, cap
        cur += nbytes
    if cur:
        sizes.append(cur)
    return sizes


def user_module(target):
    """The module FILE.py:BUILD builds, and the names of its integer inputs."""
    import importlib.util
    path, _, fn = target.rpartition(":")
    spec = importlib.util.spec_from_file_location("user_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    built = getattr(mod, fn)()
    module, example = built if isinstance(built, tuple) else (built, None)
    if example is None:
        sys.exit(f"{target} returned no example batch: return (module, batch)")
    names = [k for k, v in example.items() if not v.is_floating_point()]
    if len(names) != len(example):
        sys.exit(f"{target}: only integer (token) inputs are fed here")
    return module, names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--master", default="127.0.0.1:29500")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=704)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--mode", choices=["train", "comm"], default="train")
    ap.add_argument("--module", default="")
    a = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(1)
    inputs = None
    if a.module:
        model, inputs = user_module(a.module)
    else:
        model = Llama(a)
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    # params + grads + AdamW's two moments, fp32.
    model_state_bytes = 4 * n_params * 4
    bucket_bytes = 4 * n_params  # gradient_as_bucket_view=False copies

    if a.world > 1:
        host, port = a.master.rsplit(":", 1)
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}",
                                rank=a.rank, world_size=a.world)

    times = []
    if a.mode == "comm":
        if a.world < 2:
            sys.exit("--mode comm needs --world >= 2")
        bufs = [torch.ones(n // 4) for n in ddp_buckets(params)]
        for step in range(a.warmup + a.steps):
            t0 = time.perf_counter()
            works = [dist.all_reduce(b, async_op=True) for b in bufs]
            for w in works:
                w.wait()
            dt = time.perf_counter() - t0
            if step >= a.warmup:
                times.append(dt)
                print(json.dumps({"step": step - a.warmup, "comm_s": dt, "rank": a.rank}), flush=True)
        print(json.dumps({"median_comm_s": statistics.median(times),
                          "buckets": len(bufs), "rank": a.rank}), flush=True)
    else:
        net = model
        if a.world > 1:
            net = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
        gen = torch.Generator().manual_seed(1000 + a.rank)
        losses = []
        for step in range(a.warmup + a.steps):
            rows = torch.randint(0, a.vocab, (a.micro_batch, a.seq_len + 1), generator=gen)
            tokens, targets = rows[:, :-1], rows[:, 1:]
            if inputs is not None:
                batch = {name: torch.randint(0, a.vocab, (a.micro_batch, a.seq_len),
                                             generator=gen) for name in inputs}
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = net(**batch) if inputs is not None else net(tokens, targets)
            loss.backward()
            if a.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
            opt.step()
            dt = time.perf_counter() - t0
            if step >= a.warmup:
                times.append(dt)
                losses.append(loss.item())
                print(json.dumps({"step": step - a.warmup, "step_s": dt, "loss": loss.item(),
                                  "rank": a.rank}), flush=True)
        print(json.dumps({
            "median_step_s": statistics.median(times),
            "min_step_s": min(times), "max_step_s": max(times),
            "model_state_bytes": model_state_bytes, "bucket_bytes": bucket_bytes,
            "params": n_params, "threads": torch.get_num_threads(),
            "rank": a.rank}), flush=True)
    if a.world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
