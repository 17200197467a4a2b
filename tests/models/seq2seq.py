"""An encoder-decoder language model on torch's own nn.Transformer, with a
padding mask computed from the tokens, for `tandem export`. Nothing here
knows about Tandem.

nn.Transformer and nn.TransformerEncoder check shapes and the mask's dtype
in their forwards, which torch.fx cannot capture: they run as glue, and
every encoder and decoder layer (and each stack's final norm) stays a unit
of its own.

    tandem export tests/models/seq2seq.py:build -o seq2seq.tandem
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

PAD = 0


class Seq2Seq(nn.Module):
    def __init__(self, vocab=512, d_model=32, n_head=2, layers=2, ffn=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        # Dropout 0: a deterministic forward (see encoder_lm.py).
        self.transformer = nn.Transformer(
            d_model, n_head, layers, layers, ffn, dropout=0.0,
            batch_first=True)
        self.out = nn.Linear(d_model, vocab)

    def forward(self, input_ids, labels):
        t = input_ids.size(1)
        causal = torch.triu(torch.full((t, t), float("-inf")), 1)
        pad = input_ids == PAD
        x = self.embed(input_ids)
        y = self.transformer(x, x, tgt_mask=causal,
                             src_key_padding_mask=pad,
                             memory_key_padding_mask=pad)
        logits = self.out(y)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                               labels.reshape(-1))


def build():
    """(module, example_batch) from a fixed seed; the example pads the end
    of one sequence."""
    torch.manual_seed(0)
    model = Seq2Seq()
    g = torch.Generator().manual_seed(2)
    seqs = torch.randint(1, 512, (4, 33), generator=g)
    seqs[1, 28:] = PAD
    return model, {"input_ids": seqs[:, :-1].contiguous(),
                   "labels": seqs[:, 1:].contiguous()}
