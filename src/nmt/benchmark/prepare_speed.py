"""Data preparation at scale: corpora of N unique pairs, each prepared from scratch in a process of its own.

The pairs are drawn at random (with replacement) from local parallel text, and each drawn pair is
tagged with its number on both sides, so no two pairs repeat however large N is. The preparation runs
in a fresh process (``python -m nmt.benchmark.prepare_speed``), so its peak resident memory is its own:
the SentencePiece trainer runs in a process of its own and is measured apart.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from nmt.config import LocalDataConfig, PrepareSpeedConfig, TokenizerConfig
from nmt.errors import NMTError


def run_prepare_speed(cfg: PrepareSpeedConfig) -> dict[str, Any]:
    """A row per size in ``cfg.sizes``, and the hardware the rows were measured on."""
    import torch

    from nmt.benchmark.hardware import hardware

    pairs = _source_pairs(cfg)
    results: dict[str, Any] = {
        "hardware": {
            **hardware(torch.device("cpu")),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        },
        "settings": {
            "source": [str(Path(cfg.dir) / p) for p in cfg.prefixes],
            "source_pairs": len(pairs),
            "tokenizer": asdict(cfg.tokenizer),
            "workers": cfg.workers,
        },
        "rows": [],
    }
    for n in cfg.sizes:
        folder = Path(cfg.workdir) / f"pairs-{n}"
        shutil.rmtree(folder, ignore_errors=True)
        started = time.perf_counter()
        corpus_bytes = build_corpus(pairs, n, cfg, folder / "corpus")
        row = {"pairs": n, "corpus_build_s": time.perf_counter() - started, "corpus_bytes": corpus_bytes}
        row.update(_prepare_in_a_fresh_process(cfg, folder))
        results["rows"].append(row)
        print(format_row(row), flush=True)
        if not cfg.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return results


def _source_pairs(cfg: PrepareSpeedConfig) -> list[tuple[str, str]]:
    from nmt.data.sources import read_parallel

    pairs: list[tuple[str, str]] = []
    for prefix in cfg.prefixes:
        src, tgt = read_parallel(
            Path(cfg.dir) / f"{prefix}.{cfg.src_lang}", Path(cfg.dir) / f"{prefix}.{cfg.tgt_lang}"
        )
        pairs += [(s, t) for s, t in zip(src, tgt) if s and t]
    if not pairs:
        raise NMTError(f"dir={cfg.dir}, prefixes={cfg.prefixes}: no pairs to draw from")
    return pairs


def build_corpus(pairs: list[tuple[str, str]], n: int, cfg: PrepareSpeedConfig, folder: Path) -> int:
    """``{train,valid,test}.{lang}`` in ``folder``: n training pairs drawn from ``pairs``, the k-th tagged
    " k" on both sides; valid and test copied from ``cfg.dir``. Returns the training text's bytes."""
    folder.mkdir(parents=True)
    drawn = np.random.default_rng(cfg.seed).integers(len(pairs), size=n)
    with (
        open(folder / f"train.{cfg.src_lang}", "w", encoding="utf-8") as fs,
        open(folder / f"train.{cfg.tgt_lang}", "w", encoding="utf-8") as ft,
    ):
        for start in range(0, n, 100_000):
            block = drawn[start : start + 100_000].tolist()
            fs.write("".join(f"{pairs[j][0]} {start + k}\n" for k, j in enumerate(block)))
            ft.write("".join(f"{pairs[j][1]} {start + k}\n" for k, j in enumerate(block)))
    for split in ("valid", "test"):
        for lang in (cfg.src_lang, cfg.tgt_lang):
            shutil.copyfile(Path(cfg.dir) / f"{split}.{lang}", folder / f"{split}.{lang}")
    return sum((folder / f"train.{lang}").stat().st_size for lang in (cfg.src_lang, cfg.tgt_lang))


def _prepare_in_a_fresh_process(cfg: PrepareSpeedConfig, folder: Path) -> dict[str, Any]:
    args = {
        "corpus": str(folder / "corpus"),
        "cache": str(folder / "cache"),
        "src_lang": cfg.src_lang,
        "tgt_lang": cfg.tgt_lang,
        "workers": cfg.workers,
        "tokenizer": asdict(cfg.tokenizer),
        "datasets_reference": cfg.datasets_reference,
    }
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "nmt.benchmark.prepare_speed", json.dumps(args)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise NMTError(f"preparing {folder / 'corpus'} failed: {done.stderr.strip().splitlines()[-1:]}")
    return {"wall_s": time.perf_counter() - started, **json.loads(done.stdout.strip().splitlines()[-1])}


