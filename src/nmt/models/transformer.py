"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Pre-norm by default (stabler without long warmup), post-norm as in the paper with
``norm_first=False``. Attention modules come from :func:`build_attention` by config, so the model
never knows whether it got dot-product or additive attention. Positions are added to the embeddings
(sinusoidal, learned) or, with ``positional=rope``, rotate the queries and keys of the encoder's and
decoder's self-attention (never the cross-attention: source and target positions are not comparable).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from nmt.config import TransformerConfig, check_model
from nmt.models.attention import build_attention, cached_key_dim, kind_options
from nmt.models.base import PerSentence, Seq2Seq, State
from nmt.models.kernels import Dropout
from nmt.text.special import PAD_ID


def sinusoidal_table(length: int, dim: int) -> Tensor:
    """(length, dim) table with sin on even and cos on odd features, wavelengths up to 10000 * 2pi."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


def kv_cache_bytes(
    cfg: TransformerConfig, tgt_positions: int, src_positions: int, dtype_bytes: int, beams: int = 1
) -> int:
    """Bytes of the decoding cache of one sentence searched with ``beams`` hypotheses, after
    ``tgt_positions`` target tokens::

        decoder_layers * (beams * tgt_positions + src_positions)
                       * kv_heads * (key_dim + head_dim) * dtype_bytes

    i.e. keys and values (2 x kv_heads x head_dim when key_dim = head_dim) of the self-attention over the
    target prefix plus those of the cross-attention over the source, in every decoder layer. key_dim is
    what each attention kind caches per head (:func:`cached_key_dim`: the head dimension, or
    ``additive_dim`` for an additive attention's W_k k). The encoder output
    itself is not counted (the cross-attention caches replace it during decoding). Each hypothesis has
    its own self-attention cache; the cross-attention keys and values are kept once per sentence.
    """
    head_dim = cfg.d_model // cfg.heads
    kv_heads = cfg.kv_heads or cfg.heads

    def per_position(kind: str) -> int:
        return kv_heads * (cached_key_dim(kind, cfg) + head_dim) * dtype_bytes

    self_bytes = beams * tgt_positions * per_position(cfg.self_attention)
    cross_bytes = src_positions * per_position(cfg.cross_attention)
    return cfg.decoder_layers * (self_bytes + cross_bytes)


# The positions Embedding gives, by the model.positional choices (nmt.config.TransformerConfig).


class Embedding(nn.Module):
    """Token embedding scaled by sqrt(d_model), plus positions (none with rope), plus dropout."""

    def __init__(self, tokens: nn.Embedding, cfg: TransformerConfig):
        super().__init__()
        self.tokens, self.scale = tokens, math.sqrt(cfg.d_model)
        self.kind = cfg.positional
        if self.kind == "learned":
            self.positions = nn.Embedding(cfg.max_positions, cfg.d_model)
            nn.init.normal_(self.positions.weight, std=cfg.d_model**-0.5)
        elif self.kind == "sinusoidal":
            self.register_buffer("table", sinusoidal_table(cfg.max_positions, cfg.d_model), persistent=False)
        # rope: positions rotate queries and keys inside self-attention (kinds: nmt.config.check_model)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, ids: Tensor, offset: int = 0) -> Tensor:
        """ids (batch, len) starting at position ``offset`` -> (batch, len, d_model)."""
        if self.kind == "rope":
            return self.dropout(self.tokens(ids) * self.scale)
        span = torch.arange(offset, offset + ids.size(1), device=ids.device)
        pos = self.positions(span) if self.kind == "learned" else self.table[span]
        return self.dropout(self.tokens(ids) * self.scale + pos.to(self.tokens.weight.dtype))


class FeedForward(nn.Sequential):
    def __init__(self, cfg: TransformerConfig):
        super().__init__(
            nn.Linear(cfg.d_model, cfg.ff_dim),
            nn.ReLU(),
            Dropout(cfg.activation_dropout),
            nn.Linear(cfg.ff_dim, cfg.d_model),
        )


class Residual(nn.Module):
    """x + dropout(f(norm(x))) (pre-norm) or norm(x + dropout(f(x))) (post-norm)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.norm, self.dropout, self.pre = nn.LayerNorm(cfg.d_model), Dropout(cfg.dropout), cfg.norm_first

    def forward(self, x: Tensor, f) -> Tensor:
        if self.pre:
            return x + self.dropout(f(self.norm(x)))
        return self.norm(x + self.dropout(f(x)))


def _attention(kind: str, cfg: TransformerConfig, cross: bool) -> nn.Module:
    extra: dict = {"kv_heads": cfg.kv_heads, **kind_options(kind, cfg)}
    if cfg.positional == "rope" and not cross:
        extra |= {"rope_base": cfg.rope_base, "rope_positions": cfg.max_positions}
    return build_attention(kind, cfg.d_model, cfg.heads, cfg.attention_dropout, cross, **extra)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.attn = _attention(cfg.self_attention, cfg, cross=False)
        self.ff = FeedForward(cfg)
        self.res_attn, self.res_ff = Residual(cfg), Residual(cfg)

    def forward(self, x: Tensor, pad: Tensor | None) -> Tensor:
        x = self.res_attn(x, lambda h: self.attn(h, h, h, key_padding_mask=pad)[0])
        return self.res_ff(x, self.ff)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = _attention(cfg.self_attention, cfg, cross=False)
        self.cross_attn = _attention(cfg.cross_attention, cfg, cross=True)
        self.ff = FeedForward(cfg)
        self.res_self, self.res_cross, self.res_ff = Residual(cfg), Residual(cfg), Residual(cfg)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        memory_pad: Tensor | None,
        cache: dict | None = None,
        weights: list | None = None,
    ) -> Tensor:
        """In beam search ``x`` may have several rows (a sentence's hypotheses) per row of ``memory``."""
        # Targets are right-padded, so causal masking alone keeps real positions off the padding.
        self_cache = cache["self"] if cache is not None else None
        cross_cache = cache["cross"] if cache is not None else None
        x = self.res_self(x, lambda h: self.self_attn(h, h, h, causal=True, cache=self_cache)[0])

        def cross(h: Tensor) -> Tensor:
            out, w = self.cross_attn(
                h,
                memory,
                memory,
                key_padding_mask=memory_pad,
                cache=cross_cache,
                need_weights=weights is not None,
            )
            if weights is not None:
                weights.append(w)
            return out

        x = self.res_cross(x, cross)
        return self.res_ff(x, self.ff)


