"""Attention variants behind one interface, written as their formulas.

Every variant is called as::

    out, weights = attn(query, key, value, key_padding_mask=None, causal=False, cache=None,
                        need_weights=False)

with ``query`` (batch, tgt_len, d_model), ``key``/``value`` (batch, src_len, d_model),
``key_padding_mask`` (batch, src_len) True at padding, ``causal`` masking future keys, and ``weights``
(batch, heads, tgt_len, src_len) when asked for. The formulas come first: each kind's scores, the
softmax over the keys a query may see and the weighted sum of the values. The multi-head part
(projections, heads, rotary positions, the key/value cache) is :class:`Attention`; a kind only says
how queries score keys (:meth:`Attention.score`).

Each step is written here as its formula; faster kernels computing the same numbers (fused
projections, cache gathers, shared-source attention, the fused softmax) live in
:mod:`nmt.models.kernels`, and the modules use them where they apply (``Attention.fast``).

The cache is a plain dict owned by the caller, one per layer and role:
- self-attention (``cross=False``): each call appends the new keys/values, so the decoder feeds
  one token at a time and attends over everything before it;
- cross-attention (``cross=True``): keys/values of the encoder output are computed on the first
  call and reused for every later step.
With grouped-query attention (``kv_heads`` < ``heads``) the cache holds only the ``kv_heads`` key/value
heads; they are shared by their query heads at attention time, never stored expanded.

In cross-attention ``query`` may hold several consecutive rows per row of ``key``/``value`` (or of the
cached keys and values): beam search's hypotheses of one sentence, which all share its keys and
values, computed once per sentence (:meth:`Attention.attend_shared`). The row counts say so; the
module knows nothing else about the search.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from nmt.config import TransformerConfig, keyed_by_choices
from nmt.models import kernels
from nmt.models.base import LazyRows
from nmt.models.kernels import fused_projections, gather_append, sdpa, sdpa_shared
from nmt.models.masks import allowed_mask


# ------------------------------------------------------------------------------------- the formulas
def dot_product_scores(q: Tensor, k: Tensor) -> Tensor:
    """Scaled dot-product scores q . k / sqrt(dim) (Vaswani et al., 2017, eq. 1) of ``q`` (batch, heads,
    tgt, dim) and ``k`` (batch, heads, src, dim) -> (batch, heads, tgt, src)."""
    return q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))


def additive_scores(q: Tensor, k: Tensor, v_a: Tensor, chunk: int) -> Tensor:
    """Bahdanau scores v_a[h] . tanh(q[b, h, i] + k[b, h, j]) -> (batch, heads, tgt, src).

    ``q`` (batch, heads, tgt, dim) and ``k`` (batch, heads, src, dim) are already projected (W_q q,
    W_k k); ``v_a`` is (heads, dim). Only ``chunk`` target positions are expanded at a time, so the
    largest intermediate is (batch, heads, chunk, src, dim). When there are several chunks and
    autograd is on, each chunk is checkpointed (its tanh recomputed in the backward pass): otherwise
    autograd would keep every chunk's tanh and training memory would grow with the target length.
    """
    tgt_len = q.size(2)
    chunks = []
    for start in range(0, tgt_len, chunk):
        q_chunk = q[:, :, start : start + chunk]
        if tgt_len > chunk and torch.is_grad_enabled():
            chunks.append(checkpoint(_score_chunk, q_chunk, k, v_a, use_reentrant=False))
        else:
            chunks.append(_score_chunk(q_chunk, k, v_a))
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=2)


def _score_chunk(q: Tensor, k: Tensor, v_a: Tensor) -> Tensor:
    hidden = torch.tanh(q[:, :, :, None, :] + k[:, :, None, :, :])  # (batch, heads, chunk, src, dim)
    return torch.einsum("bhtsd,hd->bhts", hidden, v_a.to(hidden.dtype))


def softmax_combine(scores: Tensor, v: Tensor, mask: Tensor | None, dropout: float) -> tuple[Tensor, Tensor]:
    """The weights softmax(scores) over the keys ``mask`` allows (masked weights exactly 0), then the
    weighted sum of the values, with attention dropout on the weights: (out, weights before dropout)."""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(v.dtype)
    return (kernels.dropout(weights, dropout) if dropout > 0 else weights) @ v, weights


# -------------------------------------------------------------------------------- rotary positions
def rotary_angles(positions: Tensor, dim: int, base: float) -> tuple[Tensor, Tensor]:
    """cos and sin (len, dim/2) of the RoPE angles position * base^(-2i/dim) at ``positions`` (len,),
    in fp32: bf16 angles of late positions would be far off."""
    inv_freq = base ** (-torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim)
    angles = positions.to(torch.float32)[:, None] * inv_freq
    return angles.cos(), angles.sin()


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the feature pairs (i, i + dim/2) of ``x`` (batch, heads, len, dim) by the angles whose
    ``cos`` and ``sin`` (len, dim/2) are given; computed in fp32, returned in the dtype of ``x``."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def rotary(x: Tensor, positions: Tensor, base: float) -> Tensor:
    """RoPE (Su et al., 2021): rotate the feature pairs (i, i + dim/2) of ``x`` (batch, heads, len, dim)
    at ``positions`` (len,) by the angles position * base^(-2i/dim). The dot product of a rotated query
    and a rotated key then depends on their positions only through the difference."""
    return rotate(x, *rotary_angles(positions.to(x.device), x.size(-1), base))


# ---------------------------------------------------------------------------- multi-head attention
class Attention(nn.Module):
    """Multi-head attention (Vaswani et al., 2017, section 3.2.2) around a kind's scores:
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = softmax(score(Q W^Q_i, K W^K_i)) V W^V_i.

    ``kv_heads`` (0 = ``heads``) fewer key/value heads than query heads is grouped-query attention
    (Ainslie et al., 2023; 1 = multi-query, Shazeer 2019): each key/value head serves heads // kv_heads
    consecutive query heads, which shrinks k_proj, v_proj and the decoding cache by that factor. With
    kv_heads == heads the parameters (names, shapes) and outputs are those of plain multi-head attention.

    ``rope_base`` (self-attention only) rotates queries and keys by their positions before scoring
    (:func:`rotary`); positions continue after the keys already in the cache, so an incremental
    decoding step rotates its query and key by their true position, and the cache keeps rotated keys.
    The angles of the first ``rope_positions`` positions are computed once (a decoding step would
    otherwise spend a dozen small operations per layer on them); later ones when needed.
    """

    # The kernels of nmt.models.kernels where they apply; False: every step as its formula (what the
    # kernels are tested against, outputs and gradients).
    fast: bool = True

    def __init__(
        self,
        d_model: int,
        heads: int,
        dropout: float,
        cross: bool,
        score_dim: int | None = None,
        kv_heads: int = 0,
        rope_base: float | None = None,
        rope_positions: int = 0,
    ):
        super().__init__()
        kv_heads = kv_heads or heads  # the shape rules: nmt.config.check_model
        self.heads, self.kv_heads, self.cross, self.dropout = heads, kv_heads, cross, dropout
        self.head_dim = d_model // heads
        self.score_dim = score_dim or self.head_dim  # per-head size of queries and keys
        self.rope_base = rope_base
        self.q_proj = nn.Linear(d_model, heads * self.score_dim)
        self.k_proj = nn.Linear(d_model, kv_heads * self.score_dim)
        self.v_proj = nn.Linear(d_model, kv_heads * self.head_dim)
        self.out_proj = nn.Linear(d_model, d_model)
        if rope_base is not None:  # fp32 tables that move with the module, not saved in checkpoints
            cos, sin = rotary_angles(torch.arange(rope_positions), self.score_dim, rope_base)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    @classmethod
    def options(cls, cfg: TransformerConfig) -> dict[str, Any]:
        """This kind's own constructor arguments, from its keys of the model config."""
        return {}

    def score(self, q: Tensor, k: Tensor) -> Tensor:
        """Scores (batch, heads, tgt, src) of queries ``q`` (batch, heads, tgt, score_dim) for keys ``k``
        (batch, heads, src, score_dim), one key head per query head."""
        raise NotImplementedError

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: dict | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        cached_cross = cache is not None and self.cross and "k" in cache
        q, k, v = self._project(query, key, value, keys_needed=not cached_cross)
        q = self._split(q)
        # Positions of the new queries (and, in self-attention, keys) start after the cached keys.
        offset = cache["k"].size(2) if cache is not None and not self.cross and "k" in cache else 0
        if self.rope_base is not None:
            q = self.rotate(q, offset)
        k, v = self._keys_values(k, v, cache, offset)
        # With a self-attention cache the single new query may see every cached key: no causal mask.
        causal = causal and not (cache is not None and query.size(1) == 1)
        if q.size(0) != k.size(0):  # cross-attention, several query rows per key/value row
            share = q.size(0) // k.size(0)
            out, weights = self.attend_shared(q, k, v, key_padding_mask, need_weights, share)
        else:
            out, weights = self.attend(q, k, v, key_padding_mask, causal, need_weights)
        batch, _, tgt_len, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(batch, tgt_len, -1)), weights

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        causal: bool,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """softmax(score(q, k)) v over the keys each query may see: queries (batch, heads, tgt_len,
        score_dim), keys and values (batch, kv_heads, src_len, score_dim or head_dim) -> (out, weights)."""
        k, v = self.expand_kv(k, v)
        mask = allowed_mask(key_padding_mask, causal, q.size(2), k.size(2), q.device)
        out, weights = softmax_combine(self.score(q, k), v, mask, self.dropout if self.training else 0.0)
        return out, weights if need_weights else None

    def attend_shared(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, need_weights: bool, share: int
    ) -> tuple[Tensor, Tensor | None]:
        """:meth:`attend` for ``share`` consecutive query rows per key/value row (cross-attention).

        Each hypothesis gets its own copy of the keys and values, so that it computes exactly what it
        would compute alone (folding the beams into more query positions changes the order of the
        float operations). A kind with a kernel that shares them overrides this.
        """
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.repeat_interleave(share, dim=0)
        k, v = k.repeat_interleave(share, dim=0), v.repeat_interleave(share, dim=0)
        return self.attend(q, k, v, key_padding_mask, False, need_weights)

    def expand_kv(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keys/values with each of the kv_heads repeated for its group of query heads (the cache keeps
        the unexpanded tensors)."""
        if self.kv_heads == self.heads:
            return k, v
        group = self.heads // self.kv_heads
        return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def rotate(self, x: Tensor, offset: int) -> Tensor:
        """RoPE on ``x`` (batch, heads, len, dim) at the positions from ``offset`` on."""
        end = offset + x.size(2)
        if end > self.rope_cos.size(0):
            return rotary(x, torch.arange(offset, end), self.rope_base)
        return rotate(x, self.rope_cos[offset:end].float(), self.rope_sin[offset:end].float())

    def _project(
        self, query: Tensor, key: Tensor, value: Tensor, keys_needed: bool
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Q W^Q, K W^K and V W^V; only the queries' when the keys and values are cached."""
        if not keys_needed:
            return self.q_proj(query), None, None
        if self.fast:
            fused = fused_projections(query, key, value, self.q_proj, self.k_proj, self.v_proj)
            if fused is not None:
                return fused
        return self.q_proj(query), self.k_proj(key), self.v_proj(value)

    def _split(self, x: Tensor, heads: int | None = None) -> Tensor:
        """(batch, len, heads * dim) -> (batch, heads, len, dim); ``heads`` defaults to the query heads."""
        return x.view(x.size(0), x.size(1), heads or self.heads, -1).transpose(1, 2)

    def _keys_values(
        self, key: Tensor | None, value: Tensor | None, cache: dict | None, offset: int
    ) -> tuple[Tensor, Tensor]:
        """Split (and rotate) the projected keys and values, and go through the cache."""
        if key is None or value is None:  # cross-attention, cached
            return cache["k"], cache["v"]
        k, v = self._split(key, self.kv_heads), self._split(value, self.kv_heads)
        if self.rope_base is not None:
            k = self.rotate(k, offset)
        if cache is None:
            return k, v
        if self.cross:
            cache["k"], cache["v"] = k, v
            return k, v
        # Self-attention: the cache grows by this step's keys/values after its rows that the search kept.
        if "k" in cache:
            k, v = self._append(cache["k"], k), self._append(cache["v"], v)
        cache["k"], cache["v"] = LazyRows(k), LazyRows(v)
        return k, v

    def _append(self, past: LazyRows, new: Tensor) -> Tensor:
        """The cached rows the search kept, then ``new`` along the positions (dim 2)."""
        if self.fast:
            return gather_append(past, new)  # in one copy
        return torch.cat([past.take(), new], dim=2)


class DotProductAttention(Attention):
    """Scaled dot-product attention (Vaswani et al., 2017): score(q, k) = q . k / sqrt(dim).

    Computed by ``F.scaled_dot_product_attention`` (:func:`~nmt.models.kernels.sdpa`) where it applies
    and the weights are not asked for (its fused kernels do not return them).
    """

    def score(self, q: Tensor, k: Tensor) -> Tensor:
        return dot_product_scores(q, k)

    def attend(self, q, k, v, key_padding_mask, causal, need_weights):
        if self.fast and not need_weights:
            out = sdpa(q, k, v, key_padding_mask, causal, self.dropout if self.training else 0.0)
            if out is not None:
                return out, None
        return super().attend(q, k, v, key_padding_mask, causal, need_weights)

    def attend_shared(self, q, k, v, key_padding_mask, need_weights, share):
        if self.fast and not need_weights:
            dropout = self.dropout if self.training else 0.0
            out = sdpa_shared(q, k, v, key_padding_mask, dropout, share)
            if out is not None:
                return out, None
        return super().attend_shared(q, k, v, key_padding_mask, need_weights, share)


class AdditiveAttention(Attention):
    """Additive attention (Bahdanau et al., 2014), per head: score(q, k) = v_a . tanh(W_q q + W_k k).

    Each head has its own ``score_dim``-sized slice of the query/key projections and its own vector
    v_a (a row of ``v_a``); the softmax, masks and dropout are those of dot-product attention. The
    key projection W_k k is what the cache keeps, so cross-attention computes it once per sentence.

    Cost: unlike a dot product, the score cannot be a matrix product; it needs the (batch, heads,
    tgt, src, score_dim) tensor tanh(W_q q + W_k k). Target positions are therefore scored ``chunk``
    at a time, which bounds the extra memory to batch * heads * chunk * src_len * score_dim elements
    (e.g. 4 * 8 * 64 * 100 * 64 floats = 52 MB for 4 sentences of 100 subwords, 8 heads of 64),
    in training as well (see :func:`additive_scores`); incremental decoding scores one position.
    """

    def __init__(self, d_model: int, heads: int, dropout: float, cross: bool, chunk: int = 64, **kwargs):
        super().__init__(d_model, heads, dropout, cross, **kwargs)
        self.chunk = chunk
        self.v_a = nn.Parameter(torch.empty(heads, self.score_dim))
        nn.init.normal_(self.v_a, std=self.score_dim**-0.5)

    @classmethod
    def options(cls, cfg: TransformerConfig) -> dict[str, Any]:
        return {"score_dim": cfg.additive_dim or None, "chunk": cfg.additive_chunk}

    def score(self, q: Tensor, k: Tensor) -> Tensor:
        return additive_scores(q, k, self.v_a, self.chunk)


# The kinds, by the model.self_attention/cross_attention choices (both ATTENTION_KINDS).
ATTENTION = keyed_by_choices(
    TransformerConfig, "self_attention", {"dot_product": DotProductAttention, "additive": AdditiveAttention}
)


def build_attention(kind: str, d_model: int, heads: int, dropout: float, cross: bool, **kwargs) -> Attention:
    """The attention module of the named kind (config keys ``model.self_attention``/``cross_attention``)."""
    return ATTENTION[kind](d_model, heads, dropout, cross, **kwargs)


def kind_options(kind: str, cfg: TransformerConfig) -> dict[str, Any]:
    """The named kind's own arguments of :func:`build_attention`, from the model config."""
    return ATTENTION[kind].options(cfg)


def cached_key_dim(kind: str, cfg: TransformerConfig) -> int:
    """Per-head size of the keys that a layer of the named kind caches: its score size."""
    return kind_options(kind, cfg).get("score_dim") or cfg.d_model // cfg.heads
