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
    metrics = {"loss": nll / max(tokens, 1), "ppl": math.exp(min(nll / max(tokens, 1), 50))}
    first_n = cfg.trainer.valid_bleu_sentences
    groups = data.group_ranges("valid") if data.multilingual else [range(len(split))]
    src_text, ref_text = data.raw("valid")
    examples, first, per_direction = [], None, []
    for rows in groups:
        rows = rows if first_n <= 0 else rows[:first_n]
        sources = [split.src(i) for i in rows]
        decoding = dataclasses.replace(cfg.decoding, beam_size=cfg.trainer.valid_beam_size, nbest=1)
        with autocast(device, precision):
            hyps = translate_ids(model, sources, decoding, device, cfg.model.max_positions)
        hyp_text = data.tokenizer.decode_tgt([h[0].tokens for h in hyps])
        scores = corpus_scores(hyp_text, [ref_text[i] for i in rows])
        per_direction.append((scores["bleu"].score, scores["chrf"].score))
        examples += list(zip([src_text[i] for i in rows], [ref_text[i] for i in rows], hyp_text))
        if first is None and sources:  # the source as decoded
            first = (sources[0][: cfg.model.max_positions - 1], hyps[0][0].tokens)
    model.train()
    metrics.update(direction_metrics(data.directions, per_direction))
    return Validation(metrics, examples, first)


def direction_metrics(directions: list[tuple[str, str]], scores: list[tuple[float, float]]) -> dict:
    """BLEU and chrF: of the one direction, or the mean over several (unweighted: each direction counts
    alike, whatever its size), then each direction's as ``bleu/en-de``, ``chrf/en-de``."""
    metrics = {
        "bleu": sum(b for b, _ in scores) / len(scores),
        "chrf": sum(c for _, c in scores) / len(scores),
    }
    for (src, tgt), (bleu, chrf) in zip(directions, scores):
        metrics[f"bleu/{src}-{tgt}"], metrics[f"chrf/{src}-{tgt}"] = bleu, chrf
    return metrics


def direction_table(metrics: dict) -> list[str]:
    """The valid table's rows of a multilingual run: one per direction (none for a bilingual run)."""
    names = [key.split("/", 1)[1] for key in metrics if key.startswith("bleu/")]
    return [
        f"  {name.replace('-', '->'):<12} BLEU {metrics['bleu/' + name]:6.2f}  "
        f"chrF {metrics['chrf/' + name]:6.2f}"
        for name in names
    ]


@dataclass
class Validation:
    metrics: dict[str, float]
    examples: list[tuple[str, str, str]]  # (source, reference, hypothesis) of the decoded sentences
    first: tuple[list[int], list[int]]  # source and hypothesis ids of the first one (attention image)


def is_better(value: float, best: float | None, metric: str) -> bool:
    if best is None:
        return True
    return value > best if HIGHER_IS_BETTER[metric] else value < best