class Transformer(Seq2Seq):
    """Encoder-decoder Transformer with optionally tied source/target/output embeddings."""

    def __init__(self, cfg: TransformerConfig, src_vocab: int, tgt_vocab: int, joint_vocab: bool):
        super().__init__()
        check_model(cfg)  # heads, kv_heads, positions and attention kinds that fit together
        self.cfg, self.vocab_sizes = cfg, {"src": src_vocab, "tgt": tgt_vocab}
        src_tokens = nn.Embedding(src_vocab, cfg.d_model, padding_idx=PAD_ID)
        tie = cfg.share_embeddings and joint_vocab
        tgt_tokens = src_tokens if tie else nn.Embedding(tgt_vocab, cfg.d_model, padding_idx=PAD_ID)
        self.src_embed, self.tgt_embed = Embedding(src_tokens, cfg), Embedding(tgt_tokens, cfg)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        # Pre-norm stacks end with a norm; post-norm layers already normalise their output.
        self.enc_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.output = nn.Linear(cfg.d_model, tgt_vocab, bias=False)
        self._init_weights()
        if cfg.share_embeddings:
            self.output.weight = tgt_tokens.weight

    def _init_weights(self) -> None:
        for module in self.modules():  # other parameters (e.g. additive attention's v) keep their own init
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for emb in (self.src_embed.tokens, self.tgt_embed.tokens):
            nn.init.normal_(emb.weight, std=self.cfg.d_model**-0.5)
            nn.init.zeros_(emb.weight[PAD_ID])

    # ----------------------------------------------------------------------------------- training
    def forward(self, src: Tensor, tgt_in: Tensor, keep: Tensor | None = None) -> Tensor:
        memory, memory_pad = self._encode(src)
        x = self._decode(tgt_in, memory, memory_pad)
        return self.output(x[keep] if keep is not None else x)

    def _encode(self, src: Tensor) -> tuple[Tensor, Tensor | None]:
        pad = self.padding_mask(src)
        pad = pad if bool(pad.any()) else None  # unpadded batches take the fastest kernels
        x = self.src_embed(src)
        for layer in self.encoder:
            x = layer(x, pad)
        return self.enc_norm(x), pad

    def _decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        memory_pad: Tensor | None,
        caches: list | None = None,
        offset: int = 0,
        weights: list | None = None,
    ) -> Tensor:
        x = self.tgt_embed(tgt_in, offset)
        for i, layer in enumerate(self.decoder):
            x = layer(x, memory, memory_pad, caches[i] if caches is not None else None, weights)
        return self.dec_norm(x)

    # ------------------------------------------------------------------------------------- search
    def encode(self, src: Tensor) -> State:
        memory, pad = self._encode(src)
        return {"memory": memory, "memory_pad": pad if pad is not None else self.padding_mask(src)}

    def init_state(self, encoded: State, cache: bool = True) -> State:
        """With the cache: per sentence (``state["sentence"]``, a :class:`PerSentence` part), the encoder
        output and, from the first step on, the cross-attention keys/values in place of it; per
        hypothesis, the target prefix and the self-attention keys/values. Without it, every hypothesis
        keeps its own memory: each step recomputes the cross-attention keys/values from it, over the
        rows it always had (a matrix product over fewer rows may round differently)."""
        prefix = encoded["memory"].new_zeros(encoded["memory"].size(0), 0, dtype=torch.long)
        if not cache:
            return {**encoded, "prefix": prefix}
        return {
            "sentence": PerSentence({**encoded, "cross": [{} for _ in self.decoder]}),
            "prefix": prefix,
            "self": [{} for _ in self.decoder],
        }

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        prefix = torch.cat([state["prefix"], tokens[:, None]], dim=1)
        if "self" not in state:
            x = self._decode(prefix, state["memory"], state["memory_pad"])
            return self.output_log_probs(x[:, -1], state), {**state, "prefix": prefix}
        sentence = state["sentence"]
        x = self._decode(
            tokens[:, None],
            sentence["memory"],
            sentence["memory_pad"],
            [{"self": own, "cross": shared} for own, shared in zip(state["self"], sentence["cross"])],
            offset=prefix.size(1) - 1,
        )
        sentence = sentence.with_parts(memory=None)  # now inside the cross-attention caches
        return self.output_log_probs(x[:, -1], state), {**state, "prefix": prefix, "sentence": sentence}

    def search_bytes(self, src_positions: int, tgt_positions: int, beams: int) -> int:
        """The key/value caches (:func:`kv_cache_bytes`): per hypothesis over the target positions, per
        sentence over the source."""
        return kv_cache_bytes(self.cfg, tgt_positions, src_positions, self.dtype_bytes, beams)

    def cross_attention(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        memory, pad = self._encode(src)
        weights: list[Tensor] = []
        self._decode(tgt_in, memory, pad, weights=weights)
        return torch.stack(weights)
