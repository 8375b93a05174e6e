"""Export a trained Transformer to a CTranslate2 model directory (``scripts/export_ct2.py``).

The weights are written into CTranslate2's ``TransformerSpec`` directly, not through one of its
converters, so nothing here depends on another toolkit's layout. What has to agree for the exported
model to compute exactly what ours computes:

- positions: CTranslate2's built-in sinusoidal table is not ours (all sines, then all cosines, with
  timescales 10000 ** (i / (d/2 - 1)); ours interleaves them with 10000 ** (2i / d)), so the model's
  own table, sinusoidal or learned, is exported: row 0 for the first source token and for BOS. RoPE
  has no table: CTranslate2 rotates the self-attention's queries and keys itself (the two halves of
  each head, as ``nmt.models.attention.rotary``, hence ``rotary_interleave=False``);
- embeddings are scaled by sqrt(d_model) before the positions are added (``scale_embeddings``);
- layer norms: PyTorch's epsilon (1e-5) is written to ``config.json``; pre-norm stacks end with a
  norm, post-norm ones do not (``no_final_norm`` is implied by ``pre_norm=False``);
- vocabularies: the SentencePiece pieces in id order, so CTranslate2's token ids are ours (pad 0,
  unk 1, bos 2, eos 3); the source gets EOS appended (``add_source_eos``, as ``decoding.pad_batch``
  does) and decoding starts from BOS.

The directory also holds the SentencePiece model(s) and ``nmt_export.json`` (the tokenizer's
fingerprint and the digest of the weights, :func:`nmt.checkpoint.weights_digest`, so that
:class:`nmt.ct2.backend.CT2Backend` can refuse another tokenizer or another checkpoint's model; the
checkpoint's path and step, for people to read), and,
exported with ``shortlist=FILE``, that vocabulary shortlist as CTranslate2's vocabulary map
(``vmap.txt``), recorded in ``nmt_export.json`` by the file's content digest so that the backend uses
the map only for ``decoding.shortlist=FILE``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from nmt.checkpoint import checkpoint_config, load_checkpoint, model_from_checkpoint, weights_digest
from nmt.config import CT2_QUANTIZATIONS, ExportCT2Config, ModelConfig, TransformerConfig, check_choice
from nmt.ct2.format import META_FILE, file_digest, require_ctranslate2, write_export_info
from nmt.decoding.shortlist import Shortlist, load_shortlist, write_vmap
from nmt.errors import NMTError
from nmt.models.attention import Attention, DotProductAttention
from nmt.models.transformer import DecoderLayer, EncoderLayer, Residual, Transformer
from nmt.outputs import check_output_dir, replace_output_dir
from nmt.text.special import BOS_ID, EOS_ID, UNK_ID
from nmt.text.tokenizer import Tokenizer

WRITER = "scripts/export_ct2.py"  # what the output-directory rule names as the writer of an export


def check_exportable(cfg: ModelConfig) -> None:
    """Refuse, in one line, any model CTranslate2 has no spec for: before any weights are loaded."""
    if not isinstance(cfg, TransformerConfig) or cfg.arch != "transformer":
        raise NMTError(
            f"model.arch={cfg.arch!r} cannot be exported to CTranslate2: only the Transformer with "
            "dot-product attention has a CTranslate2 spec"
        )
    for key in ("self_attention", "cross_attention"):
        if getattr(cfg, key) != "dot_product":
            raise NMTError(
                f"model.{key}={getattr(cfg, key)!r} cannot be exported to CTranslate2: it has no spec for "
                "additive attention (only dot_product)"
            )


def check_quantization(quantization: str) -> None:
    check_choice("quantization", quantization, CT2_QUANTIZATIONS)


# ------------------------------------------------------------------------------------------- the spec
def _array(tensor) -> Any:
    """A copy: CTranslate2 quantizes the arrays in place, which must not touch the model's weights."""
    return tensor.detach().float().cpu().numpy().copy()


def _linear(spec, module: nn.Linear) -> None:
    spec.weight = _array(module.weight)
    if module.bias is not None:
        spec.bias = _array(module.bias)


