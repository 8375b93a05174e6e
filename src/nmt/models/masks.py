"""Which keys a query may look at: the one mask of the attention formulas and of the kernels that
compute them faster (:mod:`nmt.models.attention`, :mod:`nmt.models.kernels`)."""

from __future__ import annotations

import torch
from torch import Tensor


def allowed_mask(
    key_padding_mask: Tensor | None, causal: bool, tgt_len: int, src_len: int, device: torch.device
) -> Tensor | None:
    """Boolean mask broadcastable to (batch, heads, tgt, src), True where a query may look."""
    mask = None
    if key_padding_mask is not None:
        mask = ~key_padding_mask[:, None, None, :]
    if causal:
        # Queries are the last tgt_len positions of src_len (equal when nothing is cached).
        future = torch.ones(tgt_len, src_len, dtype=torch.bool, device=device).tril(src_len - tgt_len)
        mask = future if mask is None else mask & future
    return mask
