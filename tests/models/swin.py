"""torchvision's Swin Transformer, small, for `tandem export`. Nothing here
knows about Tandem.

torchvision.models.SwinTransformer, unchanged: 16x16 RGB images, 2x2
patches, two stages of one SwinTransformerBlock each (shifted windows of
2x2) with a patch merging between them, and a 10-class head. Each block is
a unit. Stochastic depth and dropout are 0, so training is deterministic.

Batch inputs: images float32 [n, 3, 16, 16], labels int64 [n]; the
`tensors` data source feeds them.

    tandem export tests/models/swin.py:build -o swin.tandem
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.models.swin_transformer import SwinTransformer

CLASSES = 10


class SwinClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.swin = SwinTransformer(patch_size=[2, 2], embed_dim=16,
                                    depths=[1, 1], num_heads=[2, 2],
                                    window_size=[2, 2],
                                    stochastic_depth_prob=0.0,
                                    num_classes=CLASSES)

    def forward(self, images, labels):
        return F.cross_entropy(self.swin(images), labels)


def data(n, seed=11):
    g = torch.Generator().manual_seed(seed)
    return {"images": torch.randn(n, 3, 16, 16, generator=g),
            "labels": torch.randint(0, CLASSES, (n,), generator=g)}


def build():
    torch.manual_seed(0)
    return SwinClassifier(), data(4, seed=2)
