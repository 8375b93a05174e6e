"""Each decoder at its best configuration for the cores, side by side (``scripts/benchmark_decoders.py``).

One process times every row on the same sentences, in rotating order over the repeats, so that load
changes on a shared machine hit all rows alike:

- PyTorch (``backend=torch``) on each of ``torch_threads`` intra-op threads, and as ``torch_processes``
  single-threaded processes (``workers=N`` of ``evaluate.py`` and ``translate.py``, what
  ``serve.workers`` does for the service);
  each also over the vocabulary ``shortlist`` if one is given. Every PyTorch row decodes in processes
  of its own, where CTranslate2 never runs: in a process where CTranslate2 has run a team of OpenMP
  threads (``intra_threads`` > 1), torch's intra-op threads decode 1.3-1.4x slower than they do in
  ``evaluate.py``;
- CTranslate2 called directly, the one plain call a CTranslate2 user makes
  (:func:`nmt.benchmark.ct2_speed.direct`), at each ``ct2_layouts`` thread layout, without a
  vocabulary map;
- ``backend=ct2`` at its default layout, and with the vocabulary map of ``ct2_vmap_model`` (the same
  model exported with ``shortlist=``) over ``shortlist``.

Every row's speed is reported against the fastest CTranslate2 call (median of per-repeat ratios), with
the BLEU of its output, so a speed-up that costs quality shows beside it.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from nmt.benchmark.ct2_speed import direct, parse_layout
from nmt.benchmark.hardware import hardware
from nmt.checkpoint import weights_digest
from nmt.config import DecodersSpeedConfig, DecodingConfig
from nmt.ct2.backend import CT2Backend
from nmt.errors import NMTError
from nmt.evaluation.evaluate import evaluation_text
from nmt.inference.backends import ProcessesBackend
from nmt.inference.translator import Translator
from nmt.metrics import corpus_scores

CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "CT2_FORCE_CPU_ISA")


@dataclass
class Row:
    name: str
    decode: Callable[[list[list[int]]], list[list[int]]]  # source ids -> best hypothesis' target ids


def build_rows(
    cfg: DecodersSpeedConfig,
    translator: Translator,
    decoding: DecodingConfig,
    torch_backends: dict[str, ProcessesBackend],
) -> list[Row]:
    searches = {"": decoding}
    if cfg.shortlist:
        searches[", shortlist"] = replace(decoding, shortlist=cfg.shortlist)
    rows = []
    for suffix, search in searches.items():
        for name, backend in torch_backends.items():
            rows.append(
                Row(
                    f"PyTorch, {name}{suffix}",
                    lambda sources, backend=backend, search=search: [
                        h[0].tokens for h in backend.translate_ids(sources, search)
                    ],
                )
            )
    tokenizer, weights = translator.tokenizer, weights_digest(translator.model)
    reference = translator.backend  # backend=torch, for what CTranslate2 cannot do
    for inter, intra in map(parse_layout, cfg.ct2_layouts):
        backend = CT2Backend(
            cfg.ct2_model, tokenizer, "cpu", inter, intra, weights=weights, reference=reference
        )

        def direct_row(sources, backend=backend):
            pieces = [[backend.src_pieces[i] for i in s] for s in sources]
            return [[backend.ids[p] for p in hyp] for hyp in direct(backend, pieces, decoding)]

        rows.append(Row(f"CTranslate2 direct, {inter}x{intra}", direct_row))
    models = {"": (cfg.ct2_model, decoding)}
    if cfg.ct2_vmap_model:
        models[", vocabulary map"] = (cfg.ct2_vmap_model, searches[", shortlist"])
    for suffix, (model_dir, search) in models.items():
        threads = (cfg.ct2_inter_threads, cfg.ct2_intra_threads)
        backend = CT2Backend(model_dir, tokenizer, "cpu", *threads, weights=weights, reference=reference)
        rows.append(
            Row(
                f"backend=ct2, {backend.inter_threads}x{backend.intra_threads}{suffix}",
                lambda sources, backend=backend, search=search: [
                    h[0].tokens for h in backend.translate_ids(sources, search)
                ],
            )
        )
    return rows


def run_decoders_speed(cfg: DecodersSpeedConfig) -> dict[str, Any]:
    """Time every row ``cfg.repeats`` times on the split's sentences; speeds, ratios, BLEU per row."""
    if not cfg.ct2_model:
        raise NMTError("ct2_model=DIR is required: the directory scripts/export_ct2.py wrote (no shortlist)")
    if cfg.ct2_vmap_model and not cfg.shortlist:
        raise NMTError("ct2_vmap_model needs shortlist=FILE, the shortlist it was exported with")
    cpu = torch.device("cpu")
    translator = Translator.from_checkpoint(cfg.checkpoint, cpu)
    sources, refs, name = speed_sentences(cfg, translator)
    decoding = translator.decoding_with(cfg.decoding)
    machine = hardware(cpu)
    torch_backends: dict[str, ProcessesBackend] = {}
    try:
        add_torch_backends(cfg, translator, torch_backends)
        rows = build_rows(cfg, translator, decoding, torch_backends)
        seconds, outputs = time_rows(rows, sources, cfg.repeats)
    finally:
        for backend in torch_backends.values():
            backend.close()
    texts = {n: translator.tokenizer.decode_tgt(ids) for n, ids in outputs.items()}
    return {
        "split": name,
        "sentences": len(sources),
        "repeats": cfg.repeats,
        "decoding": vars(decoding),
        "rows": speed_table(rows, seconds, texts, refs, len(sources), cfg.repeats),
        "kernel_caps": {n: os.environ[n] for n in CAPS if n in os.environ},
        "hardware": {**machine, "load_average_end": list(os.getloadavg())},
    }


