"""Scoring text: sacrebleu's BLEU, chrF and TER with their signatures, scores by source length, and
what is wrong with the outputs beyond the score (length, loops, copies).

A leaf: it imports nothing from ``nmt``, so validation during training, checkpoint evaluation and the
choice of the final model all score the same way without depending on each other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from sacrebleu.metrics import BLEU, CHRF, TER

METRICS = {"bleu": BLEU, "chrf": CHRF, "ter": TER}


@dataclass
class CorpusScore:
    """One metric's score of a whole corpus (sacrebleu's), with its signature."""

    name: str
    score: float
    signature: str
    text: str  # sacrebleu's own formatting, e.g. "BLEU = 35.12 66.1/41.9/28.5/19.4 (BP = ...)"

    def as_dict(self) -> dict:
        return asdict(self)


def unknown_metrics(names: Sequence[str]) -> list[str]:
    return sorted(set(names) - set(METRICS))


def corpus_scores(
    hyps: Sequence[str], refs: Sequence[str], metrics: Sequence[str] = ("bleu", "chrf")
) -> dict[str, CorpusScore]:
    """Corpus-level scores with sacrebleu's defaults (the same numbers as the ``sacrebleu`` CLI)."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if unknown_metrics(metrics):
        raise ValueError(f"unknown metrics {unknown_metrics(metrics)}; choose from {sorted(METRICS)}")
    scores = {}
    for name in metrics:
        metric = METRICS[name]()
        result = metric.corpus_score(list(hyps), [list(refs)])
        scores[name] = CorpusScore(
            name, round(float(result.score), 4), str(metric.get_signature()), str(result)
        )
    return scores


def format_scores(scores: dict[str, CorpusScore]) -> str:
    return "\n".join(f"{s.text}\n  signature: {s.signature}" for s in scores.values())


LENGTH_BUCKETS: tuple[tuple[int, int | None], ...] = ((1, 10), (11, 20), (21, 30), (31, 50), (51, None))


def scores_by_length(
    src_lengths: Sequence[int],
    hyps: Sequence[str],
    refs: Sequence[str],
    buckets: Sequence[tuple[int, int | None]] = LENGTH_BUCKETS,
    metrics: Sequence[str] = ("bleu", "chrf"),
) -> list[dict]:
    """Corpus scores of the sentences in each source-length bucket (inclusive bounds, None = no upper
    bound): where a model breaks down with length, which one corpus score hides.

    One row per bucket, ``{"bucket": "11-20", "sentences": n, "bleu": ..., "chrf": ...}``; a bucket without
    sentences keeps its row with n = 0 and no scores (None), so tables of different runs line up.
    Sentences in no bucket (e.g. empty sources when the buckets start at 1) get a last row "other",
    so the counts always add up to the corpus.
    """
    if not len(src_lengths) == len(hyps) == len(refs):
        raise ValueError(f"{len(src_lengths)} source lengths, {len(hyps)} hypotheses, {len(refs)} references")
    rows, placed = [], set()
    for low, high in buckets:
        members = [i for i, n in enumerate(src_lengths) if n >= low and (high is None or n <= high)]
        label = f"{low}-{high}" if high is not None else f"{low}+"
        rows.append(_bucket_row(label, members, hyps, refs, metrics))
        placed.update(members)
    rest = [i for i in range(len(src_lengths)) if i not in placed]
    if rest:
        rows.append(_bucket_row("other", rest, hyps, refs, metrics))
    return rows


def _bucket_row(
    label: str, members: list[int], hyps: Sequence[str], refs: Sequence[str], metrics: Sequence[str]
) -> dict:
    row: dict = {"bucket": label, "sentences": len(members)}
    scores = corpus_scores([hyps[i] for i in members], [refs[i] for i in members], metrics) if members else {}
    row.update({name: scores[name].score if members else None for name in metrics})
    return row


def format_by_length(rows: list[dict]) -> str:
    """The by-length rows as a table: source subwords, sentences, then one column per metric."""
    metrics = [key for key in rows[0] if key not in ("bucket", "sentences")]
    lines = [f"{'src len':<10}{'sentences':>10}" + "".join(f"{m:>10}" for m in metrics)]
    for row in rows:
        values = "".join(f"{row[m]:>10.2f}" if row[m] is not None else f"{'-':>10}" for m in metrics)
        lines.append(f"{row['bucket']:<10}{row['sentences']:>10}" + values)
    return "\n".join(lines)


# --------------------------------------------------------------------------------- output diagnostics
LONG = 1.5  # a hypothesis this many times longer than its reference counts as over-long


@dataclass
class OutputStats:
    """What is wrong with the outputs beyond the score: too short or long, looping, copying the source.

    Counted on whitespace words; shares are of the non-empty references' sentences (``over_long`` and
    ``over_long_looping``: hypotheses longer than ``LONG`` x their reference, and the share of those
    that repeat a word 3-gram).
    """

    length_ratio: float  # hypothesis words / reference words, over the corpus
    repeats_3gram: float  # hypotheses in which some word 3-gram occurs at least twice
    loops: float  # ... at least three times: a decoder stuck in a loop
    over_long: float
    over_long_looping: float
    source_words: float  # share of hypothesis words that also occur in their source sentence
    empty: float  # empty hypotheses

    def summary(self) -> str:
        return (
            f"outputs: length ratio {self.length_ratio:.3f}, {self.repeats_3gram:.1%} repeat a 3-gram "
            f"({self.loops:.1%} three times or more), {self.over_long:.1%} over {LONG:g}x the reference "
            f"({self.over_long_looping:.0%} of them looping), {self.source_words:.1%} of words also in "
            f"the source, {self.empty:.1%} empty"
        )


def output_stats(sources: Sequence[str], hyps: Sequence[str], refs: Sequence[str]) -> OutputStats:
    if not len(sources) == len(hyps) == len(refs):
        raise ValueError(f"{len(sources)} sources, {len(hyps)} hypotheses, {len(refs)} references")
    rows = [(set(s.split()), h.split(), r.split()) for s, h, r in zip(sources, hyps, refs) if r.strip()]
    n = max(len(rows), 1)
    most = [_most_repeated_3gram(h) for _, h, _ in rows]
    long = [i for i, (_, h, r) in enumerate(rows) if len(h) > LONG * len(r)]
    hyp_words = sum(len(h) for _, h, _ in rows)
    copied = sum(w in source for source, h, _ in rows for w in h)
    return OutputStats(
        length_ratio=hyp_words / max(sum(len(r) for _, _, r in rows), 1),
        repeats_3gram=sum(m >= 2 for m in most) / n,
        loops=sum(m >= 3 for m in most) / n,
        over_long=len(long) / n,
        over_long_looping=sum(most[i] >= 2 for i in long) / max(len(long), 1),
        source_words=copied / max(hyp_words, 1),
        empty=sum(not h for _, h, _ in rows) / n,
    )


def _most_repeated_3gram(words: list[str]) -> int:
    return max(Counter(zip(words, words[1:], words[2:])).values(), default=0)
