"""The interface every translation model offers to training and to search.

Training calls ``model(src, tgt_in, keep)``. Greedy and beam search use only ``encode``,
``init_state``, ``step`` and ``reorder``, so a Transformer (key/value cache in the state) and
RNNsearch (hidden state in the state) share one search implementation. The decoding state is a dict
of nests of dicts/lists of tensors whose first dimension is the hypothesis: the sentence in greedy
search, sentence * beams + beam in beam search. Beam search reorders hypotheses every step, but the
beams of a sentence share what depends on the source alone (the encoder output, cross-attention
keys/values): a model may keep that once per sentence, under ``state["sentence"]``, with the number
of hypotheses per sentence under ``state["beams"]``; that part is only selected when sentences leave.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from nmt.special import PAD_ID

State = dict[str, Any]


class Seq2Seq(nn.Module):
    """Base class of the encoder-decoder models."""

    vocab_sizes: dict[str, int]  # {"src": ..., "tgt": ...}, checked when loading checkpoints

    def forward(self, src: Tensor, tgt_in: Tensor, keep: Tensor | None = None) -> Tensor:
        """Teacher-forced logits (batch, tgt_len, vocab); only at positions ``keep`` (N, vocab) when given."""
        raise NotImplementedError

    def encode(self, src: Tensor) -> State:
        """Encode (batch, src_len) ids; the result holds whatever ``init_state`` needs."""
        raise NotImplementedError

    def init_state(self, encoded: State, cache: bool = True) -> State:
        """Decoder state before the first target token. ``cache=False`` recomputes the prefix each step."""
        raise NotImplementedError

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        """Feed the last target token (batch,) and return log-probabilities (batch, vocab) in fp32."""
        raise NotImplementedError

    def reorder(self, state: State, indices: Tensor, sentences: Tensor | None = None) -> State:
        """Select/reorder the hypothesis rows of the state (beam search, finished sentences leaving).

        The per-sentence part follows ``sentences`` when given (for each sentence that stays, in
        order, the row to keep), and the state then has ``len(indices) // len(sentences)`` hypotheses
        per sentence: beam search starts as k identical hypotheses per sentence, one row each, and
        its first reorder keeps one row per sentence. Without ``sentences``, the per-sentence part
        follows ``indices`` when there is one hypothesis per sentence (rows are then sentences) and
        stays whole when there are several (beams move within their sentences).
        """
        if sentences is None and state.get("beams", 1) == 1:
            sentences = indices
        out = {key: reorder_state(value, indices) for key, value in state.items() if key != "sentence"}
        if "sentence" in state:
            shared = state["sentence"]
            out["sentence"] = shared if sentences is None else reorder_state(shared, sentences)
        if "beams" in state and sentences is not None:
            out["beams"] = indices.numel() // max(sentences.numel(), 1)
        return out

    def cross_attention(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Cross-attention weights (layers, batch, heads, tgt_len, src_len) under teacher forcing."""
        raise NotImplementedError

    @staticmethod
    def padding_mask(src: Tensor) -> Tensor:
        """True where ``src`` is padding."""
        return src.eq(PAD_ID)


def reorder_state(state: Any, indices: Tensor) -> Any:
    """Index the first dimension of every tensor in a nest of dicts/lists; other values pass through."""
    if isinstance(state, Tensor):
        return state.index_select(0, indices) if state.dim() > 0 else state
    if isinstance(state, dict):
        return {key: reorder_state(value, indices) for key, value in state.items()}
    if isinstance(state, list):
        return [reorder_state(value, indices) for value in state]
    return state


def count_parameters(model: nn.Module) -> int:
    """Distinct trainable parameters (tied embeddings count once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def log_softmax_fp32(logits: Tensor) -> Tensor:
    return torch.log_softmax(logits.float(), dim=-1)
