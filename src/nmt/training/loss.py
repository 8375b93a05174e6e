"""Label-smoothed cross entropy (Szegedy et al., 2016), computed on non-padding positions only, and
:func:`batch_loss`, a batch's loss under the model: what training minimises, validation reports and
the precision probe times, computed the same way for all three.

The loss over a large vocabulary is a good part of a small model's training step, so its gradient is
written out: with q the smoothed target distribution ((1 - eps) on the target, eps / V everywhere),
d loss / d logits = softmax(logits) - q, one pass over the (N, vocab) probabilities saved by the forward
pass instead of the backward passes of log_softmax, gather and mean that autograd would chain. The
forward pass needs only log p(target) and the mean logit besides the softmax, so it takes the log of N
probabilities rather than computing log_softmax's (N, vocab) table as well.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt.data import Batch
from nmt.text.special import PAD_ID


class _SmoothedNLL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
        logits = logits.float()
        probs = torch.softmax(logits, dim=-1)  # saved for the gradient, which then needs no exp
        nll = target_nll(logits, probs, target)
        log_normalizer = logits.gather(-1, target[:, None]).squeeze(-1) + nll  # log sum exp(logits)
        smooth = log_normalizer - logits.mean(dim=-1)  # -mean(log_softmax(logits))
        ctx.save_for_backward(probs, target)
        ctx.epsilon, ctx.dtype = epsilon, logits.dtype
        return ((1.0 - epsilon) * nll + epsilon * smooth).sum(), nll.sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor, None, None]:
        probs, target = ctx.saved_tensors
        eps, vocab = ctx.epsilon, probs.size(-1)
        # loss: softmax - (1 - eps) onehot - eps / V; nll: softmax - onehot (weighted by their grads)
        grad = probs.mul_(grad_loss + grad_nll)  # the saved probabilities are not needed again
        if eps:
            grad.sub_(grad_loss * eps / vocab)
        at_target = (grad_loss * (1.0 - eps) + grad_nll).expand(target.size(0), 1)
        grad.scatter_add_(1, target[:, None], -at_target)
        return grad.to(ctx.dtype), None, None


def target_nll(logits: Tensor, probs: Tensor, target: Tensor) -> Tensor:
    """-log p(target) per row from ``probs`` = softmax(``logits``) (N, vocab), fp32: the log of the target's
    probability, except where that probability is below 1e-30 (fp32's softmax loses digits there, and
    returns 0 below about 1e-45), which take log_softmax of their row."""
    p_target = probs.gather(-1, target[:, None]).squeeze(-1)
    nll = -torch.log(p_target)
    tiny = (p_target < 1e-30).nonzero().squeeze(-1)
    if tiny.numel():
        exact = torch.log_softmax(logits[tiny], dim=-1).gather(-1, target[tiny, None]).squeeze(-1)
        nll[tiny] = -exact
    return nll


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Summed smoothed loss and summed NLL over N target tokens; ``logits`` (N, vocab), ``target`` (N,).

    Same as ``F.cross_entropy(label_smoothing=epsilon, reduction="sum")`` (the smoothing mass is spread
    over all classes), but also returns the plain NLL for perplexity without a second softmax.
    """
    return _SmoothedNLL.apply(logits, target, epsilon)


def batch_loss(
    model: torch.nn.Module, batch: Batch, epsilon: float, rdrop_alpha: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Summed smoothed loss and summed NLL of ``batch``'s target tokens under ``model`` (a
    :class:`~nmt.models.base.Seq2Seq` or its DDP/compiled wrapper), teacher-forced; padding is masked.
    ``rdrop_alpha`` > 0: with R-Drop's consistency term (:func:`rdrop_loss`)."""
    target_mask = batch.tgt_out.ne(PAD_ID)
    target = batch.tgt_out[target_mask]
    if rdrop_alpha > 0:
        return rdrop_loss(model, batch, target_mask, target, epsilon, rdrop_alpha)
    logits = model(batch.src, batch.tgt_in, target_mask)
    return label_smoothed_nll(logits, target, epsilon)


def rdrop_loss(
    model: torch.nn.Module, batch: Batch, target_mask: Tensor, target: Tensor, epsilon: float, alpha: float
) -> tuple[Tensor, Tensor]:
    """R-Drop (Liang et al., 2021): the batch twice in one forward pass, so under two dropout masks; the
    mean of the two smoothed losses plus ``alpha`` times the symmetric KL of their output distributions,
    (KL(p1 || p2) + KL(p2 || p1)) / 2, summed over the target tokens as the loss is; the NLL is the mean."""
    logits = model(_twice(batch.src), _twice(batch.tgt_in), _twice(target_mask))
    loss, nll = label_smoothed_nll(logits, _twice(target), epsilon)
    first, second = torch.log_softmax(logits.float(), dim=-1).chunk(2)  # the masked rows: copy 1, copy 2
    symmetric_kl = ((first.exp() - second.exp()) * (first - second)).sum()
    return loss / 2 + alpha * symmetric_kl / 2, nll / 2


def _twice(t: Tensor) -> Tensor:
    return torch.cat([t, t])
