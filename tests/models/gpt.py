"""A small GPT in plain torch.nn, for `tandem export` (client/README.md,
"Exporting your own model"). Nothing here knows about Tandem.

Token and learned position embeddings, pre-norm blocks in an nn.ModuleList
(causal self-attention written by hand with a registered causal-mask buffer,
GELU MLP, residuals), a final LayerNorm and an lm_head tied to the token
embedding. forward(input_ids, labels) returns the mean cross-entropy over
the batch's tokens.

    tandem export tests/models/gpt.py:build -o gpt.tandem
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_head, block_size, dropout=0.0):
        super().__init__()
        assert d_model % n_head == 0
        self.n_head = n_head
        # No bias: a key bias gets an exact-zero gradient (softmax ignores a
        # constant shift of the scores), which AdamW turns into noise-driven
        # steps that no two summation orders agree on.
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model)
        mask = torch.tril(torch.ones(block_size, block_size))
        self.register_buffer("mask", mask.view(1, 1, block_size, block_size))
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.qkv(x).split(c, dim=2)
        hd = c // self.n_head
        q = q.view(b, t, self.n_head, hd).transpose(1, 2)
        k = k.view(b, t, self.n_head, hd).transpose(1, 2)
        v = v.view(b, t, self.n_head, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, d_model, dropout=0.0):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.out = nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x):
        return self.drop(self.out(self.act(self.fc(x))))


class Block(nn.Module):
    def __init__(self, d_model, n_head, block_size, dropout=0.0):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, block_size, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=512, d_model=64, n_head=4, n_layer=3,
                 block_size=64, dropout=0.0, loss_in_f32=False):
        super().__init__()
        self.loss_in_f32 = loss_in_f32
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(block_size, d_model)
        self.blocks = nn.ModuleList(
            [Block(d_model, n_head, block_size, dropout)
             for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, input_ids, labels):
        t = input_ids.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=input_ids.device)
        x = self.tok_emb(input_ids) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if self.loss_in_f32:
            # A bf16 run's loss as precise as an f32 run's (what Hugging Face
            # models do): the cross-entropy of the logits cast to f32.
            logits = logits.float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)),
                               labels.view(-1))


def example_batch(vocab=512, batch=4, seq=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    seqs = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return {"input_ids": seqs[:, :-1].contiguous(),
            "labels": seqs[:, 1:].contiguous()}


def build(freeze_embeddings=False, n_layer=3):
    """(module, example_batch) from a fixed seed. freeze_embeddings=True
    freezes the token embedding (and with it the tied lm_head) and the
    position embedding: a frozen-params variant."""
    torch.manual_seed(0)
    model = GPT(n_layer=n_layer)
    if freeze_embeddings:
        model.tok_emb.weight.requires_grad_(False)
        model.pos_emb.weight.requires_grad_(False)
    return model, example_batch()


def build_frozen():
    return build(freeze_embeddings=True)


def build_f32_loss():
    """The cross-entropy taken on the logits cast to f32: in bf16 (model.dtype
    bf16 runs the module as `module.to(torch.bfloat16)`), the rest of the
    model computes in bf16 and the loss in f32."""
    torch.manual_seed(0)
    return GPT(loss_in_f32=True), example_batch()


def build_dropout():
    """With dropout 0.1 in every block (attention weights, MLP output): a
    model whose forward draws random numbers."""
    torch.manual_seed(0)
    return GPT(dropout=0.1), example_batch()


def build_demo():
    """The demo's size (scripts/demo.sh --model tests/models/gpt.py:build_demo):
    4 blocks of width 256 over a 4096-token vocabulary, 128-token sequences,
    about the builtin demo's size, so that communication is worth planning."""
    torch.manual_seed(0)
    model = GPT(vocab=4096, d_model=256, n_head=8, n_layer=4, block_size=128)
    return model, example_batch(vocab=4096, batch=4, seq=128)
