"""Label-smoothed cross entropy (Szegedy et al., 2016), computed on non-padding positions only."""

from __future__ import annotations

import torch
from torch import Tensor


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Summed smoothed loss and summed NLL over N target tokens; ``logits`` (N, vocab), ``target`` (N,).

    Same as ``F.cross_entropy(label_smoothing=epsilon, reduction="sum")`` (the smoothing mass is spread
    over all classes), but also returns the plain NLL for perplexity without a second softmax.
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    nll = -log_probs.gather(-1, target[:, None]).squeeze(-1)
    smooth = -log_probs.mean(dim=-1)
    return ((1.0 - epsilon) * nll + epsilon * smooth).sum(), nll.sum()
