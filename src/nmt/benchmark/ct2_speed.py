"""CTranslate2 speed, two ways.

The CTranslate2 part of ``scripts/benchmark.py`` (``bench.ct2=true``): the benchmark's model, exported
once per ``bench.ct2_quantizations`` entry, decodes the same sentences with the same decoding settings
as the PyTorch measurement (greedy and beam search), with backend=ct2's default thread layout.
Reported per setting: sentences/s, target tokens/s, the speed ratio over PyTorch's cached search and
the share of sentences whose best translation equals PyTorch's. A randomly initialised model (no
``bench.checkpoint``) never emits EOS, so every hypothesis reaches the length budget, and the
CTranslate2 backend then scores all of them again with EOS (see :mod:`nmt.ct2.backend`), which a
trained model hardly ever needs: benchmark a checkpoint for representative ratios.

``scripts/benchmark_ct2.py`` (:func:`run_ct2_speed`): backend=ct2 against CTranslate2 called directly
on an exported model, per thread layout, side by side (:func:`compare_with_direct`).
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from nmt.benchmark.hardware import hardware
from nmt.checkpoint import checkpoint_config, load_checkpoint
from nmt.config import BenchConfig, CT2SpeedConfig, DecodingConfig, TrainConfig
from nmt.ct2.backend import CT2Backend, ct2_length_penalty
from nmt.ct2.export import check_exportable, check_quantization, export_model
from nmt.ct2.format import require_ctranslate2
from nmt.decoding import Hypothesis, batch_source_tokens, length_penalty
from nmt.decoding.common import budget_for_source
from nmt.errors import NMTError
from nmt.evaluation.evaluate import evaluation_text
from nmt.inference.translator import Translator
from nmt.models import Transformer
from nmt.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def check_ct2_bench(cfg: TrainConfig, bench: BenchConfig) -> None:
    """Fail before any measurement when the CTranslate2 part cannot run."""
    require_ctranslate2()
    for quantization in bench.ct2_quantizations:
        check_quantization(quantization)
    model_cfg = checkpoint_config(load_checkpoint(bench.checkpoint)).model if bench.checkpoint else cfg.model
    check_exportable(model_cfg)


def measure_ct2(
    model: Transformer,
    tokenizer: Tokenizer,
    sources: Sequence[Sequence[int]],
    decoding: DecodingConfig,
    searches: list[tuple[str, int]],
    torch_runs: dict[str, tuple[float, list[list[Hypothesis]]]],
    bench: BenchConfig,
    device: torch.device,
) -> dict[str, Any]:
    """Time CTranslate2 decoding; ``torch_runs`` maps a search name to PyTorch's (seconds, hypotheses)."""
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for quantization in bench.ct2_quantizations:
            model_dir = export_model(model, tokenizer, Path(scratch) / quantization, quantization)
            backend = CT2Backend(model_dir, tokenizer, device)  # the thread layout backend=ct2 uses
            for _, beam in searches:  # warm up, as the PyTorch measurement does
                backend.translate_ids(sources[:32], replace(decoding, beam_size=beam, nbest=1))
            for name, beam in searches:
                log.info("decoding %d sentences with CTranslate2 (%s): %s", len(sources), quantization, name)
                settings = replace(decoding, beam_size=beam, nbest=1)
                start = time.perf_counter()
                hyps = backend.translate_ids(sources, settings)
                seconds = time.perf_counter() - start
                torch_seconds, torch_hyps = torch_runs[name]
                same = sum(a[0].tokens == b[0].tokens for a, b in zip(hyps, torch_hyps))
                tokens = sum(len(h[0].tokens) + 1 for h in hyps)  # + EOS
                rows.append(
                    {
                        "quantization": quantization,
                        "search": name,
                        "beam_size": beam,
                        "seconds": seconds,
                        "sentences_per_s": len(sources) / seconds,
                        "tgt_tokens_per_s": tokens / seconds,
                        "speedup_over_torch": torch_seconds / seconds,
                        "same_as_torch": same / len(sources),
                    }
                )
    return {"threads": torch.get_num_threads(), "results": rows}


def format_ct2(ct2: dict[str, Any]) -> list[str]:
    """The CTranslate2 rows of the decoding table."""
    out = [
        f"CTranslate2 ({ct2['threads']} threads) vs PyTorch with the cache",
        f"{'search':<10}{'weights':>14}{'sent/s':>10}{'tok/s':>10}{'seconds':>10}{'speedup':>9}{'same':>8}",
    ]
    for r in ct2["results"]:
        out.append(
            f"{r['search']:<10}{r['quantization']:>14}{r['sentences_per_s']:>10.1f}{r['tgt_tokens_per_s']:>10.0f}"
            f"{r['seconds']:>10.2f}{r['speedup_over_torch']:>8.2f}x{100 * r['same_as_torch']:>7.1f}%"
        )
    return out


