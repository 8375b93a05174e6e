"""Which stock ``transformers`` class holds one of our Transformers, its config, our weights in its layout.

Read from transformers' modeling files (models/blenderbot, models/marian):

- **pre-norm** (with the final layer norm after each stack) -> ``BlenderbotForConditionalGeneration``:
  pre-norm layers, a final LayerNorm after each stack, learned positions from offset 0 that are saved
  with the weights (so a sinusoidal table goes in as it is), token embeddings scaled by sqrt(d_model),
  one vocabulary whose embedding the output layer shares;
- **post-norm with sinusoidal positions** -> ``MarianMTModel``: post-norm layers and no final norm, and
  a sinusoid that the class recomputes when it loads (never read from the weights), with the sines in
  the first half of the features and the cosines in the second where ours interleaves them. The whole
  residual stream is therefore permuted (our feature 2i becomes i, 2i+1 becomes d/2 + i): every weight
  that reads the stream has its columns permuted, every weight and bias that writes it its rows, and the
  layer norms their gains and biases (a LayerNorm is permutation-equivariant). The model then computes
  the same function with Marian's table, exactly up to the two tables' rounding. Separate source and
  target vocabularies fit (``share_encoder_decoder_embeddings=False``);
- **grouped-query attention** (``kv_heads``): plain multi-head attention with each key/value head's
  projection repeated for its group of query heads: the same function, with more weights;
- both: ReLU feed-forward layers, LayerNorm epsilon 1e-5 and biases everywhere but the output layer,
  as ours; the output layer tied to the target embeddings (``model.share_embeddings=true``).

No stock encoder-decoder class has rotary positions, additive attention or RNNsearch: those are
refused, in one line that names the settings that would export.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nmt.config import DecodingConfig, ModelConfig, TransformerConfig
from nmt.errors import NMTError
from nmt.models.attention import Attention, DotProductAttention
from nmt.models.transformer import Transformer
from nmt.text.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID

BLENDERBOT = "BlenderbotForConditionalGeneration"
MARIAN = "MarianMTModel"
EXPORTS = (
    "a Transformer with dot-product attention, model.share_embeddings=true and model.positional=sinusoidal "
    "(pre- or post-norm) or learned (pre-norm) exports"
)


def _refuse(setting: str, why: str, instead: str = EXPORTS) -> NMTError:
    return NMTError(f"{setting} cannot be exported to transformers: {why}; {instead}")


def hf_class(cfg: ModelConfig, joint: bool) -> str:
    """The name of the ``transformers`` class that holds a model of ``cfg`` (``joint``: one vocabulary for
    both languages); an NMTError in one line for a model that no stock class holds. Checked before any
    weights are loaded."""
    if not isinstance(cfg, TransformerConfig) or cfg.arch != "transformer":
        raise _refuse(f"model.arch={cfg.arch!r}", "no stock class holds RNNsearch")
    for key in ("self_attention", "cross_attention"):
        if getattr(cfg, key) != "dot_product":
            raise _refuse(f"model.{key}={getattr(cfg, key)!r}", "no stock class has additive attention")
    if cfg.positional == "rope":
        raise _refuse(
            "model.positional='rope'",
            "no stock encoder-decoder class has rotary positions",
            "train with model.positional=sinusoidal to export (or use CTranslate2: scripts/export_ct2.py)",
        )
    if not cfg.share_embeddings:
        raise _refuse(
            "model.share_embeddings=false",
            "the stock classes tie the output layer to the target embeddings",
            "train with model.share_embeddings=true",
        )
    if cfg.norm_first:
        if not joint:
            raise _refuse(
                "tokenizer.joint=false with model.norm_first=true",
                f"{BLENDERBOT} (pre-norm) has one vocabulary",
                "train with tokenizer.joint=true, or post-norm (model.norm_first=false, sinusoidal)",
            )
        return BLENDERBOT
    if cfg.positional != "sinusoidal":
        raise _refuse(
            f"model.positional={cfg.positional!r} with model.norm_first=false",
            f"{MARIAN} (post-norm) recomputes a fixed sinusoid when it loads",
            "train with model.positional=sinusoidal, or pre-norm (model.norm_first=true) with learned ones",
        )
    return MARIAN


def hf_config(model: Transformer, class_name: str) -> dict[str, Any]:
    """The keyword arguments of the class's config (``BlenderbotConfig`` or ``MarianConfig``)."""
    cfg = model.cfg
    config: dict[str, Any] = {
        "vocab_size": model.vocab_sizes["src"],
        "d_model": cfg.d_model,
        "encoder_layers": cfg.encoder_layers,
        "decoder_layers": cfg.decoder_layers,
        "encoder_attention_heads": cfg.heads,
        "decoder_attention_heads": cfg.heads,
        "encoder_ffn_dim": cfg.ff_dim,
        "decoder_ffn_dim": cfg.ff_dim,
        "activation_function": "relu",
        "dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout,
        "activation_dropout": cfg.activation_dropout,
        "max_position_embeddings": cfg.max_positions,
        "scale_embedding": True,
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "decoder_start_token_id": BOS_ID,
        "forced_eos_token_id": EOS_ID,
        "tie_word_embeddings": True,
    }
    if class_name == MARIAN:
        joint = model.src_embed.tokens is model.tgt_embed.tokens
        return {
            **config,
            "decoder_vocab_size": model.vocab_sizes["tgt"],
            "share_encoder_decoder_embeddings": joint,
        }
    return {**config, "encoder_no_repeat_ngram_size": 0}  # Blenderbot's default blocks source trigrams


