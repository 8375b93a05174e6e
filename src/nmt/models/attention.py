"""Attention variants behind one interface.

Every variant is called as::

    out, weights = attn(query, key, value, key_padding_mask=None, causal=False, cache=None,
                        need_weights=False)

with ``query`` (batch, tgt_len, d_model), ``key``/``value`` (batch, src_len, d_model),
``key_padding_mask`` (batch, src_len) True at padding, ``causal`` masking future keys, and ``weights``
(batch, heads, tgt_len, src_len) when asked for. The shared part (projections, heads, rotary
positions, the key/value cache) lives in :class:`Attention`; a variant only defines how queries score
keys (:meth:`attend`).

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

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from nmt.models.base import LazyRows

# F.scaled_dot_product_attention shares key/value heads among query heads itself from torch 2.5 on.
SDPA_GQA = torch.__version__ >= "2.5"


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


class Attention(nn.Module):
    """Multi-head attention skeleton: projections, head split/merge, rotary positions and the key/value cache.

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

    def rotate(self, x: Tensor, offset: int) -> Tensor:
        """RoPE on ``x`` (batch, heads, len, dim) at the positions from ``offset`` on."""
        end = offset + x.size(2)
        if end > self.rope_cos.size(0):
            return rotary(x, torch.arange(offset, end), self.rope_base)
        return rotate(x, self.rope_cos[offset:end].float(), self.rope_sin[offset:end].float())

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

    def _project(
        self, query: Tensor, key: Tensor, value: Tensor, keys_needed: bool
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """The query, key and value projections. In training, one matrix product for those that share an
        input (self-attention: all three; cross-attention: keys and values), as nn.MultiheadAttention
        does; in inference separate ones, since stacking the weights at every decoding step would copy
        them for a product over a few rows."""
        if not keys_needed:
            return self.q_proj(query), None, None
        if not torch.is_grad_enabled():
            return self.q_proj(query), self.k_proj(key), self.v_proj(value)
        if query is key and key is value:
            return fused_linear(query, (self.q_proj, self.k_proj, self.v_proj))
        if key is value:
            return (self.q_proj(query), *fused_linear(key, (self.k_proj, self.v_proj)))
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
        # Self-attention: the cache grows by this step's keys/values; its rows, reordered by the search
        # since the last step, are taken in the same copy.
        if "k" in cache:
            k, v = gather_append(cache["k"], k), gather_append(cache["v"], v)
        cache["k"], cache["v"] = LazyRows(k), LazyRows(v)
        return k, v

    def expand_kv(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keys/values with each of the kv_heads repeated for its group of query heads (for the scoring
        paths that need one key head per query head; the cache keeps the unexpanded tensors)."""
        if self.kv_heads == self.heads:
            return k, v
        group = self.heads // self.kv_heads
        return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        causal: bool,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Combine values (batch, heads, src_len, head_dim) by query-key scores; returns (out, weights)."""
        raise NotImplementedError

    def attend_shared(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, need_weights: bool, share: int
    ) -> tuple[Tensor, Tensor | None]:
        """:meth:`attend` for ``share`` consecutive query rows per key/value row (cross-attention).

        Each hypothesis gets its own copy of the keys and values, so that it computes exactly what it
        would compute alone (folding the beams into more query positions changes the order of the
        float operations). A variant with a kernel that shares them, bit for bit, overrides this.
        """
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.repeat_interleave(share, dim=0)
        k, v = k.repeat_interleave(share, dim=0), v.repeat_interleave(share, dim=0)
        return self.attend(q, k, v, key_padding_mask, False, need_weights)


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


def fused_linear(x: Tensor, layers: tuple[nn.Linear, ...]) -> tuple[Tensor, ...]:
    """``layer(x)`` for each layer, in one matrix product of their stacked weights."""
    weight = torch.cat([layer.weight for layer in layers])
    bias = torch.cat([layer.bias for layer in layers])
    return F.linear(x, weight, bias).split([layer.out_features for layer in layers], dim=-1)


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


class DotProductAttention(Attention):
    """Scaled dot-product attention (Vaswani et al., 2017) through ``F.scaled_dot_product_attention``,
    which picks fused flash/memory-efficient kernels on GPU. The explicit softmax path is used when
    the weights are asked for (plots), since the fused kernels do not return them, and for bf16/fp16
    on CPU, where the fused kernel is slower than in fp32 and slower than the explicit path
    (docs/speed.md)."""

    def attend(self, q, k, v, key_padding_mask, causal, need_weights):
        dropout = self.dropout if self.training else 0.0
        fused = not need_weights and not (q.device.type == "cpu" and q.dtype != torch.float32)
        if fused:
            plain = key_padding_mask is None and (not causal or q.size(2) == k.size(2))
            mask = None if plain else allowed_mask(key_padding_mask, causal, q.size(2), k.size(2), q.device)
            gqa = {}
            if self.kv_heads != self.heads:
                # CUDA runs enable_gqa with a mask in the slow math kernel (so Hugging Face transformers
                # avoids it too): there the heads are repeated, for the memory-efficient kernel.
                if SDPA_GQA and (plain or q.device.type != "cuda"):
                    gqa = {"enable_gqa": True}
                else:
                    k, v = self.expand_kv(k, v)
            if plain:
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=causal, **gqa)
                return out, None
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, **gqa), None
        k, v = self.expand_kv(k, v)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        mask = allowed_mask(key_padding_mask, causal, q.size(2), k.size(2), q.device)
        out, weights = softmax_combine(scores, v, mask, dropout)
        return out, weights if need_weights else None

    def attend_shared(self, q, k, v, key_padding_mask, need_weights, share):
        """On CPU in fp32, the fused kernel takes the ``share`` rows of a sentence (its beams) as more query
        positions over the sentence's keys and values, padding mask included: one block of beams x
        positions queries per sentence and head rather than one per beam, without copying the keys and
        values (1.6-1.8x faster than one query per beam, docs/speed.md). A sentence's beams get the same
        numbers alone and in any batch (with a different row count the kernel's products may round
        differently from a single hypothesis' in the last bits). Elsewhere (CUDA, bf16, weights asked
        for) each beam attends with its own copy of the keys and values, the layout measured there."""
        if need_weights or q.device.type != "cpu" or q.dtype != torch.float32:
            return super().attend_shared(q, k, v, key_padding_mask, need_weights, share)
        heads, tgt_len = q.size(1), q.size(2)
        # (sentences, heads, share * tgt, dim): beam j's query t is position j * tgt + t.
        folded = q.unflatten(0, (-1, share)).transpose(1, 2).flatten(2, 3)
        mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        dropout = self.dropout if self.training else 0.0
        gqa = {}
        if self.kv_heads != heads:
            if SDPA_GQA:
                gqa = {"enable_gqa": True}
            else:
                k, v = self.expand_kv(k, v)
        out = F.scaled_dot_product_attention(folded, k, v, attn_mask=mask, dropout_p=dropout, **gqa)
        return out.unflatten(2, (share, tgt_len)).transpose(1, 2).flatten(0, 1), None


def softmax_combine(scores: Tensor, v: Tensor, mask: Tensor | None, dropout: float) -> tuple[Tensor, Tensor]:
    """Masked softmax over keys (masked weights exactly 0), then the weighted sum of values."""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(v.dtype)
    return F.dropout(weights, dropout, training=dropout > 0) @ v, weights


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

    def attend(self, q, k, v, key_padding_mask, causal, need_weights):
        k, v = self.expand_kv(k, v)
        scores = additive_scores(q, k, self.v_a, self.chunk)
        mask = allowed_mask(key_padding_mask, causal, q.size(2), k.size(2), q.device)
        out, weights = softmax_combine(scores, v, mask, self.dropout if self.training else 0.0)
        return out, weights if need_weights else None


# The kinds, by the model.self_attention/cross_attention choices (nmt.config.ATTENTION_KINDS).
ATTENTION = {"dot_product": DotProductAttention, "additive": AdditiveAttention}


def build_attention(kind: str, d_model: int, heads: int, dropout: float, cross: bool, **kwargs) -> Attention:
    """The attention module of the named kind (config keys ``model.self_attention``/``cross_attention``)."""
    return ATTENTION[kind](d_model, heads, dropout, cross, **kwargs)
