"""A causal language model built from torch.nn.TransformerEncoder, for
`tandem export` (client/README.md, "Exporting your own model"). Nothing here
knows about Tandem.

nn.TransformerEncoderLayer branches on its inputs' shapes and flags inside
forward, so torch.fx cannot trace into it: each encoder layer becomes a leaf
unit, scripted whole with TorchScript. The causal mask is sliced from a
registered buffer in the model's own forward and read by every layer.

    tandem export tests/models/encoder_lm.py:build -o encoder_lm.tandem
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class EncoderLM(nn.Module):
    def __init__(self, vocab=512, d_model=64, n_head=4, n_layer=2, ffn=128,
                 max_len=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        # Dropout 0: a deterministic forward, so that training can be
        # compared with another implementation's to fp32 rounding.
        layer = nn.TransformerEncoderLayer(d_model, n_head, ffn, dropout=0.0,
                                           activation="gelu",
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layer,
                                             enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, vocab)
        causal = torch.triu(torch.full((max_len, max_len), float("-inf")), 1)
        self.register_buffer("causal_mask", causal)

    def forward(self, input_ids, labels):
        t = input_ids.size(1)
        x = self.embed(input_ids) + self.pos[:t]
        x = self.encoder(x, mask=self.causal_mask[:t, :t])
        logits = self.out(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                               labels.reshape(-1))


def build():
    """(module, example_batch) from a fixed seed."""
    torch.manual_seed(0)
    model = EncoderLM()
    g = torch.Generator().manual_seed(2)
    seqs = torch.randint(0, 512, (4, 33), generator=g)
    return model, {"input_ids": seqs[:, :-1].contiguous(),
                   "labels": seqs[:, 1:].contiguous()}
