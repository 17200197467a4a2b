"""LoRA-style fine-tuning in plain torch.nn, for `tandem export`: a small
language model whose base weights (the embedding and every Linear's weight
and bias) are frozen, with trainable low-rank adapters on every Linear and
trainable LayerNorms. Nothing here knows about Tandem.

Each LoRALinear computes base(x) + (alpha / rank) * B(A(x)), A of shape
[rank, in], B of shape [out, rank]. B starts small and random rather than
at zero (LoRA's usual init), so both adapters get a gradient from the first
step. forward(input_ids, labels) returns the mean cross-entropy over the
batch's tokens.

    tandem export tests/models/lora.py:build -o lora.tandem
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class LoRALinear(nn.Module):
    def __init__(self, d_in, d_out, rank=4, alpha=8.0):
        super().__init__()
        self.base = nn.Linear(d_in, d_out)
        self.base.weight.requires_grad_(False)
        self.base.bias.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.randn(rank, d_in) * 0.05)
        self.lora_b = nn.Parameter(torch.randn(d_out, rank) * 0.05)
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + F.linear(F.linear(x, self.lora_a),
                                       self.lora_b) * self.scale


class Block(nn.Module):
    def __init__(self, d_model, rank):
        super().__init__()
        self.ln = nn.LayerNorm(d_model)
        self.fc = LoRALinear(d_model, 4 * d_model, rank)
        self.act = nn.GELU()
        self.out = LoRALinear(4 * d_model, d_model, rank)

    def forward(self, x):
        return x + self.out(self.act(self.fc(self.ln(x))))


class LoRALM(nn.Module):
    def __init__(self, vocab=512, d_model=64, n_layer=2, rank=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.emb.weight.requires_grad_(False)
        self.blocks = nn.ModuleList(
            [Block(d_model, rank) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = LoRALinear(d_model, vocab, rank)

    def forward(self, input_ids, labels):
        x = self.emb(input_ids)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)),
                               labels.view(-1))


def example_batch(vocab=512, batch=4, seq=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    seqs = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return {"input_ids": seqs[:, :-1].contiguous(),
            "labels": seqs[:, 1:].contiguous()}


def build():
    """(module, example_batch) from a fixed seed."""
    torch.manual_seed(0)
    return LoRALM(), example_batch()
