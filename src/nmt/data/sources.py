"""Where parallel text comes from: Hugging Face ``datasets``, a folder of text files, or a toy task.

Every source returns the same shape, ``{split: {lang: lines}}`` for the splits train/valid/test and
both languages, so the rest of the pipeline does not care where the text came from.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from tqdm import tqdm

from nmt.config import DataConfig, HFDataConfig, LocalDataConfig, ToyDataConfig
from nmt.errors import NMTError

SPLITS = ("train", "valid", "test")
RawCorpus = dict[str, dict[str, list[str]]]


def load_source(cfg: DataConfig, progress: bool = False) -> RawCorpus:
    """Raw parallel text of every split, for the source named by ``cfg.source``."""
    loaders = {"hf": load_hf, "local": load_local, "toy": make_toy}
    if cfg.source not in loaders:
        raise NMTError(f"data.source={cfg.source!r}: expected one of {', '.join(loaders)}")
    return loaders[cfg.source](cfg, progress=progress)


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


def load_local(cfg: LocalDataConfig, progress: bool = False) -> RawCorpus:
    """``{dir}/{split}.{lang}``; the ``extra_train`` prefixes are appended to the training split."""
    expected = local_files(cfg)
    missing = [p for p in expected if not p.is_file()]
    if missing:
        listing = "\n".join(f"  {p}{'  (missing)' if p in missing else ''}" for p in expected)
        raise NMTError(
            f"data.dir={cfg.dir}: {len(missing)} of {len(expected)} expected files missing:\n{listing}"
        )
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
    """Stream the first ``train_size`` training pairs; valid/test are small and loaded whole.

    With ``data_files`` set, ``path`` names a datasets builder ("parquet", "json", ...) and
    ``data_files`` a file path or glob containing ``{split}``, filled in with the split names.
    """
    splits = {"train": cfg.train_split, "valid": cfg.valid_split, "test": cfg.test_split}
    corpus: RawCorpus = {}
    for split, hf_split in splits.items():
        rows = _hf_rows(cfg, hf_split, streaming=split == "train")
        if split == "train":
            rows = tqdm(
                rows, total=cfg.train_size, desc="streaming train", unit=" pairs", disable=not progress
            )
        corpus[split] = _hf_columns(cfg, hf_split, rows)
    return corpus


def _hf_rows(cfg: HFDataConfig, hf_split: str, streaming: bool):
    import datasets  # slow to import; only this source needs it

    what = f"{cfg.path} ({cfg.config_name}), split {hf_split!r}"
    kwargs: dict[str, Any] = {"split": hf_split, "streaming": streaming}
    if cfg.data_files:
        if "{split}" not in cfg.data_files:
            raise NMTError(f"data.data_files={cfg.data_files!r} must contain '{{split}}'")
        kwargs["data_files"] = {hf_split: cfg.data_files.replace("{split}", hf_split)}
        what = f"{cfg.path} files {kwargs['data_files'][hf_split]}"
    else:
        kwargs["name"] = cfg.config_name
    try:
        rows = datasets.load_dataset(cfg.path, **kwargs)
        return rows.take(cfg.train_size) if streaming else rows
    except Exception as e:  # network, hub and file errors all come as different types
        raise NMTError(
            f"could not load Hugging Face dataset {what}: {type(e).__name__}: {e}; {_hint(cfg)}"
        ) from None


def _hint(cfg: HFDataConfig) -> str:
    return (
        "check data.data_files" if cfg.data_files else "without internet access use data=local data.dir=..."
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
