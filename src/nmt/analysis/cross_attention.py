"""Where the model looks: the cross-attention of a model over a source while it produces a translation.

The weights come from re-running the decoder under teacher forcing on ``[BOS] + translation``
(:meth:`~nmt.models.base.Seq2Seq.cross_attention`), which reproduces the attention of the search
exactly, for any model and any decoding setting. This module gives numbers only: the service returns
them as they are, and what draws a picture passes :meth:`CrossAttention.panels` to
:func:`nmt.plotting.attention_figure`, so translating never loads matplotlib.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from nmt.config import PlotAttentionConfig, check_choice, choices_of
from nmt.decoding import pad_batch
from nmt.errors import NMTError
from nmt.models.base import Seq2Seq
from nmt.text.special import BOS_ID
from nmt.text.tokenizer import Tokenizer

HEAD_MODES = choices_of(PlotAttentionConfig, "heads")


@dataclass
class AttentionPanels:
    """What one picture shows: the heads of one decoder layer, or their mean, with its labels."""

    weights: np.ndarray  # (panels, target_len, source_len)
    source_tokens: list[str]
    target_tokens: list[str]
    titles: list[str] | None  # one per panel; None for a single panel
    title: str


@dataclass
class CrossAttention:
    """The cross-attention of every decoder layer and head while a model produced one translation."""

    weights: torch.Tensor  # (layers, heads, target_len, source_len), fp32 on the CPU; rows sum to 1
    source_tokens: list[str]  # the source subwords and </s>
    target_tokens: list[str]  # the translation's subwords and </s>

    def panels(self, layer: int = -1, heads: str = "mean") -> AttentionPanels:
        """Decoder ``layer`` (negative counts from the last): one panel per head (``heads="all"``) or
        their mean (``"mean"``)."""
        check_choice("heads", heads, HEAD_MODES)
        layers = self.weights.size(0)
        if not -layers <= layer < layers:
            raise NMTError(f"layer={layer} out of range: the model has {layers} decoder layer(s) (-1 = last)")
        weights = self.weights[layer]
        title = "cross-attention" + (f", decoder layer {layer % layers}" if layers > 1 else "")
        if heads == "mean":
            panels, titles = weights.mean(dim=0, keepdim=True), None
            title += f", mean of {weights.size(0)} heads" if weights.size(0) > 1 else ""
        else:
            panels, titles = weights, [f"head {h}" for h in range(weights.size(0))]
        return AttentionPanels(panels.numpy(), self.source_tokens, self.target_tokens, titles, title)


@torch.no_grad()
def cross_attention_weights(model: Seq2Seq, src_ids: list[int], hyp: list[int]) -> torch.Tensor:
    """The cross-attention (layers, heads, len(hyp) + 1, len(src_ids) + 1) of ``model`` while it produces
    ``hyp`` (and EOS) from ``src_ids`` (and EOS), in fp32 on the CPU."""
    device = next(model.parameters()).device
    tgt_in = torch.tensor([[BOS_ID, *hyp]], device=device)
    return model.cross_attention(pad_batch([src_ids], device), tgt_in)[:, 0].float().cpu()


def cross_attention(model: Seq2Seq, tok: Tokenizer, src_ids: list[int], hyp: list[int]) -> CrossAttention:
    """The weights of :func:`cross_attention_weights` with the subwords they are between."""
    return CrossAttention(
        cross_attention_weights(model, src_ids, hyp),
        [*tok.src_pieces(src_ids), "</s>"],
        [*tok.tgt_pieces(hyp), "</s>"],
    )
