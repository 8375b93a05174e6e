"""Scores with sacrebleu (BLEU, chrF, TER), each with its signature, also by source length, and reports."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from sacrebleu.metrics import BLEU, CHRF, TER

from nmt.config import DecodingConfig, EvaluateConfig, TrainConfig
from nmt.data import SPLITS, prepare_text, read_lines
from nmt.devices import select_device
from nmt.errors import NMTError
from nmt.translator import Translator

METRICS = {"bleu": BLEU, "chrf": CHRF, "ter": TER}


@dataclass
class Score:
    name: str
    score: float
    signature: str
    text: str  # sacrebleu's own formatting, e.g. "BLEU = 35.12 66.1/41.9/28.5/19.4 (BP = ...)"

    def as_dict(self) -> dict:
        return asdict(self)


def check_metrics(metrics: Sequence[str]) -> None:
    unknown = sorted(set(metrics) - set(METRICS))
    if unknown:
        raise NMTError(f"eval.metrics: unknown {unknown}; choose from {sorted(METRICS)}")


def corpus_scores(
    hyps: Sequence[str], refs: Sequence[str], metrics: Sequence[str] = ("bleu", "chrf")
) -> dict[str, Score]:
    """Corpus-level scores with sacrebleu's defaults (the same numbers as the ``sacrebleu`` CLI)."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    check_metrics(metrics)
    scores = {}
    for name in metrics:
        metric = METRICS[name]()
        result = metric.corpus_score(list(hyps), [list(refs)])
        scores[name] = Score(name, round(float(result.score), 4), str(metric.get_signature()), str(result))
    return scores


def format_scores(scores: dict[str, Score]) -> str:
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


# ------------------------------------------------------------------------------- checkpoint evaluation
@dataclass
class EvalReport:
    """What ``scripts/evaluate.py`` prints and writes (``report`` is the JSON file of ``as_dict``)."""

    checkpoint: str
    test_set: str
    sentences: int
    scores: dict[str, Score]
    decoding: DecodingConfig
    hypotheses: str
    report: str
    elapsed_s: float
    sentences_per_s: float
    tokens_per_s: float
    device: str
    backend: str  # torch or ct2
    step: int | None
    outputs: OutputStats  # length, loops, copies
    by_length: list[dict] | None = None  # scores per source-length bucket (eval.by_length)

    def as_dict(self) -> dict:
        return asdict(self)


def evaluate_checkpoint(cfg: EvaluateConfig, out_dir: Path) -> EvalReport:
    """Translate a split (or ``eval.src``) with a checkpoint, score against the raw references, write
    the hypotheses and a JSON report.

    Decoding uses the checkpoint's ``decoding`` settings (tuned with the experiment), except those
    that ``cfg.decoding`` sets. Empty source lines get empty hypotheses, as in ``translate.py``.
    """
    check_metrics(cfg.eval.metrics)  # a typo must not cost a whole decode
    device = select_device(cfg.device)
    translator = Translator.from_checkpoint(cfg.checkpoint, device, cfg.backend, cfg.ct2_model)
    decoding = translator.decoding_with(cfg.decoding)
    sources, refs, test_name = evaluation_text(cfg, translator.cfg)
    started = time.perf_counter()
    ids = translator.encode(sources)
    hyps = translator.search(ids, decoding, progress=True)
    hyp_text = translator.best(hyps)
    elapsed = time.perf_counter() - started
    scores = corpus_scores(hyp_text, refs, cfg.eval.metrics)

    backend = ".ct2" if cfg.backend == "ct2" else ""
    stem = f"{Path(cfg.checkpoint).stem}.{test_name}.beam{decoding.beam_size}{backend}"
    hyp_path = Path(cfg.eval.out) if cfg.eval.out else out_dir / f"{stem}.hyp"
    hyp_path.parent.mkdir(parents=True, exist_ok=True)
    hyp_path.write_text("".join(h + "\n" for h in hyp_text), encoding="utf-8")
    if decoding.nbest > 1:
        nbest = translator.tokenizer.decode_tgt([h.tokens for hs in hyps for h in hs])
        (hyp_path.with_suffix(".nbest")).write_text("".join(h + "\n" for h in nbest), encoding="utf-8")
    out_tokens = sum(len(h[0].tokens) + 1 for h in hyps if h)
    report = EvalReport(
        checkpoint=str(Path(cfg.checkpoint).resolve()),
        test_set=test_name,
        sentences=len(sources),
        scores=scores,
        decoding=decoding,
        hypotheses=str(hyp_path),
        report=str(hyp_path.with_suffix(".json")),
        elapsed_s=round(elapsed, 3),
        sentences_per_s=round(len(sources) / elapsed, 2),
        tokens_per_s=round(out_tokens / elapsed, 1),
        device=str(device),
        backend=cfg.backend,
        step=translator.step,
        outputs=output_stats(sources, hyp_text, refs),
        by_length=scores_by_length([len(s) for s in ids], hyp_text, refs, metrics=cfg.eval.metrics)
        if cfg.eval.by_length
        else None,
    )
    Path(report.report).write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    if cfg.eval.tb_dir:
        log_scores_to_tensorboard(
            Path(cfg.eval.tb_dir), test_name, scores, report.step or 0, report.by_length
        )
    return report


