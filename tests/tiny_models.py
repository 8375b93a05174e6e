"""Tiny randomly initialised models for the tests (seeded): a width-16 Transformer of any variant and a
small RNNsearch, each in eval mode."""

from __future__ import annotations

import torch

from nmt.config import RNNSearchConfig, TransformerConfig
from nmt.models import Seq2Seq, Transformer, build_model


def tiny_transformer(vocab: int, seed: int, **settings) -> Transformer:
    """A width-16, one-layer Transformer without dropout; ``settings`` change any TransformerConfig key."""
    torch.manual_seed(seed)
    base = dict(
        d_model=16, ff_dim=32, heads=2, encoder_layers=1, decoder_layers=1, dropout=0.0, max_positions=32
    )
    return Transformer(TransformerConfig(**{**base, **settings}), vocab, vocab, joint_vocab=True).eval()


def tiny_rnnsearch(vocab: int, seed: int) -> Seq2Seq:
    torch.manual_seed(seed)
    cfg = RNNSearchConfig(
        embed_dim=16, hidden_size=24, attention_dim=20, readout_dim=12, dropout=0.0, max_positions=32
    )
    return build_model(cfg, vocab, vocab, joint_vocab=True).eval()
