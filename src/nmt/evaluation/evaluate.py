"""Checkpoint evaluation: translate a split or files with a checkpoint, score it (``nmt.metrics``), write
the hypotheses and a JSON report."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from nmt.config import (
    CompareAlignmentsConfig,
    DataConfig,
    DecodingConfig,
    EvaluateConfig,
    SplitConfig,
    TrainConfig,
    check_values,
    checkpoint_paths,
    corpus_configs,
)
from nmt.data import SPLITS, describe_source, prepare_text, read_lines, read_text
from nmt.devices import select_device
from nmt.errors import NMTError, count_mismatch
from nmt.inference.translator import Hypothesis, Translations, Translator, trained_directions
from nmt.metrics import CorpusScore, OutputStats, corpus_scores, output_stats, scores_by_length
from nmt.outputs import check_output_file


@dataclass
class EvalReport:
    """What ``scripts/evaluate.py`` prints and writes (``report`` is the JSON file of ``as_dict``)."""

    checkpoint: str
    test_set: str
    sentences: int
    scores: dict[str, CorpusScore]
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
    ct2_model: str | None = None  # the CTranslate2 model directory that decoded (backend=ct2)
    nbest: str | None = None  # the n-best lists (decoding.nbest > 1): ``id ||| text ||| score`` lines
    corpus: str | None = None  # the data a split came from (its hub dataset and commit); None for eval.src
    pivot: str | None = None  # translated through a pivot language (pivot=): "de->en->fr"

    def as_dict(self) -> dict:
        return asdict(self)


def evaluate_checkpoint(cfg: EvaluateConfig, out_dir: Path) -> EvalReport:
    """Translate a split (or ``eval.src``) with a checkpoint, score against the raw references, write the
    hypotheses and a JSON report. Decoding uses the checkpoint's ``decoding`` settings (tuned with the
    experiment), except those that ``cfg.decoding`` sets. Empty source lines get empty hypotheses, as in
    ``translate.py``. With ``prefix_file`` every hypothesis starts with its line's prefix; with
    ``alignments`` the word alignment of each hypothesis goes to a ``.align`` file beside them."""
    check_values(cfg.eval, "eval.")  # as a script checks it at start: a typo must not cost a whole decode
    check_eval_out(cfg)
    device = select_device(cfg.device)
    translator = evaluation_translator(cfg, device)
    direction, route = evaluated_direction(translator, cfg)
    if route:
        cfg = dataclasses.replace(cfg, pivot=route[1])  # the model's own code, in the files' names
    decoding = translator.decoding_with(cfg.decoding)
    sources, refs, test_name = evaluation_text(
        cfg, translator.cfg, direction if translator.multilingual else None
    )
    prefixes = read_prefixes(cfg, len(sources))
    started = time.perf_counter()
    ids, done = evaluation_translations(translator, sources, decoding, route, prefixes)
    hyps, hyp_text = done.nbest, done.texts
    elapsed = time.perf_counter() - started
    scores = corpus_scores(hyp_text, refs, cfg.eval.metrics)

    paths = checkpoint_paths(cfg.checkpoint)
    stem = output_stem(cfg, paths, test_name, decoding, translator.cfg.decoding, (sources, refs))
    hyp_path = Path(cfg.eval.out) if cfg.eval.out else out_dir / f"{stem}.hyp"
    align_path = write_outputs(cfg, translator, done, decoding, hyp_path)
    out_tokens = sum(len(h[0].tokens) + 1 for h in hyps if h)
    report = EvalReport(
        checkpoint=" + ".join(str(Path(p).resolve()) for p in paths),
        test_set=test_name,
        corpus=None if cfg.eval.src else describe_source(translator.cfg.data),
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
        by_length=length_scores(cfg, ids, hyp_text, refs),
        alignments=str(align_path) if align_path is not None else None,
        prefixes=str(Path(cfg.prefix_file).resolve()) if cfg.prefix_file else None,
        ct2_model=str(Path(cfg.ct2_model).resolve()) if cfg.backend == "ct2" and cfg.ct2_model else None,
        nbest=str(hyp_path.with_suffix(".nbest")) if decoding.nbest > 1 else None,
        pivot="->".join(route) if route else None,
    )
    Path(report.report).write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    if cfg.eval.tb_dir:
        log_scores_to_tensorboard(
            Path(cfg.eval.tb_dir), test_name, scores, report.step or 0, report.by_length
        )
    return report


def evaluated_direction(
    translator: Translator, cfg: EvaluateConfig
) -> tuple[tuple[str, str], tuple[str, str, str] | None]:
    """The direction evaluated, and its route through the pivot language (``pivot=``), if any."""
    if not cfg.pivot:
        return translator.direction(cfg.tgt_lang, cfg.src_lang, cfg.zero_shot), None
    route = pivot_route(translator, cfg)
    return (route[0], route[2]), route


def evaluation_translations(
    translator: Translator,
    sources: list[str],
    decoding: DecodingConfig,
    route: tuple[str, str, str] | None,
    prefixes: list[str] | None,
) -> tuple[list[list[int]], Translations]:
    """The source ids and the translations: one search, or two through a pivot (``route``)."""
    if route:
        return pivot_translations(translator, sources, decoding, route, prefixes)
    done = translator.translations(sources, decoding, progress=True, prefixes=prefixes)
    return done.sources, done


def pivot_route(translator: Translator, cfg: EvaluateConfig) -> tuple[str, str, str]:
    """(source, pivot, target) of ``pivot=``: the direction named in full, both legs trained (else
    ``zero_shot``), the codes as the model has them; each refusal one line."""
    if not translator.multilingual:
        raise NMTError(f"pivot={cfg.pivot}: the model is bilingual (one direction): nothing to pivot through")
    if not (cfg.src_lang and cfg.tgt_lang):
        raise NMTError(f"pivot={cfg.pivot}: name the direction it stands between, src_lang= and tgt_lang=")
    if cfg.alignments:
        raise NMTError(
            f"pivot={cfg.pivot} with alignments=true: two searches leave no one attention from the source "
            "to the translation; leave one out"
        )
    pivot = translator.choose_target(cfg.pivot, cfg.src_lang, cfg.zero_shot)
    target = translator.choose_target(cfg.tgt_lang, pivot, cfg.zero_shot)
    if pivot in (cfg.src_lang, target):
        raise NMTError(f"pivot={cfg.pivot}: the pivot must differ from src_lang and tgt_lang")
    return cfg.src_lang, pivot, target


def pivot_translations(
    translator: Translator,
    sources: list[str],
    decoding: DecodingConfig,
    route: tuple[str, str, str],
    prefixes: list[str] | None,
) -> tuple[list[list[int]], Translations]:
    """``sources`` translated into the pivot, and that into the target: two searches with the same
    settings (``route`` checked by :func:`pivot_route`). The ids are the sources' (the first search's
    input), the translations the second's."""
    source, pivot, target = route
    translator.choose_target(pivot, source, zero_shot=True)
    first = translator.translations(sources, decoding, progress=True)
    translator.choose_target(target, pivot, zero_shot=True)
    return first.sources, translator.translations(first.texts, decoding, progress=True, prefixes=prefixes)


