"""Translation models: every one implements the :class:`Seq2Seq` interface used by training and search."""

from __future__ import annotations

from collections.abc import Callable

from nmt.config import ModelConfig, keyed_by_choices
from nmt.models.base import Seq2Seq, count_parameters, reorder_state
from nmt.models.transformer import Transformer, kv_cache_bytes

__all__ = ["Seq2Seq", "Transformer", "build_model", "count_parameters", "kv_cache_bytes", "reorder_state"]


def _rnnsearch(cfg: ModelConfig, src_vocab: int, tgt_vocab: int, joint_vocab: bool) -> Seq2Seq:
    from nmt.models.rnnsearch import RNNSearch

    return RNNSearch(cfg, src_vocab, tgt_vocab, joint_vocab)


# The architectures, by the model.arch choices.
ARCHS: dict[str, Callable[[ModelConfig, int, int, bool], Seq2Seq]] = keyed_by_choices(
    ModelConfig, "arch", {"transformer": Transformer, "rnnsearch": _rnnsearch}
)


def build_model(cfg: ModelConfig, src_vocab: int, tgt_vocab: int, joint_vocab: bool) -> Seq2Seq:
    """The model named by ``model.arch``."""
    return ARCHS[cfg.arch](cfg, src_vocab, tgt_vocab, joint_vocab)
