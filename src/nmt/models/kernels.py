"""Faster ways to compute what the models' textbook code computes.

:mod:`nmt.models.attention` writes each step of attention as its formula; the kernels here compute
the same numbers with fused kernels or fewer copies, where that was measured to pay (docs/speed.md).
Their results may differ from the formula's in the last bits, where the order of the float operations
differs. A kernel that returns None does not apply there (device, dtype, autograd): the caller then
runs the textbook step. ``Attention.fast = False`` runs the textbook throughout: what
tests/test_attention.py compares the kernels with, outputs and gradients.

:class:`Dropout` is the models' dropout layer, with a faster mask on the CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.models.base import LazyRows
from nmt.models.masks import allowed_mask

# F.scaled_dot_product_attention shares key/value heads among query heads itself from torch 2.5 on.
SDPA_GQA = torch.__version__ >= "2.5"


def fused_projections(
    query: Tensor, key: Tensor, value: Tensor, q_proj: nn.Linear, k_proj: nn.Linear, v_proj: nn.Linear
) -> tuple[Tensor, ...] | None:
    """``q_proj(query), k_proj(key), v_proj(value)`` in training, in one matrix product for those that
    share an input (self-attention: all three; cross-attention: keys and values), as
    nn.MultiheadAttention does. None in inference, since stacking the weights at every decoding step
    would copy them for a product over a few rows, and where no inputs are shared."""
    if not torch.is_grad_enabled():
        return None
    if query is key and key is value:
        return fused_linear(query, (q_proj, k_proj, v_proj))
    if key is value:
        return (q_proj(query), *fused_linear(key, (k_proj, v_proj)))
    return None


def fused_linear(x: Tensor, layers: tuple[nn.Linear, ...]) -> tuple[Tensor, ...]:
    """``layer(x)`` for each layer, in one matrix product of their stacked weights."""
    weight = torch.cat([layer.weight for layer in layers])
    bias = torch.cat([layer.bias for layer in layers])
    return F.linear(x, weight, bias).split([layer.out_features for layer in layers], dim=-1)


def gather_append(past: LazyRows, new: Tensor) -> Tensor:
    """``cat([past.take(), new], dim=2)``: on the CPU in one copy, the selected rows written straight
    into the result (index_select + cat copy the cache twice: 1.2x slower at 4 positions, 1.9x at 32,
    docs/speed.md). Elsewhere, and where autograd records (``out=`` has no gradient), the
    two plain operations."""
    if past.rows is None or new.device.type != "cpu" or torch.is_grad_enabled():
        return torch.cat([past.take(), new], dim=2)
    old = past.tensor.size(2)
    out = new.new_empty(past.rows.size(0), new.size(1), old + new.size(2), new.size(3))
    torch.index_select(past.tensor, 0, past.rows, out=out[:, :, :old])
    out[:, :, old:] = new
    return out


def sdpa(
    q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, causal: bool, dropout: float
) -> Tensor | None:
    """Scaled dot-product attention through ``F.scaled_dot_product_attention``, which picks fused
    flash/memory-efficient kernels on GPU; an unpadded batch gets no mask at all. None on the CPU for
    bf16/fp16, where the fused kernel is slower than in fp32 and slower than the explicit softmax, and
    for attention dropout, which the fused CPU kernel lacks: its math path computes the explicit softmax
    too, with PyTorch's slower dropout mask (docs/speed.md). Shapes as in ``Attention.attend``; ``k`` and
    ``v`` may have fewer heads than ``q``."""
    if q.device.type == "cpu" and (q.dtype != torch.float32 or dropout > 0):
        return None
    plain = key_padding_mask is None and (not causal or q.size(2) == k.size(2))
    # CUDA runs enable_gqa with a mask in the slow math kernel (so Hugging Face transformers avoids it
    # too): there the heads are repeated, for the memory-efficient kernel.
    k, v, gqa = _heads_for_sdpa(q, k, v, kernel_shares=plain or q.device.type != "cuda")
    if plain:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=causal, **gqa)
    mask = allowed_mask(key_padding_mask, causal, q.size(2), k.size(2), q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, **gqa)


def sdpa_shared(
    q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, dropout: float, share: int
) -> Tensor | None:
    """``Attention.attend_shared`` on CPU in fp32: the fused kernel takes the ``share`` rows of a sentence
    (its beams) as more query positions over the sentence's keys and values, padding mask included:
    one block of beams x positions queries per sentence and head rather than one per beam, without
    copying the keys and values (1.6-1.8x faster than one query per beam, docs/speed.md). A sentence's
    beams get the same numbers alone and in any batch (with a different row count the kernel's
    products may round differently from a single hypothesis' in the last bits). None elsewhere (CUDA,
    bf16), where each beam attending with its own copy of the keys and values is the layout measured."""
    if q.device.type != "cpu" or q.dtype != torch.float32:
        return None
    tgt_len = q.size(2)
    # (sentences, heads, share * tgt, dim): beam j's query t is position j * tgt + t.
    folded = q.unflatten(0, (-1, share)).transpose(1, 2).flatten(2, 3)
    mask = allowed_mask(key_padding_mask, False, folded.size(2), k.size(2), q.device)
    k, v, gqa = _heads_for_sdpa(q, k, v, kernel_shares=True)
    out = F.scaled_dot_product_attention(folded, k, v, attn_mask=mask, dropout_p=dropout, **gqa)
    return out.unflatten(2, (share, tgt_len)).transpose(1, 2).flatten(0, 1)


def _heads_for_sdpa(q: Tensor, k: Tensor, v: Tensor, kernel_shares: bool) -> tuple[Tensor, Tensor, dict]:
    """Keys and values with fewer heads than the queries (grouped-query attention): shared among
    their query heads by the kernel (``enable_gqa``) where ``kernel_shares`` and torch can, otherwise
    each repeated for its group of query heads. Returns them and the kernel's extra arguments."""
    if k.size(1) == q.size(1):
        return k, v, {}
    if SDPA_GQA and kernel_shares:
        return k, v, {"enable_gqa": True}
    group = q.size(1) // k.size(1)
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), {}