# --------------------------------------------------- backend=ct2 against CTranslate2 called directly

VARIANTS = ("direct", "per length", "backend")
# What backend=ct2 is compared with: one plain call of every sentence (its results depend on the batch),
# and CTranslate2 making exactly backend=ct2's calls (one per source length) without the rest.
REFERENCES = ("direct", "per length")


def parse_layout(text: str) -> tuple[int, int]:
    """``"2x1"`` -> (inter_threads, intra_threads)."""
    match = re.fullmatch(r"(\d+)x(\d+)", text)
    if not match or "0" in match.groups():
        raise NMTError(f"layouts: {text!r} is not INTERxINTRA with both >= 1, e.g. 2x1")
    return int(match[1]), int(match[2])


def direct(backend: CT2Backend, pieces: list[list[str]], cfg: DecodingConfig) -> list[list[str]]:
    """The one call a CTranslate2 user makes for ``cfg``: every sentence, the largest length budget,
    the length penalty for the mean length, the best hypothesis each."""
    lengths = [len(p) + 1 for p in pieces]
    results = backend.translator.translate_batch(
        pieces,
        beam_size=cfg.beam_size,
        length_penalty=ct2_length_penalty(cfg.alpha, round(statistics.mean(lengths))),
        max_decoding_length=max(budget_for_source(len(p), cfg, backend.max_positions - 1) for p in pieces),
        disable_unk=cfg.no_unk,
        return_scores=True,
        max_batch_size=batch_source_tokens(cfg),
        batch_type="tokens",
    )
    return [r.hypotheses[0] for r in results]


def per_length(backend: CT2Backend, pieces: list[list[str]], cfg: DecodingConfig) -> list[list[str]]:
    """What backend=ct2 asks of CTranslate2 (one call per source length, with its penalty and budget,
    all queued at once, every finished hypothesis), without turning anything into ours."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(pieces):
        groups[len(p)].append(i)
    calls = []
    for n, idx in sorted(groups.items(), key=lambda item: -item[0] * len(item[1])):
        lp = ct2_length_penalty(cfg.alpha, n + 1)
        pending = backend.translator.translate_batch(
            [pieces[i] for i in idx],
            asynchronous=True,
            beam_size=cfg.beam_size,
            num_hypotheses=cfg.beam_size,
            length_penalty=lp,
            max_decoding_length=budget_for_source(n, cfg, backend.max_positions - 1),
            disable_unk=cfg.no_unk,
            return_scores=True,
            max_batch_size=batch_source_tokens(cfg),
            batch_type="tokens",
        )
        calls.append((idx, pending, lp))
    best: list[list[str]] = [[] for _ in pieces]
    for idx, pending, lp in calls:
        for i, result in zip(idx, pending):
            found = result.result()
            gnmt = [  # CTranslate2's normalisation undone, GNMT's applied: the best as backend=ct2 ranks
                score * (len(h) + 1) ** lp / length_penalty(len(h) + 1, cfg.alpha)
                for h, score in zip(found.hypotheses, found.scores)
            ]
            best[i] = found.hypotheses[max(range(len(gnmt)), key=gnmt.__getitem__)]
    return best


def time_variants(
    backend: CT2Backend, sources: list[list[int]], cfg: DecodingConfig, order: Sequence[str], warmup: int
) -> dict[str, tuple[float, float]]:
    """Wall-clock and process CPU seconds of each variant decoding ``sources`` on ``backend``'s
    translator, after a warm-up."""
    pieces = [[backend.src_pieces[i] for i in s] for s in sources]  # what a direct user feeds
    runs: dict[str, Callable[[list[list[int]], list[list[str]]], Any]] = {
        "direct": lambda ids, text: direct(backend, text, cfg),
        "per length": lambda ids, text: per_length(backend, text, cfg),
        "backend": lambda ids, text: backend.translate_ids(ids, cfg),
    }
    for run in runs.values():
        run(sources[:warmup], pieces[:warmup])
    seconds = {}
    for variant in order:
        wall, cpu = time.perf_counter(), time.process_time()
        runs[variant](sources, pieces)
        seconds[variant] = (time.perf_counter() - wall, time.process_time() - cpu)
    return seconds


def compare_with_direct(
    model_dir: str | Path,
    tokenizer: Tokenizer,
    sources: Sequence[Sequence[int]],
    cfg: DecodingConfig,
    layouts: Sequence[tuple[int, int]],
    repeats: int,
    warmup: int = 50,
) -> dict[str, Any]:
    """:data:`VARIANTS` per thread layout, side by side: each repeat builds each layout's translator
    afresh, warms it up on ``warmup`` sentences and times the variants in rotating order, so load
    changes on a shared machine hit all alike.

    Ratios are direct seconds / backend seconds (>= 1: backend=ct2 is as fast), medians over repeats of
    per-repeat ratios. CPU seconds are the least load-sensitive measure where ``intra_threads`` is 1
    (with more, OpenMP threads spin while they wait, which counts as CPU time)."""
    sources = [list(s) for s in sources]
    wall: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    cpu: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in range(repeats):
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for inter, intra in layouts:
            backend = CT2Backend(model_dir, tokenizer, "cpu", inter_threads=inter, intra_threads=intra)
            for variant, (w, c) in time_variants(backend, sources, cfg, order, warmup).items():
                wall[f"{inter}x{intra}"][variant].append(w)
                cpu[f"{inter}x{intra}"][variant].append(c)

    def ratio(times: dict[str, list[float]], variant: str) -> float:
        return statistics.median(d / b for d, b in zip(times[variant], times["backend"]))

    rows = []
    for name, by_variant in wall.items():
        row: dict[str, Any] = {"layout": name}
        for variant in VARIANTS:
            row[f"{variant} s"] = statistics.median(by_variant[variant])
            row[f"{variant} s min"] = min(by_variant[variant])  # the least disturbed run
            row[f"{variant} s all"] = [round(x, 3) for x in by_variant[variant]]
            row[f"{variant} cpu s"] = statistics.median(cpu[name][variant])
        for variant in REFERENCES:
            row[f"backend / {variant}"] = ratio(by_variant, variant)
            row[f"backend / {variant} cpu"] = ratio(cpu[name], variant)
        rows.append(row)
    best = min(rows, key=lambda row: row["backend s"])["layout"]
    fastest = [min(wall[name]["direct"][r] for name in wall) for r in range(repeats)]
    return {
        "sentences": len(sources),
        "repeats": repeats,
        "decoding": vars(cfg),
        "rows": rows,
        "fastest_backend_layout": best,
        "fastest_direct_layout": min(rows, key=lambda row: row["direct s"])["layout"],
        # per repeat: backend=ct2 at its fastest layout against the fastest direct call at any layout
        "backend_over_fastest_direct": statistics.median(
            d / b for d, b in zip(fastest, wall[best]["backend"])
        ),
    }


def run_ct2_speed(cfg: CT2SpeedConfig) -> dict[str, Any]:
    """:func:`compare_with_direct` for ``scripts/benchmark_ct2.py``: the checkpoint's tokenizer and
    decoding settings, the split's (non-empty) sentences, the machine and the kernel caps in force."""
    if not cfg.ct2_model:
        raise NMTError("ct2_model=DIR is required: the directory scripts/export_ct2.py wrote")
    layouts = [parse_layout(layout) for layout in cfg.layouts]
    cpu = torch.device("cpu")
    translator = Translator.from_checkpoint(cfg.checkpoint, cpu)
    sources = [s for s in translator.encode(evaluation_text(cfg, translator.cfg)[0]) if s]
    sources = sources[: cfg.sentences] if cfg.sentences > 0 else sources
    decoding = translator.decoding_with(cfg.decoding)
    machine = hardware(cpu)  # with the load at the start
    result = compare_with_direct(cfg.ct2_model, translator.tokenizer, sources, decoding, layouts, cfg.repeats)
    caps = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "CT2_FORCE_CPU_ISA")
    result["kernel_caps"] = {name: os.environ[name] for name in caps if name in os.environ}
    result["hardware"] = {**machine, "load_average_end": list(os.getloadavg())}
    return result


