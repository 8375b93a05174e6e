"""Where parallel text comes from: Hugging Face ``datasets``, a folder of text files, or a toy task.

Every source returns the same shape, ``{split: {lang: lines}}`` for the splits train/valid/test and
both languages, so the rest of the pipeline does not care where the text came from.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from nmt.config import DataConfig, HFDataConfig, LocalDataConfig, Multi30kDataConfig, ToyDataConfig
from nmt.data.download import multi30k_dir
from nmt.errors import NMTError

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
RawCorpus = dict[str, dict[str, list[str]]]


def load_source(cfg: DataConfig, progress: bool = False) -> RawCorpus:
    """Raw parallel text of every split, for the source named by ``cfg.source``."""
    cfg = resolve_source(cfg)
    loaders = {"hf": load_hf, "local": load_local, "multi30k": load_multi30k, "toy": make_toy}
    if cfg.source not in loaders:
        raise NMTError(f"data.source={cfg.source!r}: expected one of {', '.join(loaders)}")
    return loaders[cfg.source](cfg, progress=progress)


def resolve_source(cfg: DataConfig) -> DataConfig:
    """The config actually read: ``cfg``, or for local files that are missing and a preset that allows
    it (``data.hub_fallback_pairs``), the WMT14 subset of that size from the Hugging Face hub."""
    if cfg.source != "local" or not cfg.hub_fallback_pairs or not missing_local_files(cfg):
        return cfg
    log.warning(
        "data.dir=%s lacks its files: drawing %d training pairs from WMT14 on the Hugging Face hub instead "
        "(data.hub_fallback_pairs; newstest2013 valid, newstest2014 test)",
        cfg.dir,
        cfg.hub_fallback_pairs,
    )
    return HFDataConfig(
        cache_dir=cfg.cache_dir,
        src_lang=cfg.src_lang,
        tgt_lang=cfg.tgt_lang,
        clean=cfg.clean,
        train_size=cfg.hub_fallback_pairs,
    )


def load_multi30k(cfg: Multi30kDataConfig, progress: bool = False) -> RawCorpus:
    """Multi30k from ``data.dir``, the download cache or a download (nmt.data.download)."""
    folder = multi30k_dir(cfg, progress=progress)
    return load_local(
        LocalDataConfig(dir=str(folder), name=cfg.name, src_lang=cfg.src_lang, tgt_lang=cfg.tgt_lang)
    )


# -------------------------------------------------------------------------------------- local files


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
    return [p for p in local_files(cfg) if not p.is_file()]


def load_local(cfg: LocalDataConfig, progress: bool = False) -> RawCorpus:
    """``{dir}/{split}.{lang}``; the ``extra_train`` prefixes are appended to the training split."""
    missing = missing_local_files(cfg)
    if missing:
        raise NMTError(_missing_message(cfg, missing))
    langs = (cfg.src_lang, cfg.tgt_lang)
    corpus: RawCorpus = {split: {lang: [] for lang in langs} for split in SPLITS}
    for prefix in _local_prefixes(cfg):
        split = prefix if prefix in SPLITS else "train"
        src, tgt = read_parallel(
            Path(cfg.dir) / f"{prefix}.{langs[0]}", Path(cfg.dir) / f"{prefix}.{langs[1]}"
        )
        corpus[split][langs[0]] += src
        corpus[split][langs[1]] += tgt
    return corpus


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
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise NMTError(
            f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}; the files must be line-aligned"
        )
    return src, tgt


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


# ------------------------------------------------------------------------------ Hugging Face datasets


def load_hf(cfg: HFDataConfig, progress: bool = False) -> RawCorpus:
    """A training subset of ``train_size`` pairs drawn from all training files (see
    :func:`sample_parquet`); valid/test are small and loaded whole.

    With ``data_files`` set, ``path`` names a datasets builder ("parquet", "json", ...) and
    ``data_files`` a file path or glob containing ``{split}``, filled in with the split names.
    """
    files = _hf_data_files(cfg, cfg.train_split)
    if not all(f.endswith(".parquet") for f in files):
        raise NMTError(
            f"{cfg.path}: the training files must be parquet to draw data.train_size pairs from all of them, "
            f"got {files[:3]}"
        )
    rows = sample_parquet(files, cfg.train_size, cfg.seed)
    rows = tqdm(rows, total=cfg.train_size, desc="sampling train", unit=" pairs", disable=not progress)
    corpus = {"train": _hf_columns(cfg, cfg.train_split, rows)}
    for split, hf_split in (("valid", cfg.valid_split), ("test", cfg.test_split)):
        corpus[split] = _hf_columns(cfg, hf_split, _hf_rows(cfg, hf_split))
    return corpus


def sample_parquet(files: list[str], n: int, seed: int) -> Iterator[dict]:
    """``n`` rows drawn from all ``files`` in proportion to their sizes, deterministic for ``seed``.

    WMT14's training split is written corpus after corpus (Europarl, then CommonCrawl, then News
    Commentary), so its first rows are one corpus only. Here each file gets its share of ``n``; from
    each file, row groups are read in a seeded random order until they hold that share, and the share is
    drawn from them. Only those row groups are read (from the hub: downloaded), so memory and traffic
    stay near ``n`` rows, not the 4.5M of the whole split. ``n`` >= the total means every row.
    """
    import fsspec  # comes with datasets
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    with contextlib.ExitStack() as stack:
        parquet = [pq.ParquetFile(stack.enter_context(fsspec.open(f, "rb"))) for f in files]
        quotas = _proportional([p.metadata.num_rows for p in parquet], n)
        for pf, quota in zip(parquet, quotas):
            if quota == 0:
                continue
            groups, rows = [], 0
            for g in rng.permutation(pf.metadata.num_row_groups).tolist():
                groups.append(g)
                rows += pf.metadata.row_group(g).num_rows
                if rows >= quota:
                    break
            table = pf.read_row_groups(sorted(groups))
            yield from table.take(np.sort(rng.choice(table.num_rows, quota, replace=False))).to_pylist()


def _proportional(sizes: list[int], n: int) -> list[int]:
    """Split ``n`` over parts of these sizes in proportion (largest remainders), none above its size."""
    total = sum(sizes)
    if n >= total:
        return list(sizes)
    exact = [n * size / total for size in sizes]
    quotas = [int(x) for x in exact]
    by_remainder = sorted(range(len(sizes)), key=lambda i: quotas[i] - exact[i])
    for i in by_remainder[: n - sum(quotas)]:
        quotas[i] += 1
    return quotas


def _hf_data_files(cfg: HFDataConfig, hf_split: str) -> list[str]:
    """The files behind a split (hub URLs or local paths), resolved by ``datasets`` as it would load them."""
    return _hf_call(
        cfg,
        hf_split,
        lambda datasets, kwargs: [
            str(f) for f in datasets.load_dataset_builder(cfg.path, **kwargs).config.data_files[hf_split]
        ],
    )


def _hf_rows(cfg: HFDataConfig, hf_split: str):
    return _hf_call(
        cfg, hf_split, lambda datasets, kwargs: datasets.load_dataset(cfg.path, split=hf_split, **kwargs)
    )


def _hf_call(cfg: HFDataConfig, hf_split: str, load: Callable[[Any, dict[str, Any]], Any]) -> Any:
    """``load(datasets, kwargs)`` for the split; any failure (network, hub, files) as one NMTError."""
    import datasets  # slow to import; only this source needs it

    quiet_hub()
    what, kwargs = _hf_where(cfg, hf_split)
    try:
        return load(datasets, kwargs)
    except Exception as e:  # network, hub and file errors all come as different types
        raise NMTError(
            f"could not load Hugging Face dataset {what}: {type(e).__name__}: {e}; {_hint(cfg)}"
        ) from None


def _hf_where(cfg: HFDataConfig, hf_split: str) -> tuple[str, dict[str, Any]]:
    """A description of the split's origin, and the ``datasets`` arguments that name it."""
    if cfg.data_files:
        if "{split}" not in cfg.data_files:
            raise NMTError(f"data.data_files={cfg.data_files!r} must contain '{{split}}'")
        files = cfg.data_files.replace("{split}", hf_split)
        return f"{cfg.path} files {files}", {"data_files": {hf_split: files}}
    return f"{cfg.path} ({cfg.config_name}), split {hf_split!r}", {"name": cfg.config_name}


