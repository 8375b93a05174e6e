"""Where the model looks: the cross-attention of a model over a source while it produces a translation.

The weights come from re-running the decoder under teacher forcing on ``[BOS] + translation``
(:meth:`~nmt.models.base.Seq2Seq.cross_attention`), which reproduces the attention of the search
exactly, for any model and any decoding setting.
"""

from __future__ import annotations

import torch
from matplotlib.figure import Figure

from nmt.decoding import pad_batch
from nmt.errors import NMTError
from nmt.models.base import Seq2Seq
from nmt.plotting import attention_figure
from nmt.special import BOS_ID
from nmt.tokenizer import Tokenizer

HEAD_MODES = ("mean", "all")


@torch.no_grad()
def cross_attention_weights(model: Seq2Seq, src_ids: list[int], hyp: list[int]) -> torch.Tensor:
    """The cross-attention (layers, heads, len(hyp) + 1, len(src_ids) + 1) of ``model`` while it produces
    ``hyp`` (and EOS) from ``src_ids`` (and EOS), in fp32 on the CPU."""
    device = next(model.parameters()).device
    tgt_in = torch.tensor([[BOS_ID, *hyp]], device=device)
    return model.cross_attention(pad_batch([src_ids], device), tgt_in)[:, 0].float().cpu()


@torch.no_grad()
def attention_map(
    model: Seq2Seq, tok: Tokenizer, src_ids: list[int], hyp: list[int], layer: int = -1, heads: str = "mean"
) -> Figure:
    """Heatmap of the cross-attention of decoder ``layer`` while producing ``hyp`` from ``src_ids``."""
    weights = cross_attention_weights(model, src_ids, hyp)  # (layers, heads, tgt, src)
    layers = weights.size(0)
    if not -layers <= layer < layers:
        raise NMTError(f"layer={layer} out of range: the model has {layers} decoder layer(s) (-1 = last)")
    weights = weights[layer]
    title = "cross-attention" + (f", decoder layer {layer % layers}" if layers > 1 else "")
    if heads == "mean":
        panels, titles = weights.mean(dim=0, keepdim=True), None
        title += f", mean of {weights.size(0)} heads" if weights.size(0) > 1 else ""
    else:
        panels, titles = weights, [f"head {h}" for h in range(weights.size(0))]
    return attention_figure(
        panels.cpu().numpy(),
        [*tok.src_pieces(src_ids), "</s>"],
        [*tok.tgt_pieces(hyp), "</s>"],
        titles=titles,
        title=title,
    )