def format_direct(result: dict[str, Any]) -> list[str]:
    """The table of :func:`compare_with_direct`: seconds per layout and variant (median, and the least
    disturbed run), and backend=ct2's speed over each reference, from wall-clock and from CPU time."""
    widths = (16, 12, 14, 12)  # the ratio columns
    heads = ("wall /direct", "/per length", "cpu /direct", "/per length")
    out = [
        f"backend=ct2 against CTranslate2 called directly: {result['sentences']} sentences, "
        f"beam {result['decoding']['beam_size']}, {result['repeats']} repeats; seconds median (min), "
        "and how fast backend=ct2 is against the references",
        f"{'layout':<8}"
        + "".join(f"{v:>15}" for v in VARIANTS)
        + "".join(f"{h:>{w}}" for h, w in zip(heads, widths)),
    ]
    for row in result["rows"]:
        cells = "".join(f"{row[f'{v} s']:>7.2f} ({row[f'{v} s min']:5.2f})" for v in VARIANTS)
        keys = [f"backend / {v}{kind}" for kind in ("", " cpu") for v in REFERENCES]
        ratios = "".join(f"{row[k]:>{w - 1}.2f}x" for k, w in zip(keys, widths))
        out.append(f"{row['layout']:<8}{cells}{ratios}")
    speed = result["backend_over_fastest_direct"]
    out.append(
        f"fastest layout: backend=ct2 {result['fastest_backend_layout']}, direct "
        f"{result['fastest_direct_layout']}; backend=ct2 there at {speed:.2f}x the fastest direct call"
    )
    return out