def evaluation_translator(cfg: EvaluateConfig, device: torch.device) -> Translator:
    """The checkpoint's Translator on ``device``; with ``alignments``, checked before the decode that
    it has the attention and the layer they are read from."""
    threads = (cfg.ct2_inter_threads, cfg.ct2_intra_threads)
    translator = Translator.from_checkpoint(
        cfg.checkpoint, device, cfg.backend, cfg.ct2_model, threads, workers=cfg.workers
    )
    if cfg.alignments:
        translator.require_attention("alignments=true")  # before the decode
        translator.check_alignment_layer(cfg.alignment_layer)
    return translator


def read_prefixes(cfg: EvaluateConfig, sources: int) -> list[str] | None:
    """The lines of ``prefix_file``, one per source line (None without one)."""
    if not cfg.prefix_file:
        return None
    prefixes = read_lines(Path(cfg.prefix_file))
    if mismatch := count_mismatch(len(prefixes), sources, "lines", "source"):
        raise NMTError(f"prefix_file={cfg.prefix_file} has {mismatch} (an empty line for none)")
    return prefixes


def write_outputs(
    cfg: EvaluateConfig, translator: Translator, done: Translations, decoding: DecodingConfig, hyp_path: Path
) -> Path | None:
    """Write the hypotheses to ``hyp_path``, the n-best lists beside them (``decoding.nbest`` > 1) and,
    with ``alignments``, their word alignments; the alignments' path, or None."""
    hyp_path.parent.mkdir(parents=True, exist_ok=True)
    hyp_path.write_text("".join(h + "\n" for h in done.texts), encoding="utf-8")
    if decoding.nbest > 1:
        write_nbest(hyp_path.with_suffix(".nbest"), done.nbest, translator)
    if not cfg.alignments:
        return None
    if cfg.alignment_layer is None:
        align_path = hyp_path.with_suffix(".align")
    else:  # another layer, other alignments: a file of their own
        align_path = hyp_path.with_suffix(f".layer{cfg.alignment_layer}.align")
    aligned = translator.align(done.sources, done.best_tokens, cfg.alignment_layer, decoding.max_tokens)
    align_path.write_text("".join(a.pharaoh() + "\n" for a in aligned), encoding="utf-8")
    return align_path


