#!/usr/bin/python3
"""PyTorch eager, the reference of bench/overhead: one training step as a
user writes it (zero_grad(set_to_none=True), forward, backward,
clip_grad_norm_, torch.optim.AdamW), timed phase by phase, on one thread.

  eager.py --builtin tiny-llama|wide-short [--steps N] [--warmup W]
  eager.py --module FILE.py:BUILD [--batch-of FILE.py:BATCH] ...

The built-in models are bench/e2e/ddp_reference.py's Llama (its own model
code, the worker's param names and shapes); a module is the user's own,
unchanged, fed the batches FILE.py:BATCH(step) returns (default: its
example batch, every step). One JSON line per measured step
({"step", "step_s", "forward_s", "backward_s", "clip_s", "optimizer_s",
"loss"}), then a summary line of medians.
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BUILTIN = {
    # bench/e2e/driver.py's MODELS, per-rank batch.
    "tiny-llama": dict(layers=4, d_model=256, heads=8, kv_heads=8, ffn=704,
                       vocab=4096, seq_len=128, micro_batch=4),
    "wide-short": dict(layers=2, d_model=320, heads=5, kv_heads=5, ffn=896,
                       vocab=4096, seq_len=64, micro_batch=2),
    # A size where a GPU step is compute (bench/overhead/overhead.py --device cuda).
    "gpu-llama": dict(layers=8, d_model=1024, heads=16, kv_heads=16, ffn=2816,
                      vocab=32000, seq_len=1024, micro_batch=8),
}


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--builtin", choices=sorted(BUILTIN))
    ap.add_argument("--module", help="FILE.py:BUILD returning (module, example batch)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    a = ap.parse_args()
    if bool(a.builtin) == bool(a.module):
        sys.exit("eager.py: give --builtin NAME or --module FILE.py:BUILD")

    device = torch.device(a.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(1)
    gen = torch.Generator().manual_seed(1000)
    if a.builtin:
        ddp = load(os.path.join(HERE, "..", "e2e", "ddp_reference.py"), "ddp_reference")
        m = BUILTIN[a.builtin]
        model = ddp.Llama(argparse.Namespace(**m))

        def batch(step):
            rows = torch.randint(0, m["vocab"], (m["micro_batch"], m["seq_len"] + 1),
                                 generator=gen)
            return dict(tokens=rows[:, :-1], targets=rows[:, 1:])
    else:
        path, _, fn = a.module.rpartition(":")
        built = getattr(load(path, "user_model"), fn)()
        model, example = built if isinstance(built, tuple) else (built, None)
        if example is None:
            sys.exit(f"{a.module} returned no example batch: return (module, batch)")

        def batch(step):
            # Fresh values of the example's shapes and ranges each step.
            out = {}
            for k, v in example.items():
                if v.is_floating_point():
                    out[k] = torch.randn(v.shape, generator=gen, dtype=v.dtype)
                else:
                    hi = int(v.max().item()) + 1
                    out[k] = torch.randint(0, max(hi, 2), v.shape, generator=gen)
            return out

    model = model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]

    def now():
        # A GPU runs kernels asynchronously: a phase ends when they did.
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    rows = []
    for step in range(a.warmup + a.steps):
        b = {k: v.to(device) for k, v in batch(step).items()}
        t0 = now()
        opt.zero_grad(set_to_none=True)
        loss = model(**b)
        t1 = now()
        loss.backward()
        t2 = now()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        t3 = now()
        opt.step()
        t4 = now()
        if step < a.warmup:
            continue
        row = dict(step=step - a.warmup, step_s=t4 - t0, forward_s=t1 - t0,
                   backward_s=t2 - t1, clip_s=t3 - t2, optimizer_s=t4 - t3,
                   loss=loss.item())
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {f"median_{k}": statistics.median(r[k] for r in rows)
               for k in ("step_s", "forward_s", "backward_s", "clip_s", "optimizer_s")}
    summary.update(params=sum(p.numel() for p in params), threads=torch.get_num_threads())
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