def quiet_hub() -> None:
    """No retry chatter from the hub client: a failure is reported once, as an NMTError."""
    import huggingface_hub

    huggingface_hub.utils.logging.set_verbosity_error()


def _hint(cfg: HFDataConfig) -> str:
    if cfg.data_files:
        return "check data.data_files"
    return (
        "without internet access use local files: experiment=multi30k_cpu data.dir=... (a copy of "
        "Multi30k), experiment=wmt14_subset_cpu data.dir=..., or data=local data.dir=..."
    )


def _hf_columns(cfg: HFDataConfig, hf_split: str, rows) -> dict[str, list[str]]:
    langs = (cfg.src_lang, cfg.tgt_lang)
    out: dict[str, list[str]] = {lang: [] for lang in langs}
    try:
        for row in rows:
            pair = row["translation"]
            for lang in langs:
                out[lang].append(pair[lang].strip())
    except KeyError as e:
        raise NMTError(
            f"{cfg.path}, split {hf_split!r}: rows must look like {{'translation': {{'{langs[0]}': ..., "
            f"'{langs[1]}': ...}}}}; missing key {e}"
        ) from None
    except Exception as e:
        raise NMTError(
            f"{cfg.path}, split {hf_split!r}: reading failed: {type(e).__name__}: {e}; {_hint(cfg)}"
        ) from None
    return out


