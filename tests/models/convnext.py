"""torchvision's ConvNeXt, small, for `tandem export`. Nothing here knows
about Tandem.

torchvision.models.ConvNeXt, unchanged: 16x16 RGB images, two stages of
one CNBlock each (a depthwise 7x7 convolution, layer norm, an MLP and a
learned layer scale) with a downsampling layer between them, and a 10-class
head. Each block is a unit. Stochastic depth is 0, so training is
deterministic.

Batch inputs: images float32 [n, 3, 16, 16], labels int64 [n]; the
`tensors` data source feeds them.

    tandem export tests/models/convnext.py:build -o convnext.tandem
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.models.convnext import CNBlockConfig, ConvNeXt

CLASSES = 10


class ConvNeXtClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.convnext = ConvNeXt(
            [CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)],
            stochastic_depth_prob=0.0, num_classes=CLASSES)

    def forward(self, images, labels):
        return F.cross_entropy(self.convnext(images), labels)


def data(n, seed=11):
    g = torch.Generator().manual_seed(seed)
    return {"images": torch.randn(n, 3, 16, 16, generator=g),
            "labels": torch.randint(0, CLASSES, (n,), generator=g)}


def build():
    torch.manual_seed(0)
    return ConvNeXtClassifier(), data(4, seed=2)