def prepare_once(args: dict[str, Any]) -> dict[str, Any]:
    """Run in the fresh process: each stage of ``prepare_corpus`` timed, then this process's peak RSS
    (the SentencePiece trainer and the encoding workers are its children) and the cache's bytes."""
    from nmt.data.corpus import data_workers, prepare_corpus, prepare_text, text_path
    from nmt.text.tokenizer import train_tokenizer

    data_cfg = LocalDataConfig(
        dir=args["corpus"], name="corpus", cache_dir=args["cache"], workers=args["workers"]
    )
    data_cfg.src_lang, data_cfg.tgt_lang = args["src_lang"], args["tgt_lang"]
    tok_cfg = TokenizerConfig(**args["tokenizer"])
    times = [time.perf_counter()]
    root = prepare_text(data_cfg, progress=False)
    times.append(time.perf_counter())
    src, tgt = data_cfg.src_lang, data_cfg.tgt_lang
    tokenizer = train_tokenizer(tok_cfg, text_path(root, "train", src), text_path(root, "train", tgt), root)
    times.append(time.perf_counter())
    data = prepare_corpus(data_cfg, tok_cfg, progress=False)  # the text and tokenizer are cached: encodes
    times.append(time.perf_counter())
    (trainer,) = [json.loads(p.read_text()) for p in root.glob("tokenizer-*/trainer.json")]
    reference = {}
    if args["datasets_reference"]:
        reference = {"datasets_encode_s": _datasets_encode(root, tokenizer, src, tgt, data_workers(data_cfg))}
    cache = [p for p in Path(args["cache"]).rglob("*") if p.is_file() and "samples-" not in str(p)]
    return {
        "kept_pairs": len(data.splits["train"]),
        "vocab_size": tokenizer.src_vocab_size,
        "ids_dtype": str(data.splits["train"].src(0).dtype),
        "text_s": times[1] - times[0],
        "tokenizer_s": times[2] - times[1],
        "encode_s": times[3] - times[2],
        "trainer_s": sum(t["seconds"] for t in trainer),
        "trainer_peak_rss_bytes": max(t["peak_rss_bytes"] for t in trainer),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "children_peak_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
        "cache_bytes": sum(p.stat().st_size for p in cache),
        **reference,
    }


_SP: dict[str, Any] = {}


def _encode_batch(batch: dict[str, list[str]], protos: dict[str, bytes]) -> dict[str, list[list[int]]]:
    import sentencepiece as spm

    out = {}
    for lang, lines in batch.items():
        if lang not in _SP:
            _SP[lang] = spm.SentencePieceProcessor(model_proto=protos[lang])
        out[f"{lang}_ids"] = _SP[lang].encode(lines, out_type=int)
    return out


def _datasets_encode(root: Path, tokenizer: Any, src: str, tgt: str, workers: int) -> float:
    """Seconds for Hugging Face datasets to encode the prepared training text into its Arrow cache:
    ``Dataset.from_generator`` over the text, then ``map(batched=True, num_proc=workers)``."""
    import datasets

    from nmt.text.spm_workers import text_lines

    def pairs() -> Any:
        for a, b in zip(text_lines([root / f"train.{src}.gz"]), text_lines([root / f"train.{tgt}.gz"])):
            yield {src: a, tgt: b}

    started = time.perf_counter()
    cache = root.parent / "datasets-reference"
    table = datasets.Dataset.from_generator(pairs, cache_dir=str(cache))
    src_proto, tgt_proto = tokenizer.protos
    table.map(
        _encode_batch,
        batched=True,
        batch_size=1000,
        num_proc=workers if workers > 1 else None,
        fn_kwargs={"protos": {src: src_proto, tgt: tgt_proto or src_proto}},
        remove_columns=[src, tgt],
    )
    seconds = time.perf_counter() - started
    shutil.rmtree(cache, ignore_errors=True)
    return seconds


def format_row(row: dict[str, Any]) -> str:
    n = row["pairs"]
    rate = n / (row["text_s"] + row["encode_s"])
    reference = ""
    if "datasets_encode_s" in row:
        seconds = row["datasets_encode_s"]
        reference = f"   datasets: {seconds:.0f} s ({seconds / row['encode_s']:.1f}x enc s)"
    return (
        f"{n:>10,} {_minutes(row['wall_s']):>7} {rate:>10,.0f} {row['text_s']:>7.0f} {row['encode_s']:>7.0f} "
        f"{row['trainer_s']:>6.0f} s {row['trainer_peak_rss_bytes'] / 1e9:>5.2f} GB "
        f"{row['peak_rss_bytes'] / 1e9:>7.2f} GB {row['peak_rss_bytes'] / n:>8,.0f} "
        f"{row['cache_bytes'] / n:>8,.0f}{reference}"
    )


def format_prepare(results: dict[str, Any]) -> str:
    """The rows as a table, the hardware above it, the memory growth per pair below it."""
    hw, settings = results["hardware"], results["settings"]
    tok = settings["tokenizer"]
    lines = [
        f"hardware  {hw['cpu']} ({hw['cpus']} CPUs, flags {' '.join(hw['cpu_flags'])}), torch {hw['torch']} "
        f"kernels {hw['cpu_capability']}, load {hw['load_average_start'][0]:.2f}",
        f"settings  data.workers={settings['workers']} (0 = cores), vocab {tok['vocab_size']} "
        f"{tok['model_type']}, SentencePiece sample {tok['input_sentence_size']:,} sentences; pairs drawn "
        f"from {settings['source_pairs']:,} of {', '.join(settings['source'])}",
        "",
        f"{'pairs':>10} {'wall':>7} {'pairs/s*':>10} {'clean s':>7} {'enc s':>7} {'SentencePiece':>16} "
        f"{'peak RSS':>10} {'RSS B/p':>8} {'cache B/p':>8}",
        *[format_row(row) for row in results["rows"]],
        "",
        "* cleaning and encoding (the text, then the ids), without the SentencePiece trainer, whose own time "
        "and peak (its process) are apart; peak RSS: the preparing process",
    ]
    rows = results["rows"]
    if len(rows) > 1:
        first = next((r for r in rows if r["pairs"] >= 400_000), rows[0])
        last = rows[-1]
        if last["pairs"] > first["pairs"]:
            growth = (last["peak_rss_bytes"] - first["peak_rss_bytes"]) / (last["pairs"] - first["pairs"])
            span = f"from {first['pairs']:,} to {last['pairs']:,} pairs"
            lines.append(f"peak RSS grows by {growth:,.0f} bytes a pair {span}")
    return "\n".join(lines)


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


if __name__ == "__main__":
    print(json.dumps(prepare_once(json.loads(sys.argv[1]))))