def dropout(x: Tensor, p: float) -> Tensor:
    """``x`` with each element zeroed with probability p and the others scaled by 1 / (1 - p).

    The mask is drawn as 16-bit random integers, four to each 64-bit draw of the generator, and made
    0/1 by arithmetic rather than by a comparison and a cast of booleans: on the CPU, ``rand_like`` with
    a comparison, or PyTorch's ``dropout`` (``bernoulli_``), takes several times as long, and their masks
    were a tenth of a small model's step (docs/speed.md). p is rounded to a multiple of 1/65536 (at most
    7.6e-6 off); the scale is that of the rounded p, so the expectation is still ``x``. Off the CPU,
    ``F.dropout`` (CUDA's fused kernel)."""
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    drop = round(p * 65536)  # an integer r in [-32768, 32767] is kept when r >= drop - 32768
    if drop >= 65536:
        return x * 0
    draws = torch.empty((x.numel() + 3) // 4, dtype=torch.int64, device=x.device)
    bits = draws.random_(-(2**63), None).view(torch.int16)[: x.numel()].view(x.shape)
    # r - (drop - 32769) is >= 1 for a kept r and <= 0 otherwise: clamped to [0, 1], the keep mask
    # (computed in fp32, where the 16-bit integers are exact).
    keep = bits.to(torch.float32).sub_(drop - 32769).clamp_(0, 1)
    scale = 65536 / (65536 - drop)
    if x.dtype == torch.float32:
        return x * keep.mul_(scale)  # one product forward and backward
    return x * keep.to(x.dtype) * scale  # a bf16 scale would be up to 0.4 % off: rounded per element


class Dropout(nn.Dropout):
    """``nn.Dropout`` that, on the CPU, is :func:`dropout`, several times faster than PyTorch's CPU
    dropout: the residual, embedding and feed-forward dropouts are several percent of a small model's
    step (docs/speed.md). (Not the same random numbers as ``nn.Dropout``: the same distribution, p
    rounded to a multiple of 1/65536.)"""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        return dropout(x, self.p)