def _norm(spec, module: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(module.weight), _array(module.bias)


def _fused(spec, modules: list[nn.Linear]) -> None:
    """One linear layer computing several (q|k|v or k|v), as CTranslate2 stores attention inputs."""
    import numpy as np

    spec.weight = np.concatenate([_array(m.weight) for m in modules])
    spec.bias = np.concatenate([_array(m.bias) for m in modules])


def _attention(spec, attn: Attention, residual: Residual, self_attention: bool) -> None:
    if type(attn) is not DotProductAttention:
        raise NMTError(
            f"{type(attn).__name__} cannot be exported to CTranslate2 (dot-product attention only)"
        )
    if self_attention:
        _fused(spec.linear[0], [attn.q_proj, attn.k_proj, attn.v_proj])
    else:
        _linear(spec.linear[0], attn.q_proj)
        _fused(spec.linear[1], [attn.k_proj, attn.v_proj])
    _linear(spec.linear[-1], attn.out_proj)
    _norm(spec.layer_norm, residual.norm)


def _feed_forward(spec, layer: EncoderLayer | DecoderLayer) -> None:
    _linear(spec.linear_0, layer.ff[0])
    _linear(spec.linear_1, layer.ff[3])
    _norm(spec.layer_norm, layer.res_ff.norm)


def _inputs(spec, embed) -> None:
    """Token embeddings and the model's own position table (learned or sinusoidal; none with RoPE)."""
    spec_embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    spec_embeddings.weight = _array(embed.tokens.weight)
    spec.scale_embeddings = True  # sqrt(d_model), as nmt.models.transformer.Embedding
    if embed.kind == "rope":
        if hasattr(spec, "position_encodings"):  # the encoder spec always declares a table
            del spec.position_encodings
        return
    table = embed.positions.weight if embed.kind == "learned" else embed.table
    spec.position_encodings.encodings = _array(table)


def build_spec(model: Transformer, tokenizer: Tokenizer):
    """The CTranslate2 ``TransformerSpec`` of ``model``, with vocabularies and special tokens set."""
    require_ctranslate2()
    from ctranslate2.specs import transformer_spec

    cfg = model.cfg
    check_exportable(cfg)
    # kv_heads holds for self- and cross-attention in both models; RoPE is in self-attention only in both.
    shared = {"num_heads_kv": cfg.kv_heads or None}
    if cfg.positional == "rope":
        shared |= {
            "rotary_dim": cfg.d_model // cfg.heads,
            "rotary_interleave": False,
            "rotary_base": cfg.rope_base,
        }
    spec = transformer_spec.TransformerSpec(
        transformer_spec.TransformerEncoderSpec(
            cfg.encoder_layers, cfg.heads, pre_norm=cfg.norm_first, **shared
        ),
        transformer_spec.TransformerDecoderSpec(
            cfg.decoder_layers, cfg.heads, pre_norm=cfg.norm_first, **shared
        ),
    )
    _inputs(spec.encoder, model.src_embed)
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder):
        _attention(layer_spec.self_attention, layer.attn, layer.res_attn, self_attention=True)
        _feed_forward(layer_spec.ffn, layer)
    _inputs(spec.decoder, model.tgt_embed)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder):
        _attention(layer_spec.self_attention, layer.self_attn, layer.res_self, self_attention=True)
        _attention(layer_spec.attention, layer.cross_attn, layer.res_cross, self_attention=False)
        _feed_forward(layer_spec.ffn, layer)
    if cfg.norm_first:
        _norm(spec.encoder.layer_norm, model.enc_norm)
        _norm(spec.decoder.layer_norm, model.dec_norm)
    _linear(spec.decoder.projection, model.output)

    src_vocab = tokenizer.src_pieces(range(tokenizer.src_vocab_size))
    tgt_vocab = tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size))
    specials = [tgt_vocab[UNK_ID], tgt_vocab[BOS_ID], tgt_vocab[EOS_ID]]
    if src_vocab[EOS_ID] != tgt_vocab[EOS_ID]:
        raise NMTError(
            f"source and target EOS pieces differ ({src_vocab[EOS_ID]!r} vs {tgt_vocab[EOS_ID]!r}): "
            "CTranslate2 has one EOS token for both"
        )
    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    config = spec.config
    config.unk_token, config.bos_token, config.eos_token = specials
    config.decoder_start_token = tgt_vocab[BOS_ID]
    config.add_source_bos, config.add_source_eos = False, True
    config.layer_norm_epsilon = next(m.eps for m in model.modules() if isinstance(m, nn.LayerNorm))
    return spec


