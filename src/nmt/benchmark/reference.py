"""The plain PyTorch reference the training step is timed against, and the FLOPs of a step.

Model FLOPs follow PaLM's MFU convention (useful work only; attention counted in full where the
causal mask skips half; padding not counted): for s source and t target tokens, N_enc/N_dec the
non-embedding parameters and L_enc/L_dec the layers of encoder/decoder, d = d_model, V the target
vocabulary: ``6 * (N_enc * s + (N_dec + d * V) * t) + 12 * d * (L_enc * s * s + L_dec * t * (t + s))``.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.config import TrainConfig, TransformerConfig
from nmt.data import Batch
from nmt.devices import autocast
from nmt.models import Transformer
from nmt.models.transformer import sinusoidal_table
from nmt.text.special import PAD_ID
from nmt.training.setup import make_optimizer


def transformer_flops(model: Transformer, batch: Batch) -> float:
    """Model FLOPs of one training step on ``batch`` (the formula above)."""

    def params(*modules: nn.Module) -> int:
        return sum(p.numel() for m in modules for p in m.parameters())

    n_enc, n_dec = params(model.encoder, model.enc_norm), params(model.decoder, model.dec_norm)
    vocab, d = model.output.weight.shape
    s = batch.src.ne(PAD_ID).sum(dim=1).double()
    t = batch.tgt_out.ne(PAD_ID).sum(dim=1).double()
    dense = 6 * (n_enc * s.sum() + (n_dec + d * vocab) * t.sum())
    attention = 12 * d * (len(model.encoder) * (s * s).sum() + len(model.decoder) * (t * (t + s)).sum())
    return float(dense + attention)


class ReferenceTransformer(nn.Module):
    """``torch.nn.Transformer`` dressed like the project's model: scaled embeddings plus positions,
    embeddings tied as configured, dropout only where the project has it, logits at every position."""

    def __init__(self, cfg: TransformerConfig, src_vocab: int, tgt_vocab: int, joint_vocab: bool):
        super().__init__()
        d = cfg.d_model
        self.scale = math.sqrt(d)
        self.src_tokens = nn.Embedding(src_vocab, d, padding_idx=PAD_ID)
        tie = cfg.share_embeddings and joint_vocab
        self.tgt_tokens = self.src_tokens if tie else nn.Embedding(tgt_vocab, d, padding_idx=PAD_ID)
        for emb in (self.src_tokens, self.tgt_tokens):
            nn.init.normal_(emb.weight, std=d**-0.5)
        if cfg.positional == "learned":
            self.positions: nn.Module | None = nn.Embedding(cfg.max_positions, d)
        else:
            self.positions = None
            self.register_buffer("table", sinusoidal_table(cfg.max_positions, d), persistent=False)
        self.dropout = nn.Dropout(cfg.dropout)
        with warnings.catch_warnings():  # nested-tensor fast path notice (inference only anyway)
            warnings.simplefilter("ignore", UserWarning)
            self.transformer = nn.Transformer(
                d,
                cfg.heads,
                cfg.encoder_layers,
                cfg.decoder_layers,
                cfg.ff_dim,
                cfg.dropout,
                batch_first=True,
                norm_first=cfg.norm_first,
            )
        # nn.Transformer applies `dropout` to attention weights and hidden activations too; the project
        # has separate (default 0) rates there, so match them or the reference does extra work.
        for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
            layer.dropout.p = cfg.activation_dropout
            for attn in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                if attn is not None:
                    attn.dropout = cfg.attention_dropout
        self.output = nn.Linear(d, tgt_vocab, bias=False)
        if cfg.share_embeddings:
            self.output.weight = self.tgt_tokens.weight

    def embed(self, tokens: nn.Embedding, ids: Tensor) -> Tensor:
        span = torch.arange(ids.size(1), device=ids.device)
        pos = self.positions(span) if self.positions is not None else self.table[: ids.size(1)]
        return self.dropout(tokens(ids) * self.scale + pos)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        pad = src.eq(PAD_ID)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1), device=src.device)
        x = self.transformer(
            self.embed(self.src_tokens, src),
            self.embed(self.tgt_tokens, tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=pad,
            memory_key_padding_mask=pad,
            tgt_is_causal=True,
        )
        return self.output(x)


class ReferenceTrainer:
    """One optimizer update of the reference: same loss, normalisation, clipping and optimizer as
    ``train_step`` (label-smoothed cross entropy summed over non-pad targets / target tokens)."""

    def __init__(self, cfg: TrainConfig, vocab: dict[str, int], joint_vocab: bool, device: torch.device):
        self.model = (
            ReferenceTransformer(cfg.model, vocab["src"], vocab["tgt"], joint_vocab).to(device).train()
        )
        self.optimizer = make_optimizer(self.model, cfg)
        self.cfg, self.device = cfg, device

    def step(self, batch: Batch, precision: str, scaler: torch.amp.GradScaler) -> None:
        with autocast(self.device, precision):
            logits = self.model(batch.src, batch.tgt_in)
            loss = F.cross_entropy(
                logits.flatten(0, 1).float(),
                batch.tgt_out.flatten(),
                ignore_index=PAD_ID,
                label_smoothing=self.cfg.optim.label_smoothing,
                reduction="sum",
            )
        scaler.scale(loss / batch.tgt_tokens).backward()
        scaler.unscale_(self.optimizer)
        clip = self.cfg.optim.clip_norm if self.cfg.optim.clip_norm > 0 else math.inf
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        scaler.step(self.optimizer)
        scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
