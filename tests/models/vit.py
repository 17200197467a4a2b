"""A small torchvision.models.VisionTransformer, for `tandem export`
(client/README.md, "Exporting your own model"). Nothing here knows about
Tandem.

The VisionTransformer is torchvision's own, unchanged: 16x16 RGB images cut
into 4x4 patches, a class token and learned position embeddings (params
used directly in forward, outside any submodule's parameters), two
EncoderBlocks (each with an nn.MultiheadAttention, which torch.fx cannot
trace inside, so each block becomes a leaf unit scripted whole) and a
10-class head. The wrapper only names the batch: forward(images, labels)
returns the mean cross-entropy over the batch's samples. Dropout is 0
(torchvision's default), so training is deterministic.

Batch inputs: images float32 [n, 3, 16, 16], labels int64 [n]; they are fed
by the `tensors` data source (worker/README.md).

    tandem export tests/models/vit.py:build -o vit.tandem
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.models import VisionTransformer

IMAGE_SIZE = 16
NUM_CLASSES = 10


class ViTClassifier(nn.Module):
    def __init__(self, image_size=IMAGE_SIZE, patch_size=4, num_layers=2,
                 num_heads=2, hidden_dim=32, mlp_dim=64,
                 num_classes=NUM_CLASSES):
        super().__init__()
        self.vit = VisionTransformer(image_size=image_size,
                                     patch_size=patch_size,
                                     num_layers=num_layers,
                                     num_heads=num_heads,
                                     hidden_dim=hidden_dim, mlp_dim=mlp_dim,
                                     num_classes=num_classes)

    def forward(self, images, labels):
        return F.cross_entropy(self.vit(images), labels)


def example_batch(n=4, seed=2):
    g = torch.Generator().manual_seed(seed)
    return {"images": torch.randn(n, 3, IMAGE_SIZE, IMAGE_SIZE, generator=g),
            "labels": torch.randint(0, NUM_CLASSES, (n,), generator=g)}


def build():
    """(module, example_batch) from a fixed seed."""
    torch.manual_seed(0)
    model = ViTClassifier()
    # torchvision starts the head at zero; a random head makes every param's
    # gradient non-zero from the first step, so the numerics tests see them
    # all move.
    nn.init.normal_(model.vit.heads.head.weight, std=0.02)
    return model, example_batch()