# ------------------------------------------------------------------------------------------ exporting
def export_model(
    model: Transformer,
    tokenizer: Tokenizer,
    output: str | Path,
    quantization: str = "none",
    force: bool = False,
    meta: dict[str, Any] | None = None,
    shortlist: str | Path | None = None,
    direction: tuple[str, str] | None = None,
) -> Path:
    """Write ``model`` (and its SentencePiece models) as a CTranslate2 model directory ``output``, with
    the vocabulary ``shortlist`` file (scripts/build_shortlist.py) as its vocabulary map if given, which
    must have been built for the model's ``direction`` (source, target language).

    The directory is filled under a temporary name of its own and renamed at the end, so an interrupted
    export never leaves a directory the backend would load. ``force`` replaces an earlier export only,
    never another directory (:func:`nmt.outputs.replace_output_dir`).
    """
    check_quantization(quantization)
    output = Path(output)
    check_output_dir(output, META_FILE, force, WRITER)
    loaded = None  # the shortlist, checked before the work
    if shortlist is not None:
        if direction is None:
            raise NMTError("exporting with a shortlist needs the model's direction, to check the shortlist's")
        loaded = load_shortlist(Path(shortlist), tokenizer, direction)
    spec = build_spec(model, tokenizer)
    spec.validate()
    spec.optimize(quantization=None if quantization == "none" else quantization)
    with replace_output_dir(output, META_FILE, force, WRITER) as tmp:
        with tempfile.TemporaryDirectory() as scratch:
            vmap = _vocabulary_map(shortlist, loaded, tokenizer, Path(scratch) / "vmap.txt")
            if vmap:
                spec.register_vocabulary_mapping(str(Path(scratch) / "vmap.txt"))
            spec.save(str(tmp))
        src, tgt = tokenizer.protos
        if tokenizer.joint:
            (tmp / "sentencepiece.model").write_bytes(src)
        else:
            (tmp / "source.model").write_bytes(src)
            (tmp / "target.model").write_bytes(tgt)
        info = {
            "tokenizer_fingerprint": tokenizer.fingerprint,
            "weights_sha256": weights_digest(model),
            "joint_vocabulary": tokenizer.joint,
            "max_positions": model.cfg.max_positions,
            "quantization": quantization,
            "shortlist": vmap,
            **(meta or {}),
        }
        write_export_info(tmp, info)
    return output


def _vocabulary_map(
    shortlist: str | Path | None, loaded: Shortlist | None, tokenizer: Tokenizer, path: Path
) -> dict[str, Any] | None:
    """Write the ``shortlist`` file (``loaded``) as a vocabulary map at ``path``; what
    ``nmt_export.json`` records of it (None without one)."""
    if shortlist is None or loaded is None:
        return None
    write_vmap(loaded, tokenizer, path)
    return {
        "file": str(Path(shortlist).resolve()),
        "sha256": file_digest(Path(shortlist)),
        "k": loaded.k,
        "frequent": loaded.frequent,
    }


def export_checkpoint(cfg: ExportCT2Config) -> Path:
    """``scripts/export_ct2.py``: check that the checkpoint's model can be exported, then export it."""
    check_quantization(cfg.quantization)
    check_output_dir(cfg.output, META_FILE, cfg.force, WRITER)
    require_ctranslate2()
    ckpt = load_checkpoint(cfg.checkpoint)
    check_exportable(checkpoint_config(ckpt).model)
    model, tokenizer, train_cfg = model_from_checkpoint(ckpt, "cpu")
    meta = {"checkpoint": str(Path(cfg.checkpoint).resolve()), "step": ckpt.get("progress", {}).get("step")}
    direction = (train_cfg.data.src_lang, train_cfg.data.tgt_lang)
    return export_model(
        model, tokenizer, cfg.output, cfg.quantization, cfg.force, meta, cfg.shortlist, direction
    )