def speed_sentences(
    cfg: DecodersSpeedConfig, translator: Translator
) -> tuple[list[list[int]], list[str], str]:
    """The split's first ``cfg.sentences`` non-empty sources (all with 0) as ids, their references and
    the split's name."""
    lines, refs, name = evaluation_text(cfg, translator.cfg)
    keep = [i for i, s in enumerate(translator.encode(lines)) if s]
    keep = keep[: cfg.sentences] if cfg.sentences > 0 else keep
    sources = [translator.encode([lines[i]])[0] for i in keep]
    return sources, [refs[i] for i in keep], name


def add_torch_backends(
    cfg: DecodersSpeedConfig, translator: Translator, backends: dict[str, ProcessesBackend]
) -> None:
    """backend=torch in one process on each of ``cfg.torch_threads`` threads, and in
    ``cfg.torch_processes`` single-threaded processes; added to ``backends`` as each starts, so that the
    caller closes those started when a later one fails."""
    positions = translator.cfg.model.max_positions
    direction = (translator.cfg.data.src_lang, translator.cfg.data.tgt_lang)

    def processes(workers: int, threads: int) -> ProcessesBackend:
        model, tokenizer = translator.model, translator.tokenizer
        return ProcessesBackend(
            model, tokenizer, positions, direction, cfg.checkpoint, workers, threads=threads
        )

    for threads in cfg.torch_threads:
        backends[f"{threads} thread(s)"] = processes(1, threads)
    if cfg.torch_processes > 1:  # what workers=N of evaluate.py and translate.py run
        backends[f"{cfg.torch_processes} processes x 1 thread"] = processes(cfg.torch_processes, 1)


def time_rows(
    rows: list[Row], sources: list[list[int]], repeats: int
) -> tuple[dict[str, list[float]], dict[str, list[list[int]]]]:
    """Each row's seconds over ``sources``, ``repeats`` times in rotating order after a warm-up, and
    its last outputs."""
    for row in rows:  # warm up: first calls allocate, load kernels, fill caches
        row.decode(sources[:50])
    seconds: dict[str, list[float]] = {row.name: [] for row in rows}
    outputs: dict[str, list[list[int]]] = {}
    for r in range(repeats):
        for row in rows[r % len(rows) :] + rows[: r % len(rows)]:
            start = time.perf_counter()
            outputs[row.name] = row.decode(sources)
            seconds[row.name].append(time.perf_counter() - start)
    return seconds, outputs


def speed_table(
    rows: list[Row],
    seconds: dict[str, list[float]],
    texts: dict[str, list[str]],
    refs: list[str],
    sentences: int,
    repeats: int,
) -> list[dict[str, Any]]:
    """One line per row: its median speed, its speed over the fastest direct CTranslate2 call of each
    repeat, and its BLEU."""
    direct_names = [row.name for row in rows if row.name.startswith("CTranslate2 direct")]
    fastest = [min(seconds[n][r] for n in direct_names) for r in range(repeats)]
    table = []
    for row in rows:
        times = seconds[row.name]
        table.append(
            {
                "decoder": row.name,
                "seconds": statistics.median(times),
                "seconds_all": [round(t, 3) for t in times],
                "sentences_per_s": sentences / statistics.median(times),
                "over_fastest_ct2_direct": statistics.median(f / t for f, t in zip(fastest, times)),
                "bleu": corpus_scores(texts[row.name], refs, ("bleu",))["bleu"].score,
            }
        )
    return table


def format_decoders(result: dict[str, Any]) -> list[str]:
    hw = result["hardware"]
    caps = ", ".join(f"{k}={v}" for k, v in result["kernel_caps"].items()) or "native kernels"
    out = [
        f"{result['split']}: {result['sentences']} sentences, beam {result['decoding']['beam_size']}, "
        f"{result['repeats']} repeats; {hw['cpu']} ({hw['cpus']} CPUs), {caps}",
        f"{'decoder':<46}{'sent/s':>9}{'vs fastest CT2':>16}{'BLEU':>8}",
    ]
    for row in result["rows"]:
        out.append(
            f"{row['decoder']:<46}{row['sentences_per_s']:>9.1f}{row['over_fastest_ct2_direct']:>15.2f}x"
            f"{row['bleu']:>8.2f}"
        )
    return out
