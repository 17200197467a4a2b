"""torchtext's RoBERTa encoder with a classification head, on padded
sequences, for `tandem export`. Nothing here knows about Tandem.

torchtext.models.RobertaModel, unchanged. Its encoder builds the padding
mask from the tokens and torch's own nn.TransformerEncoder checks the
mask's dtype in forward, which torch.fx cannot capture: the encoder runs as
glue, and the token embedding, the position embedding, the embedding layer
norm and each transformer layer stay units of their own. Dropout is 0, so
training is deterministic.

Debian's torchtext ships a C extension that fails to import
(`torchtext._torchtext`); the models are plain Python and do not need it,
so it is stubbed before torchtext is imported.

Batch inputs: input_ids int64 [n, 16] (padding id 1 at the end of some
rows), labels int64 [n] (0 to 2); the `tensors` data source feeds them.

    tandem export tests/models/roberta.py:build -o roberta.tandem
"""

import sys
import types

import torch
import torch.nn as nn
import torch.nn.functional as F


class _MissingExtension(types.ModuleType):
    def __getattr__(self, name):
        return type(name, (), {})


for _name in ("torchtext._extension", "torchtext._torchtext"):
    sys.modules.setdefault(_name, _MissingExtension(_name))

from torchtext.models import (RobertaClassificationHead,  # noqa: E402
                              RobertaEncoderConf, RobertaModel)

VOCAB, PAD, SEQ, CLASSES = 100, 1, 16, 3


class RobertaClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        conf = RobertaEncoderConf(
            vocab_size=VOCAB, embedding_dim=32, ffn_dimension=64,
            padding_idx=PAD, max_seq_len=40, num_attention_heads=2,
            num_encoder_layers=2, dropout=0.0)
        head = RobertaClassificationHead(num_classes=CLASSES, input_dim=32,
                                         dropout=0.0)
        self.roberta = RobertaModel(conf, head)

    def forward(self, input_ids, labels):
        return F.cross_entropy(self.roberta(input_ids), labels)


def data(n, seed=11):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(PAD + 1, VOCAB, (n, SEQ), generator=g)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (n,), generator=g)
    ids[torch.arange(SEQ)[None, :] >= lengths[:, None]] = PAD
    return {"input_ids": ids,
            "labels": torch.randint(0, CLASSES, (n,), generator=g)}


def build():
    """(module, example_batch) from a fixed seed; the example pads some
    rows."""
    torch.manual_seed(0)
    return RobertaClassifier(), data(4, seed=2)
