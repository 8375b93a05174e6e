"""Helpers shared by the unit tests (fixtures live in conftest.py):

- tiny randomly initialised models (seeded): a width-16 Transformer of any variant and a small RNNsearch,
  each in eval mode;
- a task any tiny model learns in seconds: copy the source (random ids, UNK included), for the tests that
  need a model with real preferences (some sentences right, some wrong) without a data pipeline;
- a small SentencePiece model with our special ids, trained in memory on random text (the exporters' tests).
"""

from __future__ import annotations

import io
import random

import sentencepiece as spm
import torch

from nmt.config import RNNSearchConfig, TransformerConfig, knobs_of
from nmt.decoding import pad_batch
from nmt.models import Seq2Seq, Transformer, build_model
from nmt.text.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID


# ------------------------------------------------------------------------------------- tiny models
def tiny_transformer(vocab: int, seed: int, **settings) -> Transformer:
    """A width-16, one-layer Transformer without dropout; ``settings`` change any TransformerConfig key."""
    torch.manual_seed(seed)
    base = dict(
        d_model=16, ff_dim=32, heads=2, encoder_layers=1, decoder_layers=1, dropout=0.0, max_positions=32
    )
    return Transformer(TransformerConfig(**{**base, **settings}), vocab, vocab, joint_vocab=True).eval()


def tiny_rnnsearch(vocab: int, seed: int) -> Seq2Seq:
    torch.manual_seed(seed)
    cfg = RNNSearchConfig(
        embed_dim=16, hidden_size=24, attention_dim=20, readout_dim=12, dropout=0.0, max_positions=32
    )
    return build_model(cfg, vocab, vocab, joint_vocab=True).eval()


# --------------------------------------------------------------------------------- the copy task
def copy_sentences(count: int, vocab: int, seed: int, min_len: int = 2, max_len: int = 9) -> list[list[int]]:
    """``count`` sentences of ordinary ids and UNK, of ``min_len`` to ``max_len`` tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (count,), generator=g).tolist()
    words = [torch.randint(EOS_ID, vocab, (n,), generator=g) for n in lengths]
    return [w.masked_fill(w.eq(EOS_ID), UNK_ID).tolist() for w in words]


def train_to_copy(model: Seq2Seq, vocab: int, steps: int, lr: float = 3e-3) -> Seq2Seq:
    """``steps`` teacher-forced Adam updates on batches of 32 copy pairs; returns the model in eval mode."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for step in range(steps):
        src = tgt_out = pad_batch(copy_sentences(32, vocab, seed=step), "cpu")
        tgt_in = torch.cat([torch.full((src.size(0), 1), BOS_ID), tgt_out[:, :-1]], dim=1)
        tgt_in[tgt_in == EOS_ID] = PAD_ID
        target_mask = tgt_out.ne(PAD_ID)
        loss = torch.nn.functional.cross_entropy(model(src, tgt_in, target_mask), tgt_out[target_mask])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


# ----------------------------------------------------------------------------------- SentencePiece
def sentencepiece_model(seed: int, vocab_size: int) -> tuple[bytes, list[str]]:
    """A small BPE model with our special ids, and the text it was trained on."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklm") for _ in range(rng.randint(2, 7))) for _ in range(80)]
    text = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(300)]
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text),
        model_writer=proto,
        vocab_size=vocab_size,
        model_type="bpe",
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        minloglevel=2,
    )
    return proto.getvalue(), text


def random_model(cfg: TransformerConfig, tokenizer, seed: int = 0) -> Transformer:
    """Random weights, layer norms and biases included (initialised to 1 and 0), so an export's mapping of
    every one is checked."""
    torch.manual_seed(seed)
    model = Transformer(cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.joint)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.normal_(1.0, 0.2)
                module.bias.normal_(0.0, 0.2)
            elif isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(0.0, 0.2)
    return model.eval()


def knob_rules(config: type) -> dict:
    """The rule of each setting of ``config`` that has one (its knob's, inherited ones included)."""
    return {name: meta["rule"] for name, meta in knobs_of(config).items()}
