"""A task any tiny model learns in seconds: copy the source (random ids, UNK included). For the tests
that need a model with real preferences (some sentences right, some wrong) without a data pipeline."""

from __future__ import annotations

import torch

from nmt.decoding import pad_batch
from nmt.models import Seq2Seq
from nmt.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID


def copy_sentences(count: int, vocab: int, seed: int, min_len: int = 2, max_len: int = 9) -> list[list[int]]:
    """``count`` sentences of ordinary ids and UNK, of ``min_len`` to ``max_len`` tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (count,), generator=g).tolist()
    words = [torch.randint(EOS_ID, vocab, (n,), generator=g) for n in lengths]
    return [w.masked_fill(w.eq(EOS_ID), UNK_ID).tolist() for w in words]


def train_to_copy(model: Seq2Seq, vocab: int, steps: int, lr: float = 3e-3) -> Seq2Seq:
    """``steps`` teacher-forced Adam updates on batches of 32 copy pairs; returns the model in eval mode."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for step in range(steps):
        src = tgt_out = pad_batch(copy_sentences(32, vocab, seed=step), "cpu")
        tgt_in = torch.cat([torch.full((src.size(0), 1), BOS_ID), tgt_out[:, :-1]], dim=1)
        tgt_in[tgt_in == EOS_ID] = PAD_ID
        target_mask = tgt_out.ne(PAD_ID)
        loss = torch.nn.functional.cross_entropy(model(src, tgt_in, target_mask), tgt_out[target_mask])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()
