"""Translation models: every one implements the :class:`Seq2Seq` interface used by training and search."""

from __future__ import annotations

from nmt.config import ModelConfig, RNNSearchConfig, TransformerConfig
from nmt.errors import NMTError
from nmt.models.base import Seq2Seq, count_parameters, reorder_state
from nmt.models.transformer import Transformer, kv_cache_bytes

__all__ = ["Seq2Seq", "Transformer", "build_model", "count_parameters", "kv_cache_bytes", "reorder_state"]


def build_model(cfg: ModelConfig, src_vocab: int, tgt_vocab: int, joint_vocab: bool) -> Seq2Seq:
    """The model named by ``model.arch``."""
    if isinstance(cfg, TransformerConfig) or cfg.arch == "transformer":
        return Transformer(cfg, src_vocab, tgt_vocab, joint_vocab)
    if isinstance(cfg, RNNSearchConfig) or cfg.arch == "rnnsearch":
        from nmt.models.rnnsearch import RNNSearch

        return RNNSearch(cfg, src_vocab, tgt_vocab, joint_vocab)
    raise NMTError(f"unknown model.arch {cfg.arch!r}; choose 'transformer' or 'rnnsearch'")