def length_scores(
    cfg: EvaluateConfig, ids: list[list[int]], hyp_text: list[str], refs: list[str]
) -> list[dict] | None:
    """The scores per source-length bucket, with ``eval.by_length``."""
    if not cfg.eval.by_length:
        return None
    return scores_by_length([len(s) for s in ids], hyp_text, refs, metrics=cfg.eval.metrics)


def output_stem(
    cfg: EvaluateConfig,
    paths: Sequence[str],
    test_name: str,
    decoding: DecodingConfig,
    checkpoint_decoding: DecodingConfig,
    text: tuple[list[str], list[str]],
) -> str:
    """The name of an evaluation's files: ``<checkpoint>[.ensemble<n>-<hash>].<test>.beam<k>`` followed by
    what else changes the output, so that no evaluation overwrites another of other settings:

    - each decoding setting that differs from the checkpoint's own (``.alpha1``, ``.nbest3``,
      ``.no_repeat_ngram3``, ``.no_unk1``, ``.word_reward-0.5``, ...; speed-only settings are left out);
    - the shortlist's file name (``.shortlist.k10.n100``);
    - ``.prefix-<hash>``: the target prefixes (``prefix_file``), by content;
    - the backend besides torch, after its model directory (``.ct2``, ``.ct2-int8``);
    - ``.pivot-en``: translated through a pivot language (``pivot=``);
    - for ``eval.src``/``eval.ref``, the test name is the source file's stem and a hash of both files'
      text (``newstest-1a2b3c4d``), so that it never takes a data split's name.

    The checkpoint's own settings keep the plain name (``best.test.beam5``). The report (JSON) records
    every setting."""
    changed = "".join(
        f".{f.name}{setting_text(getattr(decoding, f.name))}"
        for f in dataclasses.fields(DecodingConfig)
        if f.name != "beam_size"
        and not f.metadata["speed_only"]
        and getattr(decoding, f.name) != getattr(checkpoint_decoding, f.name)
    )
    listed = f".{Path(decoding.shortlist).stem}" if decoding.shortlist else ""  # not the full search's file
    prefixes = f".prefix-{short_hash(Path(cfg.prefix_file).read_bytes())}" if cfg.prefix_file else ""
    backend = ""
    if cfg.backend != "torch":
        model = Path(cfg.ct2_model or "").resolve().name
        backend = f".{model}" if model.startswith(cfg.backend) else f".{cfg.backend}-{model}"
    if cfg.eval.src:
        sources, refs = text
        test_name = f"{test_name}-{short_hash(json.dumps([sources, refs]).encode())}"
    pivot = f".pivot-{cfg.pivot}" if cfg.pivot else ""
    settings = f"{changed}{listed}{prefixes}{backend}{pivot}"
    if len(settings) > 120:  # a file name has at most 255 bytes
        settings = f".settings-{short_hash(settings.encode())}"
    return f"{Path(paths[0]).stem}{ensemble_tag(paths)}.{test_name}.beam{decoding.beam_size}{settings}"


