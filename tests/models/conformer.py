"""torchaudio's Conformer as a small utterance classifier, for `tandem
export`. Nothing here knows about Tandem.

torchaudio.models.Conformer reads the longest length with
`int(torch.max(lengths).item())` to build its padding mask, which torch.fx
cannot capture: the Conformer runs as glue, and each ConformerLayer stays a
unit of its own. The wrapper pools the valid frames and returns the mean
cross-entropy. Dropout is 0, so training is deterministic.

Batch inputs: features float32 [n, 12, 16], frames int64 [n] (6 to 12;
the longest of each micro-batch 12),
labels int64 [n] (0 to 4); the `tensors` data source feeds them.

    tandem export tests/models/conformer.py:build -o conformer.tandem
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchaudio.models import Conformer

FRAMES, DIM, CLASSES = 12, 16, 5


class ConformerClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.conformer = Conformer(input_dim=DIM, num_heads=2, ffn_dim=32,
                                   num_layers=2, depthwise_conv_kernel_size=3,
                                   dropout=0.0)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, features, frames, labels):
        out, out_lengths = self.conformer(features, frames)
        valid = torch.arange(out.size(1))[None, :] < out_lengths[:, None]
        pooled = (out * valid[..., None]).sum(1) / out_lengths[:, None]
        return F.cross_entropy(self.head(pooled), labels)


def data(n, seed=11):
    """n utterances; every third fills the frames (the Conformer wants the
    longest of a batch to), so any 3 in a row make a batch it takes."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(FRAMES // 2, FRAMES + 1, (n,), generator=g)
    lengths[::3] = FRAMES
    return {"features": torch.randn(n, FRAMES, DIM, generator=g),
            "frames": lengths,
            "labels": torch.randint(0, CLASSES, (n,), generator=g)}


def build():
    """(module, example_batch) from a fixed seed."""
    torch.manual_seed(0)
    return ConformerClassifier(), data(4, seed=2)
