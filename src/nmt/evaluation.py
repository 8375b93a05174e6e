"""Checkpoint evaluation: translate a split or files with a checkpoint, score it (``nmt.metrics``), write
the hypotheses and a JSON report."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from nmt.config import (
    CompareAlignmentsConfig,
    DecodingConfig,
    EvaluateConfig,
    SplitConfig,
    TrainConfig,
    checkpoint_paths,
)
from nmt.data import SPLITS, prepare_text, read_lines
from nmt.devices import select_device
from nmt.errors import NMTError
from nmt.metrics import (
    METRICS,
    OutputStats,
    Score,
    corpus_scores,
    output_stats,
    scores_by_length,
    unknown_metrics,
)
from nmt.translator import Translator


def check_metrics(metrics: Sequence[str]) -> None:
    if unknown_metrics(metrics):
        raise NMTError(f"eval.metrics: unknown {unknown_metrics(metrics)}; choose from {sorted(METRICS)}")


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
    alignments: str | None = None  # the hypotheses' word alignments (Pharaoh), with alignments=true
    prefixes: str | None = None  # the target prefixes the hypotheses start with (prefix_file)

    def as_dict(self) -> dict:
        return asdict(self)


def evaluate_checkpoint(cfg: EvaluateConfig, out_dir: Path) -> EvalReport:
    """Translate a split (or ``eval.src``) with a checkpoint, score against the raw references, write
    the hypotheses and a JSON report.

    Decoding uses the checkpoint's ``decoding`` settings (tuned with the experiment), except those
    that ``cfg.decoding`` sets. Empty source lines get empty hypotheses, as in ``translate.py``.
    With ``prefix_file`` every hypothesis starts with its line's prefix; with ``alignments`` the word
    alignment of each hypothesis goes to a ``.align`` file beside the hypotheses.
    """
    check_metrics(cfg.eval.metrics)  # a typo must not cost a whole decode
    device = select_device(cfg.device)
    threads = (cfg.ct2_inter_threads, cfg.ct2_intra_threads)
    translator = Translator.from_checkpoint(
        cfg.checkpoint, device, cfg.backend, cfg.ct2_model, threads, workers=cfg.workers
    )
    if cfg.alignments:
        translator.require_attention("alignments=true")  # before the decode
        translator.check_alignment_layer(cfg.alignment_layer)
    decoding = translator.decoding_with(cfg.decoding)
    sources, refs, test_name = evaluation_text(cfg, translator.cfg)
    prefixes = None
    if cfg.prefix_file:
        prefixes = read_lines(Path(cfg.prefix_file))
        if len(prefixes) != len(sources):
            raise NMTError(
                f"prefix_file={cfg.prefix_file} has {len(prefixes)} lines for {len(sources)} sources: "
                "give a prefix line (empty for none) per source"
            )
    started = time.perf_counter()
    ids = translator.encode(sources)
    forced = None if prefixes is None else translator.encode_prefixes(ids, prefixes, decoding)
    hyps = translator.search(ids, decoding, progress=True, prefixes=forced)
    hyp_text = translator.best(hyps)
    elapsed = time.perf_counter() - started
    scores = corpus_scores(hyp_text, refs, cfg.eval.metrics)

    backend = "" if translator.backend.name == "torch" else f".{translator.backend.name}"
    paths = checkpoint_paths(cfg.checkpoint)
    ensemble = ensemble_tag(paths)
    listed = f".{Path(decoding.shortlist).stem}" if decoding.shortlist else ""  # not the full search's file
    stem = f"{Path(paths[0]).stem}{ensemble}.{test_name}.beam{decoding.beam_size}{listed}{backend}"
    hyp_path = Path(cfg.eval.out) if cfg.eval.out else out_dir / f"{stem}.hyp"
    hyp_path.parent.mkdir(parents=True, exist_ok=True)
    hyp_path.write_text("".join(h + "\n" for h in hyp_text), encoding="utf-8")
    if decoding.nbest > 1:
        nbest = translator.texts([h for hs in hyps for h in hs])
        (hyp_path.with_suffix(".nbest")).write_text("".join(h + "\n" for h in nbest), encoding="utf-8")
    align_path = hyp_path.with_suffix(".align") if cfg.alignments else None
    if align_path is not None:
        targets = [h[0].tokens if h else [] for h in hyps]
        aligned = translator.align(ids, targets, cfg.alignment_layer, decoding.max_tokens)
        align_path.write_text("".join(a.pharaoh() + "\n" for a in aligned), encoding="utf-8")
    out_tokens = sum(len(h[0].tokens) + 1 for h in hyps if h)
    report = EvalReport(
        checkpoint=" + ".join(str(Path(p).resolve()) for p in paths),
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
        backend=translator.backend.name,
        step=translator.step,
        outputs=output_stats(sources, hyp_text, refs),
        by_length=scores_by_length([len(s) for s in ids], hyp_text, refs, metrics=cfg.eval.metrics)
        if cfg.eval.by_length
        else None,
        alignments=str(align_path) if align_path is not None else None,
        prefixes=str(Path(cfg.prefix_file).resolve()) if cfg.prefix_file else None,
    )
    Path(report.report).write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    if cfg.eval.tb_dir:
        log_scores_to_tensorboard(
            Path(cfg.eval.tb_dir), test_name, scores, report.step or 0, report.by_length
        )
    return report


def ensemble_tag(paths: Sequence[str]) -> str:
    """``.ensemble<n>-<hash>`` for several checkpoints ("" for one): the hash of the members' resolved paths,
    in order (the first one's settings apply), keeps ensembles that share a first member apart."""
    if len(paths) == 1:
        return ""
    members = "\n".join(str(Path(p).resolve()) for p in paths)
    return f".ensemble{len(paths)}-{hashlib.sha256(members.encode()).hexdigest()[:8]}"


def report_dir(checkpoint: Path) -> Path:
    """``<run>/eval`` for ``<run>/checkpoints/x.pt``, else ``eval/`` beside the checkpoint."""
    parent = checkpoint.resolve().parent
    return (parent.parent if parent.name == "checkpoints" else parent) / "eval"


def evaluation_text(
    cfg: EvaluateConfig | SplitConfig | CompareAlignmentsConfig, train_cfg: TrainConfig
) -> tuple[list[str], list[str], str]:
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
