"""A small MLP classifier in plain torch.nn, for `tandem export` with named
non-token inputs (the `tensors` data source). Nothing here knows about
Tandem.

forward(features, label): features is float [n, d_in], label int64 [n]
(class ids; -100 marks a sample to ignore); returns the mean cross-entropy
over the samples whose label is not -100.

    tandem export tests/models/mlp_classifier.py:build -o mlp.tandem
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLPClassifier(nn.Module):
    def __init__(self, d_in=16, hidden=32, classes=5, depth=3):
        super().__init__()
        self.inp = nn.Linear(d_in, hidden)
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden),
                           nn.GELU()) for _ in range(depth)])
        self.head = nn.Linear(hidden, classes)

    def forward(self, features, label):
        x = F.gelu(self.inp(features))
        for block in self.blocks:
            x = x + block(x)
        return F.cross_entropy(self.head(x), label)


def example_batch(d_in=16, classes=5, batch=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {"features": torch.randn(batch, d_in, generator=g),
            "label": torch.randint(0, classes, (batch,), generator=g)}


def build():
    """(module, example_batch) from a fixed seed."""
    torch.manual_seed(0)
    return MLPClassifier(), example_batch()
