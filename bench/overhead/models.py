"""Models bench/overhead exports with `tandem export` that nobody here wrote.

vit: torchvision's own VisionTransformer, unchanged, at a size where a step
is compute (32x32 RGB images in 4x4 patches, 4 encoder blocks of width 128,
MLP 512, batch 32); forward(images, labels) returns the mean cross-entropy.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.models import VisionTransformer

CLASSES = 10


class Classifier(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, images, labels):
        return F.cross_entropy(self.net(images), labels)


def vit():
    torch.manual_seed(0)
    model = Classifier(VisionTransformer(image_size=32, patch_size=4, num_layers=4,
                                         num_heads=4, hidden_dim=128, mlp_dim=512,
                                         num_classes=CLASSES))
    nn.init.normal_(model.net.heads.head.weight, std=0.02)
    g = torch.Generator().manual_seed(2)
    batch = {"images": torch.randn(32, 3, 32, 32, generator=g),
             "labels": torch.randint(0, CLASSES, (32,), generator=g)}
    return model, batch