def report_dir(checkpoint: Path) -> Path:
    """``<run>/eval`` for ``<run>/checkpoints/x.pt``, else ``eval/`` beside the checkpoint."""
    parent = checkpoint.resolve().parent
    return (parent.parent if parent.name == "checkpoints" else parent) / "eval"


def evaluation_text(cfg: EvaluateConfig, train_cfg: TrainConfig) -> tuple[list[str], list[str], str]:
    """Source sentences, raw references and a name for them: ``eval.src/ref`` files or a data split."""
    if cfg.eval.src or cfg.eval.ref:
        if not (cfg.eval.src and cfg.eval.ref):
            raise NMTError("eval.src and eval.ref must be given together")
        sources, refs = read_lines(Path(cfg.eval.src)), read_lines(Path(cfg.eval.ref))
        if len(sources) != len(refs):
            raise NMTError(
                f"line counts differ: {cfg.eval.src} has {len(sources)} lines, {cfg.eval.ref} has {len(refs)}"
            )
        return sources, refs, Path(cfg.eval.src).stem
    data_cfg = train_cfg.data
    if cfg.data.dir is not None:
        data_cfg.dir = cfg.data.dir
    if cfg.data.cache_dir is not None:
        data_cfg.cache_dir = cfg.data.cache_dir
    if cfg.data.split not in SPLITS:
        raise NMTError(
            f"data.split={cfg.data.split!r}: choose one of {list(SPLITS)} or give eval.src/eval.ref"
        )
    root = prepare_text(data_cfg, progress=True)
    sources = read_lines(root / f"{cfg.data.split}.{data_cfg.src_lang}")
    refs = read_lines(root / f"{cfg.data.split}.{data_cfg.tgt_lang}")
    return sources, refs, cfg.data.split


def log_scores_to_tensorboard(
    run_dir: Path, test_name: str, scores: dict[str, Score], step: int, by_length: list[dict] | None = None
) -> None:
    """Scalars ``eval_{test}/{metric}``, plus ``eval_{test}/{metric}_len_{bucket}`` per by-length row."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(run_dir / "tb")) as writer:
        for name, s in scores.items():
            writer.add_scalar(f"eval_{test_name}/{name}", s.score, step)
            writer.add_text(f"eval_{test_name}/{name}_signature", s.signature, step)
        for row in by_length or []:
            for name in scores:
                if row[name] is not None:
                    writer.add_scalar(f"eval_{test_name}/{name}_len_{row['bucket']}", row[name], step)
