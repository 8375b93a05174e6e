"""Scoring given translations with a checkpoint (``scripts/score.py``): the model's log-probability of
each translation of each source under teacher forcing, one forward pass per batch instead of a search.

What it is for: rescoring another system's output or n-best list, checking references for lines the
model finds unlikely (misalignments, noise), comparing an edited translation with the search's.
Each line gets the log-probability of the translation's subwords and EOS, the search's ranking score
of it (``log P / ((5 + n) / 6) ** alpha + word_reward * n``, the score ``translate.py`` n-best lists
and the service show, with the checkpoint's or the given ``decoding.alpha``/``decoding.word_reward``)
and its length n in subwords (``tokens``, EOS included); ``per_token`` adds each subword's log-probability.
With ``decoding.shortlist``, the log-probabilities are normalised as the search over that shortlist
normalises them (over each sentence's candidates and the translation's own subwords), so that they
compare with the search's.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from nmt.config import ScoreConfig
from nmt.devices import select_device
from nmt.evaluation.evaluate import evaluation_text
from nmt.inference.translator import ScoredTranslation, Translator, WordAlignment


@dataclass
class ScoreRun:
    """What scripts/score.py prints: every pair's score, and where and how fast they were computed."""

    scores: list[ScoredTranslation]
    alignments: list[WordAlignment] | None  # with cfg.alignments
    test_set: str
    backend: str
    elapsed_s: float

    def summary(self) -> str:
        """One line: the corpus means (per sentence, and per subword as a perplexity) and the speed."""
        n = len(self.scores)
        if not n:
            return f"{self.test_set}: no sentences"
        tokens = sum(s.tokens for s in self.scores)
        log_prob = sum(s.log_prob for s in self.scores)
        return (
            f"{self.test_set}: {n} sentences, mean log P {log_prob / n:.4f}, "
            f"mean score {sum(s.score for s in self.scores) / n:.4f}, "
            f"{log_prob / tokens:.4f} per subword (perplexity {math.exp(-log_prob / tokens):.2f}), "
            f"{tokens} subwords in {self.elapsed_s:.2f} s ({n / max(self.elapsed_s, 1e-9):.1f} sent/s, "
            f"backend {self.backend})"
        )


def score_corpus(cfg: ScoreConfig) -> ScoreRun:
    """Score ``eval.ref`` as the translations of ``eval.src`` (or a data split's references) with
    ``cfg.checkpoint`` (an ensemble, the ct2 backend)."""
    translator = Translator.from_checkpoint(
        cfg.checkpoint, select_device(cfg.device), cfg.backend, cfg.ct2_model
    )
    decoding = translator.decoding_with(cfg.decoding)
    if cfg.alignments:
        translator.check_alignment_layer(cfg.alignment_layer)  # before the corpus is read and scored
    sources, targets, name = evaluation_text(cfg, translator.cfg)
    if cfg.alignments:
        translator.require_attention("alignments=true")
    started = time.perf_counter()
    scores = translator.score(sources, targets, decoding, progress=True)
    elapsed = time.perf_counter() - started
    alignments = None
    if cfg.alignments:
        src_ids, tgt_ids = translator.encode(sources), translator.encode_targets(targets)
        alignments = translator.align(src_ids, tgt_ids, cfg.alignment_layer, decoding.max_tokens)
    return ScoreRun(scores, alignments, name, translator.backend.name, elapsed)


def format_score(
    score: ScoredTranslation, fmt: str, per_token: bool, alignment: WordAlignment | None = None
) -> str:
    """One output line: ``log_prob<TAB>score<TAB>tokens``, then ``<TAB>piece=log_prob ...`` per subword
    (EOS last, as ``</s>``) with ``per_token`` and ``<TAB>i-j ...`` with an alignment; or a JSON object
    with those keys (``pieces`` and ``token_log_probs``, ``alignment``)."""
    if fmt == "json":
        record: dict = {"log_prob": score.log_prob, "score": score.score, "tokens": score.tokens}
        if per_token:
            record |= {"pieces": score.pieces, "token_log_probs": score.token_log_probs}
        if alignment is not None:
            record["alignment"] = alignment.pharaoh()
        return json.dumps(record, ensure_ascii=False)
    fields = [f"{score.log_prob:.6f}", f"{score.score:.6f}", str(score.tokens)]
    if per_token:
        fields.append(" ".join(f"{p}={lp:.6f}" for p, lp in zip(score.pieces, score.token_log_probs)))
    if alignment is not None:
        fields.append(alignment.pharaoh())
    return "\t".join(fields)


def format_scores(run: ScoreRun, fmt: str, per_token: bool) -> str:
    alignments: Sequence[WordAlignment | None] = run.alignments or [None] * len(run.scores)
    return "".join(format_score(s, fmt, per_token, a) + "\n" for s, a in zip(run.scores, alignments))