def generation_config(decoding: DecodingConfig, max_positions: int) -> dict[str, Any]:
    """``generation_config.json``: our special ids, the tokens our search never outputs (PAD, BOS, and UNK
    with ``decoding.no_unk``), and the checkpoint's beam size and n-gram blocking. ``max_length`` is the
    model's limit (BOS, ``max_positions - 1`` tokens, EOS forced at the end as our search forces it):
    our per-sentence budget ``max_len_a * src_len + max_len_b`` has no setting in ``generate``, which
    takes it per call (``max_new_tokens``). The length penalty is left at transformers' (a division by
    length ** 1.0, not GNMT's): beam search ranks differently, greedy search is the same."""
    suppressed = [PAD_ID, BOS_ID] + ([UNK_ID] if decoding.no_unk else [])
    return {
        "decoder_start_token_id": BOS_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "forced_eos_token_id": EOS_ID,
        "suppress_tokens": suppressed,
        "num_beams": decoding.beam_size,
        "max_length": max_positions + 1,
        "no_repeat_ngram_size": decoding.no_repeat_ngram,
        "do_sample": False,
    }


def residual_permutation(d_model: int) -> Tensor:
    """Marian's feature order in terms of ours: the sines (our even features), then the cosines (odd)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def repeat_heads(t: Tensor, kv_heads: int, group: int) -> Tensor:
    """A key/value projection's weight (kv_heads * head_dim, d) or bias with each head's rows repeated for
    the ``group`` consecutive query heads it serves (as ``Attention.expand_kv`` repeats its outputs)."""
    return t.unflatten(0, (kv_heads, -1)).repeat_interleave(group, dim=0).flatten(0, 1)


def hf_weights(model: Transformer, class_name: str) -> dict[str, Tensor]:
    """Every weight of the ``class_name`` model, by its transformers name, in fp32."""
    perm = residual_permutation(model.cfg.d_model) if class_name == MARIAN else None
    weights = HFWeights(perm)
    for i, layer in enumerate(model.encoder):
        prefix = f"model.encoder.layers.{i}"
        weights.attention(f"{prefix}.self_attn", layer.attn)
        weights.norm(f"{prefix}.self_attn_layer_norm", layer.res_attn.norm)
        weights.feed_forward(prefix, layer.ff)
        weights.norm(f"{prefix}.final_layer_norm", layer.res_ff.norm)
    for i, layer in enumerate(model.decoder):
        prefix = f"model.decoder.layers.{i}"
        weights.attention(f"{prefix}.self_attn", layer.self_attn)
        weights.norm(f"{prefix}.self_attn_layer_norm", layer.res_self.norm)
        weights.attention(f"{prefix}.encoder_attn", layer.cross_attn)
        weights.norm(f"{prefix}.encoder_attn_layer_norm", layer.res_cross.norm)
        weights.feed_forward(prefix, layer.ff)
        weights.norm(f"{prefix}.final_layer_norm", layer.res_ff.norm)
    if class_name == BLENDERBOT:
        weights.norm("model.encoder.layer_norm", model.enc_norm)
        weights.norm("model.decoder.layer_norm", model.dec_norm)
    weights.embeddings(model)
    return weights.out


class HFWeights:
    """The transformers weights being collected, each in fp32 by its name; for Marian, whose residual
    stream orders its features as :func:`residual_permutation` does, permuted where they meet the stream."""

    def __init__(self, perm: Tensor | None):
        self.perm = perm
        self.out: dict[str, Tensor] = {}

    def reads(self, w: Tensor) -> Tensor:
        """(rows, d_model): applied to the residual stream, or an embedding table."""
        return w if self.perm is None else w[:, self.perm]

    def writes(self, t: Tensor) -> Tensor:
        """(d_model, ...): a weight, bias or norm parameter of the stream."""
        return t if self.perm is None else t[self.perm]

    def put(self, name: str, t: Tensor) -> None:
        self.out[name] = t.detach().float().contiguous().clone()

    def norm(self, name: str, module: torch.nn.LayerNorm) -> None:
        self.put(f"{name}.weight", self.writes(module.weight))
        self.put(f"{name}.bias", self.writes(module.bias))

    def feed_forward(self, prefix: str, ff: torch.nn.Sequential) -> None:
        self.put(f"{prefix}.fc1.weight", self.reads(ff[0].weight))
        self.put(f"{prefix}.fc1.bias", ff[0].bias)
        self.put(f"{prefix}.fc2.weight", self.writes(ff[3].weight))
        self.put(f"{prefix}.fc2.bias", self.writes(ff[3].bias))

    def attention(self, prefix: str, attn: Attention) -> None:
        if type(attn) is not DotProductAttention:  # hf_class refuses the config already
            raise NMTError(f"{type(attn).__name__} cannot be exported to transformers")
        group = attn.heads // attn.kv_heads
        for name in ("q_proj", "k_proj", "v_proj"):
            proj = getattr(attn, name)
            weight, bias = proj.weight, proj.bias
            if name != "q_proj" and group > 1:
                weight, bias = (
                    repeat_heads(weight, attn.kv_heads, group),
                    repeat_heads(bias, attn.kv_heads, group),
                )
            self.put(f"{prefix}.{name}.weight", self.reads(weight))
            self.put(f"{prefix}.{name}.bias", bias)
        self.put(f"{prefix}.out_proj.weight", self.writes(attn.out_proj.weight))
        self.put(f"{prefix}.out_proj.bias", self.writes(attn.out_proj.bias))

    def embeddings(self, model: Transformer) -> None:
        """The token tables, the output projection, its (zero) bias and the position tables."""
        src, tgt = model.src_embed, model.tgt_embed
        if src.tokens is tgt.tokens:
            self.put("model.shared.weight", self.reads(src.tokens.weight))
        self.put("model.encoder.embed_tokens.weight", self.reads(src.tokens.weight))
        self.put("model.decoder.embed_tokens.weight", self.reads(tgt.tokens.weight))
        self.put("lm_head.weight", self.reads(model.output.weight))
        self.out["final_logits_bias"] = torch.zeros(1, model.vocab_sizes["tgt"])
        for name, embed in (("encoder", src), ("decoder", tgt)):
            # Blenderbot saves and loads this table; Marian recomputes its own (this, permuted) on loading.
            table = embed.positions.weight if embed.kind == "learned" else embed.table
            self.put(f"model.{name}.embed_positions.weight", self.reads(table))
