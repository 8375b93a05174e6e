"""A folder of line-aligned text files, ``{dir}/{prefix}.{lang}``: train (plus ``extra_train``
prefixes), valid and test. The prepared cache is keyed by the folder and each file's size and time."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nmt.config import DataConfig, HFDataConfig, LocalDataConfig
from nmt.data.sources.shapes import SPLITS, Chunk
from nmt.errors import NMTError

log = logging.getLogger(__name__)

REMOVE_HELD_OUT = True  # training pairs that are valid or test pairs are dropped
SCHEMA = LocalDataConfig
CHUNK_LINES = 10_000  # lines read at a time


def resolve(cfg: LocalDataConfig) -> DataConfig:
    """``cfg``, or for files that are missing and a preset that allows it (``data.hub_fallback_pairs``),
    the WMT14 subset of that size from the Hugging Face hub."""
    if not cfg.hub_fallback_pairs or not missing_local_files(cfg):
        return cfg
    log.warning(
        "data.dir=%s lacks its files: drawing %d training pairs from WMT14 on the Hugging Face hub instead "
        "(data.hub_fallback_pairs; newstest2013 valid, newstest2014 test)",
        cfg.dir,
        cfg.hub_fallback_pairs,
    )
    from nmt.data.sources import hub

    return hub.resolve(
        HFDataConfig(
            cache_dir=cfg.cache_dir,
            src_lang=cfg.src_lang,
            tgt_lang=cfg.tgt_lang,
            clean=cfg.clean,
            train_size=cfg.hub_fallback_pairs,
            **hub.WMT14,
        )
    )


def pin(cfg: LocalDataConfig) -> LocalDataConfig:
    """Files name no version: their sizes and times key the prepared cache instead."""
    return cfg


def describe(cfg: LocalDataConfig) -> str:
    return f"the files {{train,valid,test}}.{{{cfg.src_lang},{cfg.tgt_lang}}} of {Path(cfg.dir).resolve()}"


def cache_key(cfg: LocalDataConfig, settings: dict) -> dict:
    """The folder and each file's name, size and time: editing a file prepares the corpus again.
    ``origin`` and ``hub_fallback_pairs`` are said or used only without the files."""
    settings.pop("origin"), settings.pop("hub_fallback_pairs")
    settings["dir"] = str(Path(cfg.dir).resolve())
    # Sorted by name: local_files lists them in the direction's order, the key must not follow it.
    settings["files"] = sorted(
        [p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in local_files(cfg) if p.is_file()
    )
    return settings


def read(cfg: LocalDataConfig, split: str) -> Iterator[Chunk]:
    missing = missing_local_files(cfg)
    if missing:
        raise NMTError(_missing_message(cfg, missing))
    for prefix in _local_prefixes(cfg):
        if (prefix if prefix in SPLITS else "train") == split:
            yield from read_parallel_chunks(
                Path(cfg.dir) / f"{prefix}.{cfg.src_lang}", Path(cfg.dir) / f"{prefix}.{cfg.tgt_lang}"
            )


def local_files(cfg: LocalDataConfig) -> list[Path]:
    """Every file ``data=local`` reads: ``{dir}/{prefix}.{lang}`` for both languages."""
    return [
        Path(cfg.dir) / f"{prefix}.{lang}"
        for prefix in _local_prefixes(cfg)
        for lang in (cfg.src_lang, cfg.tgt_lang)
    ]


def _local_prefixes(cfg: LocalDataConfig) -> list[str]:
    return ["train", *cfg.extra_train, "valid", "test"]


def missing_local_files(cfg: LocalDataConfig) -> list[Path]:
    return [p for p in local_files(cfg) if not p.exists()]  # a folder in its place: "cannot read it"


def _missing_message(cfg: LocalDataConfig, missing: list[Path]) -> str:
    """One line: what is missing, what the folder must hold, and where such files come from."""
    expected = local_files(cfg)
    what = (
        "no such folder"
        if not Path(cfg.dir).is_dir()
        else f"{len(missing)} of {len(expected)} files missing ({', '.join(p.name for p in missing)})"
    )
    origin = f"; these files are {cfg.origin}" if cfg.origin else ""
    return (
        f"data.dir={cfg.dir}: {what}; data=local reads {', '.join(p.name for p in expected)} "
        f"from it{origin}; point data.dir=... at a folder that holds them"
    )


def read_parallel(src_path: Path, tgt_path: Path) -> tuple[list[str], list[str]]:
    src: list[str] = []
    tgt: list[str] = []
    for a, b in read_parallel_chunks(src_path, tgt_path):
        src += a
        tgt += b
    return src, tgt


def read_parallel_chunks(src_path: Path, tgt_path: Path, size: int = CHUNK_LINES) -> Iterator[Chunk]:
    """Line-aligned files ``size`` lines at a time, stripped, checked as :func:`read_lines` checks one
    file (UTF-8, lines split on "\\n" only), and checked to have as many lines as each other."""
    with _open_binary(src_path) as fs, _open_binary(tgt_path) as ft:
        line, offsets = 0, [0, 0]
        while True:
            chunks = [_read_lines(f, path, size) for f, path in ((fs, src_path), (ft, tgt_path))]
            if len(chunks[0]) != len(chunks[1]):
                src_lines = line + len(chunks[0]) + sum(1 for _ in fs)
                tgt_lines = line + len(chunks[1]) + sum(1 for _ in ft)
                raise NMTError(
                    f"{src_path} has {src_lines} lines but {tgt_path} has {tgt_lines}; "
                    "the files must be line-aligned"
                )
            if not chunks[0]:
                return
            paths = (src_path, tgt_path)
            texts = [_decode_lines(raw, paths[i], line, offsets[i]) for i, raw in enumerate(chunks)]
            for i, raw in enumerate(chunks):
                offsets[i] += sum(map(len, raw))
            line += len(chunks[0])
            yield texts[0], texts[1]


def _open_binary(path: Path) -> Any:
    try:
        return open(path, "rb")  # noqa: SIM115 (the caller's with closes it; an open error must name the file)
    except OSError as e:
        raise NMTError(f"{path}: cannot read it ({e.strerror or e})") from None


def _read_lines(f: Any, path: Path, size: int) -> list[bytes]:
    try:
        return list(itertools.islice(f, size))
    except OSError as e:
        raise NMTError(f"{path}: reading failed ({e.strerror or e})") from None


def _decode_lines(raw: list[bytes], path: Path, first_line: int, first_byte: int) -> list[str]:
    """Stripped text of raw lines; a BOM at the very start of the file is dropped."""
    data = b"".join(raw)
    try:
        text = data.decode("utf-8-sig" if first_byte == 0 else "utf-8")
    except UnicodeDecodeError as e:
        line = first_line + data.count(b"\n", 0, e.start) + 1
        raise NMTError(f"{path}:{line}: invalid UTF-8 ({e.reason} at byte {first_byte + e.start})") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.strip() for line in lines]


def read_lines(path: Path) -> list[str]:
    """Lines split on "\\n" only: ``str.splitlines`` also breaks on U+0085 etc., which occur in WMT text."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise NMTError(f"{path}:{line}: invalid UTF-8 ({e.reason} at byte {e.start})") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.strip() for line in lines]