# -------------------------------------------------------------------------------------------- toy


TOY_LANGS = ("src", "tgt")
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def make_toy(cfg: ToyDataConfig, progress: bool = False) -> RawCorpus:
    """A learnable synthetic task: translate word by word through an invented lexicon, then swap
    adjacent word pairs ("a b c d e" -> "B A D C E").

    Everything follows from ``cfg.seed``. The languages are always "src" and "tgt" (swap them for
    the inverse task).
    """
    if {cfg.src_lang, cfg.tgt_lang} != set(TOY_LANGS):
        raise NMTError(f"data=toy has languages src and tgt, got {cfg.src_lang!r} and {cfg.tgt_lang!r}")
    if not 1 <= cfg.min_len <= cfg.max_len:
        raise NMTError(
            f"data.min_len={cfg.min_len}, data.max_len={cfg.max_len}: need 1 <= min_len <= max_len"
        )
    rng = random.Random(cfg.seed)
    words = _invent_words(rng, 2 * cfg.vocab_words)
    lexicon = dict(zip(words[: cfg.vocab_words], words[cfg.vocab_words :]))
    source_words = list(lexicon)
    corpus: RawCorpus = {}
    for split, size in (("train", cfg.train_size), ("valid", cfg.valid_size), ("test", cfg.test_size)):
        sentences = [rng.choices(source_words, k=rng.randint(cfg.min_len, cfg.max_len)) for _ in range(size)]
        corpus[split] = {
            "src": [" ".join(s) for s in sentences],
            "tgt": [" ".join(_swap_pairs([lexicon[w] for w in s])) for s in sentences],
        }
    return corpus


def _invent_words(rng: random.Random, n: int) -> list[str]:
    """n distinct pronounceable words of 2-3 consonant-vowel syllables, in order of invention."""
    words: dict[str, None] = {}
    while len(words) < n:
        syllables = rng.randint(2, 3)
        words["".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables))] = None
    return list(words)


def _swap_pairs(words: list[str]) -> list[str]:
    out = list(words)
    for i in range(0, len(words) - 1, 2):
        out[i], out[i + 1] = words[i + 1], words[i]
    return out
