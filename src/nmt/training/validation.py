"""Validation during training: teacher-forced loss and perplexity on the valid split, and BLEU/chrF of
a greedy (or small-beam) decode of its first sentences, through the same search as inference."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from nmt.config import HIGHER_IS_BETTER, TrainConfig
from nmt.data import PreparedData, TokenBatchSampler, clipped_lengths, collate
from nmt.decoding import translate_ids
from nmt.devices import autocast
from nmt.metrics import corpus_scores
from nmt.models import Seq2Seq
from nmt.training.loss import batch_loss


@torch.no_grad()
def validate(model: Seq2Seq, data: PreparedData, cfg: TrainConfig, device, precision) -> Validation:
    """Teacher-forced loss/perplexity on the whole valid split, greedy BLEU/chrF on its first sentences."""
    model.eval()
    split = data.splits["valid"]
    sampler = TokenBatchSampler(
        *clipped_lengths(split, cfg.model.max_positions), cfg.trainer.max_tokens, shuffle=False
    )
    nll, tokens = 0.0, 0
    for idx in sampler:
        batch = collate(split, idx, cfg.model.max_positions).to(device)
        with autocast(device, precision):
            nll += batch_loss(model, batch, 0.0)[1].item()
        tokens += batch.tgt_tokens
    n = (
        len(split)
        if cfg.trainer.valid_bleu_sentences <= 0
        else min(len(split), cfg.trainer.valid_bleu_sentences)
    )
    sources = [split.src(i) for i in range(n)]
    decoding = dataclasses.replace(cfg.decoding, beam_size=cfg.trainer.valid_beam_size, nbest=1)
    with autocast(device, precision):
        hyps = translate_ids(model, sources, decoding, device, cfg.model.max_positions)
    hyp_text = data.tokenizer.decode_tgt([h[0].tokens for h in hyps])
    src_text, ref_text = (side[:n] for side in data.raw("valid"))
    scores = corpus_scores(hyp_text, ref_text)
    model.train()
    metrics = {
        "loss": nll / max(tokens, 1),
        "ppl": math.exp(min(nll / max(tokens, 1), 50)),
        "bleu": scores["bleu"].score,
        "chrf": scores["chrf"].score,
    }
    first = (sources[0][: cfg.model.max_positions - 1], hyps[0][0].tokens)  # the source as decoded
    return Validation(metrics, list(zip(src_text, ref_text, hyp_text)), first)


@dataclass
class Validation:
    metrics: dict[str, float]
    examples: list[tuple[str, str, str]]  # (source, reference, hypothesis) of the decoded sentences
    first: tuple[list[int], list[int]]  # source and hypothesis ids of the first one (attention image)


def is_better(value: float, best: float | None, metric: str) -> bool:
    if best is None:
        return True
    return value > best if HIGHER_IS_BETTER[metric] else value < best