def setting_text(value: object) -> str:
    """A decoding setting's value in a file name: numbers short (``1``, ``0.6``, ``1e-05``), booleans 0/1."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def short_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:8]


def write_nbest(path: Path, hyps: list[list[Hypothesis]], translator: Translator) -> None:
    """The n-best lists, a hypothesis per line, best first: ``id ||| text ||| score``, where ``id`` is the
    sentence's line number from 0 (Moses' n-best layout, without its feature scores). A sentence has up
    to ``nbest`` lines, an empty source none; ``score`` is the search's ranking score (length-normalised
    log-probability, plus the word reward)."""
    lines = [
        f"{i} ||| {text} ||| {h.score:.6f}\n"
        for i, hs in enumerate(hyps)
        for h, text in zip(hs, translator.texts(hs))
    ]
    path.write_text("".join(lines), encoding="utf-8")


def ensemble_tag(paths: Sequence[str]) -> str:
    """``.ensemble<n>-<hash>`` for several checkpoints ("" for one): the hash of the members' resolved paths,
    in order (the first one's settings apply), keeps ensembles that share a first member apart."""
    if len(paths) == 1:
        return ""
    members = "\n".join(str(Path(p).resolve()) for p in paths)
    return f".ensemble{len(paths)}-{hashlib.sha256(members.encode()).hexdigest()[:8]}"


def check_eval_out(cfg: EvaluateConfig) -> None:
    """Refuse, before the decode, an ``eval.out`` (or the report, n-best or alignment file beside it)
    that is one of the files it is made from, or that cannot be written."""
    if not cfg.eval.out:
        return
    inputs = {
        "eval.src": cfg.eval.src,
        "eval.ref": cfg.eval.ref,
        "checkpoint": checkpoint_paths(cfg.checkpoint),
        "prefix_file": cfg.prefix_file,
    }
    out = Path(cfg.eval.out)
    for path in (out, out.with_suffix(".json"), out.with_suffix(".nbest"), out.with_suffix(".align")):
        check_output_file(path, inputs, "eval.out" if path == out else f"eval.out's {path.suffix}", True)


def report_dir(checkpoint: Path) -> Path:
    """``<run>/eval`` for ``<run>/checkpoints/x.pt``, else ``eval/`` beside the checkpoint."""
    parent = checkpoint.resolve().parent
    return (parent.parent if parent.name == "checkpoints" else parent) / "eval"


def own_reports(checkpoint: Path, split: str) -> list[dict]:
    """The reports of ``scripts/evaluate.py`` on ``split`` with the checkpoint's own decoding settings (the
    plain-named ``<checkpoint>.<split>.beam<k>.json`` of its run, or a multilingual model's
    ``<checkpoint>.<split>.<src>-<tgt>.beam<k>.json``, one per direction) that name this very file (their
    ``step`` says which weights the file held then)."""
    stem, name = re.escape(checkpoint.stem), re.escape(split)
    plain = re.compile(rf"{stem}\.{name}(\.[^.]+-[^.]+)?\.beam\d+\.json")
    reports = []
    for path in sorted(report_dir(checkpoint).glob(f"{checkpoint.stem}.{split}.*beam*.json")):
        if plain.fullmatch(path.name):
            report = json.loads(path.read_text())
            if report.get("checkpoint") == str(checkpoint.resolve()) and "scores" in report:
                reports.append(report)
    return reports


def run_file(checkpoint: Path, kind: str, settings: object, suffix: str) -> Path:
    """``<run>/eval/<checkpoint>.<kind>-<hash>.<suffix>``: a file made from a checkpoint with ``settings``
    (anything JSON can write), in the checkpoint's run, named apart from those of other settings."""
    digest = short_hash(json.dumps(settings, sort_keys=True).encode())
    return report_dir(checkpoint) / f"{checkpoint.stem}.{kind}-{digest}{suffix}"


def evaluation_text(
    cfg: EvaluateConfig | SplitConfig | CompareAlignmentsConfig,
    train_cfg: TrainConfig,
    direction: tuple[str, str] | None = None,
) -> tuple[list[str], list[str], str]:
    """Source sentences, raw references and a name for them: ``eval.src/ref`` files or a data split
    (of a multilingual model, that of the corpus of ``direction``, named ``<split>.<src>-<tgt>``)."""
    if cfg.eval.src or cfg.eval.ref:
        if not (cfg.eval.src and cfg.eval.ref):
            raise NMTError("eval.src and eval.ref must be given together")
        sources, refs = read_lines(Path(cfg.eval.src)), read_lines(Path(cfg.eval.ref))
        if len(sources) != len(refs):
            raise NMTError(
                f"line counts differ: {cfg.eval.src} has {len(sources)} lines, {cfg.eval.ref} has {len(refs)}"
            )
        return sources, refs, Path(cfg.eval.src).stem
    data_cfg = train_cfg.data if direction is None else direction_corpus(train_cfg.data, direction)
    if cfg.data.dir is not None:
        data_cfg.dir = cfg.data.dir
    if cfg.data.cache_dir is not None:
        data_cfg.cache_dir = cfg.data.cache_dir
    if cfg.data.split not in SPLITS:
        raise NMTError(
            f"data.split={cfg.data.split!r}: choose one of {list(SPLITS)} or give eval.src/eval.ref"
        )
    root = prepare_text(data_cfg, progress=True)
    sources = read_text(root, cfg.data.split, data_cfg.src_lang)
    refs = read_text(root, cfg.data.split, data_cfg.tgt_lang)
    return sources, refs, cfg.data.split if direction is None else f"{cfg.data.split}.{'-'.join(direction)}"


def direction_corpus(data: DataConfig, direction: tuple[str, str]) -> DataConfig:
    """The corpus of a multilingual model's data that trained ``direction``: its valid and test are that
    direction's. A direction without one (zero-shot) is evaluated on eval.src and eval.ref."""
    for corpus in corpus_configs(data):
        if (corpus.src_lang, corpus.tgt_lang) == tuple(direction):
            return corpus
    raise NMTError(
        f"{direction[0]}->{direction[1]}: none of the model's corpora has this direction (zero-shot); "
        "give its text as eval.src and eval.ref"
    )


def evaluate_directions(cfg: EvaluateConfig, out_dir: Path) -> tuple[list[EvalReport], Path | None]:
    """Every direction a multilingual checkpoint trained, each evaluated as :func:`evaluate_checkpoint`
    does one (its hypotheses and report), and one report of them all (its path; None when a single
    direction was evaluated: a bilingual model, ``tgt_lang=`` given, or ``eval.src``)."""
    directions = trained_directions(cfg.checkpoint)
    if cfg.tgt_lang or len(directions) == 1 or cfg.eval.src or cfg.eval.ref:
        return [evaluate_checkpoint(cfg, out_dir)], None
    if cfg.eval.out:
        raise NMTError(
            "eval.out names one file: evaluating every direction, leave it out (or give tgt_lang=)"
        )
    reports = [
        evaluate_checkpoint(dataclasses.replace(cfg, src_lang=src, tgt_lang=tgt), out_dir)
        for src, tgt in directions
    ]
    path = Path(reports[0].report).with_name(
        Path(reports[0].report).name.replace(f".{'-'.join(directions[0])}.", ".directions.", 1)
    )
    summary = {
        "checkpoint": reports[0].checkpoint,
        "directions": {r.test_set.split(".")[-1]: r.as_dict() for r in reports},
        "mean": {
            name: sum(r.scores[name].score for r in reports) / len(reports) for name in reports[0].scores
        },
    }
    path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return reports, path


def mean_scores(cfg: EvaluateConfig, out_dir: Path) -> tuple[dict[str, float], EvalReport]:
    """The scores of a checkpoint: its one direction's, or the unweighted mean over every direction a
    multilingual checkpoint trained (``eval.out`` then gets each direction's suffix), with the first
    direction's report (what choosing a final model needs)."""
    directions = trained_directions(cfg.checkpoint)
    if len(directions) == 1 or cfg.tgt_lang:
        report = evaluate_checkpoint(cfg, out_dir)
        return {name: s.score for name, s in report.scores.items()}, report
    reports = []
    for src, tgt in directions:
        out = None if not cfg.eval.out else str(Path(cfg.eval.out).with_suffix(f".{src}-{tgt}.hyp"))
        one = dataclasses.replace(
            cfg, src_lang=src, tgt_lang=tgt, eval=dataclasses.replace(cfg.eval, out=out)
        )
        reports.append(evaluate_checkpoint(one, out_dir))
    names = list(reports[0].scores)
    return {n: sum(r.scores[n].score for r in reports) / len(reports) for n in names}, reports[0]


def format_directions(reports: list[EvalReport]) -> str:
    """The table of a multilingual evaluation: a row per direction (BLEU, chrF, signature), the mean."""
    names = list(reports[0].scores)
    rows = [f"{'direction':<12}" + "".join(f"{n:>8}" for n in names) + "  signature"]
    for r in reports:
        scores = "".join(f"{r.scores[n].score:8.2f}" for n in names)
        rows.append(f"{r.test_set.split('.')[-1]:<12}{scores}  {r.scores[names[0]].signature}")
    mean = "".join(f"{sum(r.scores[n].score for r in reports) / len(reports):8.2f}" for n in names)
    return "\n".join([*rows, f"{'mean':<12}{mean}"])


def log_scores_to_tensorboard(
    run_dir: Path,
    test_name: str,
    scores: dict[str, CorpusScore],
    step: int,
    by_length: list[dict] | None = None,
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
