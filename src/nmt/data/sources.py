"""Where parallel text comes from: Hugging Face ``datasets``, a folder of text files, Multi30k, or a toy task.

Every source gives the same shape: per split (train/valid/test), chunks of ``(source lines, target
lines)`` in the direction's order (:func:`source_chunks`), so the rest of the pipeline does not care
where the text came from, and a corpus of millions of pairs is never held whole. :func:`load_source`
collects them, for small corpora and tests.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import is_dataclass, replace
from pathlib import Path
from typing import Any

from nmt.config import DataConfig, HFDataConfig, LocalDataConfig, Multi30kDataConfig, ToyDataConfig
from nmt.data.download import multi30k_dir
from nmt.data.hub import COMMIT, Hub
from nmt.data.parquet import FsspecFile, RangeFile, read_parquet, sample_parquet
from nmt.errors import NMTError

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
RawCorpus = dict[str, dict[str, list[str]]]
Chunk = tuple[list[str], list[str]]  # source lines, target lines
CHUNK_LINES = 10_000  # lines read at a time from local files


def source_chunks(cfg: DataConfig, split: str) -> Iterator[Chunk]:
    """The raw pairs of ``split`` in chunks, for the source named by ``cfg.source`` (resolved first:
    see :func:`resolve_source`)."""
    cfg = resolve_source(cfg)
    return READERS[cfg.source](cfg, split)


def load_source(cfg: DataConfig) -> RawCorpus:
    """Raw parallel text of every split, whole: for small corpora (the pipeline streams chunks)."""
    cfg = resolve_source(cfg)
    corpus: RawCorpus = {}
    for split in SPLITS:
        src: list[str] = []
        tgt: list[str] = []
        for a, b in source_chunks(cfg, split):
            src += a
            tgt += b
        corpus[split] = {cfg.src_lang: src, cfg.tgt_lang: tgt}
    return corpus


def resolve_source(cfg: DataConfig) -> DataConfig:
    """The config actually read: ``cfg``, or for local files that are missing and a preset that allows
    it (``data.hub_fallback_pairs``), the WMT14 subset of that size from the Hugging Face hub; for
    the hub, with ``data.revision`` the commit it names (a branch is resolved, once per process)."""
    if cfg.source == "hf":
        return _pin_revision(cfg)
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


def _multi30k_chunks(cfg: Multi30kDataConfig, split: str) -> Iterator[Chunk]:
    local = LocalDataConfig(dir=str(multi30k_dir(cfg, progress=True)), name=cfg.name)
    local.src_lang, local.tgt_lang = cfg.src_lang, cfg.tgt_lang
    return _local_chunks(local, split)


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
    return [p for p in local_files(cfg) if not p.exists()]  # a folder in its place: "cannot read it"


def _local_chunks(cfg: LocalDataConfig, split: str) -> Iterator[Chunk]:
    missing = missing_local_files(cfg)
    if missing:
        raise NMTError(_missing_message(cfg, missing))
    for prefix in _local_prefixes(cfg):
        if (prefix if prefix in SPLITS else "train") == split:
            yield from read_parallel_chunks(
                Path(cfg.dir) / f"{prefix}.{cfg.src_lang}", Path(cfg.dir) / f"{prefix}.{cfg.tgt_lang}"
            )


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


# ------------------------------------------------------------------------------ Hugging Face datasets


def _hf_chunks(cfg: HFDataConfig, split: str) -> Iterator[Chunk]:
    """Training: ``train_size`` pairs drawn from all training files (:func:`sample_parquet`), a row
    group at a time; valid/test read whole from their own files. Only the row groups read are fetched
    (nmt.data.parquet), from the hub at the commit ``data.revision`` names (nmt.data.hub), or with
    ``data_files`` set from those files: ``path`` then names a datasets builder ("parquet", "json",
    ...) and ``data_files`` a path or glob containing ``{split}``."""
    hf_split = {"train": cfg.train_split, "valid": cfg.valid_split, "test": cfg.test_split}[split]
    where = _hf_what(cfg, hf_split)
    try:
        files = _hf_files(cfg, hf_split)
        if files is None:  # data_files that are not parquet: valid/test through datasets
            columns = _hf_columns(cfg, hf_split, _hf_rows(cfg, hf_split))
            yield columns[cfg.src_lang], columns[cfg.tgt_lang]
            return
        if split == "train":
            tables = sample_parquet(files, cfg.train_size, cfg.seed, desc=f"drawing {hf_split}")
        else:
            tables = read_parquet(files)
        for table in tables:
            yield _arrow_columns(cfg, hf_split, table)
    except NMTError:
        raise
    except Exception as e:  # network, hub and file errors come as many types
        raise NMTError(f"could not read {where}: {_one_line(e)}; {_hint(cfg, e)}") from None


def _hf_what(cfg: HFDataConfig, hf_split: str) -> str:
    """The split's origin, as errors name it."""
    if cfg.data_files:
        return f"{cfg.path} files {cfg.data_files.replace('{split}', hf_split)}"
    return (
        f"Hugging Face dataset {cfg.path} ({cfg.config_name}) at revision {cfg.revision}, split {hf_split!r}"
    )


def _hf_files(cfg: HFDataConfig, hf_split: str) -> list[RangeFile] | None:
    """The parquet files of a split: the hub's at the pinned commit (from the dataset card's
    ``configs:``), or those ``data_files`` names; None for ``data_files`` that are not parquet
    (valid/test only: training draws from parquet row groups)."""
    if not cfg.data_files:
        quiet_hub()
        hub = _hub(cfg)
        return hub.split_files(hub_commit(cfg), cfg.config_name, hf_split)
    paths = _hf_data_files(cfg, hf_split)
    if all(p.endswith(".parquet") for p in paths):
        return [FsspecFile(p) for p in paths]
    if hf_split == cfg.train_split:
        raise NMTError(
            f"{cfg.path}: the training files must be parquet to draw data.train_size pairs from all of them, "
            f"got {paths[:3]}"
        )
    return None


def _hub(cfg: HFDataConfig) -> Hub:
    return Hub(cfg.path, cfg.hub_timeout_s, cfg.hub_retries)


def hub_commit(cfg: HFDataConfig) -> str:
    """The commit ``data.revision`` names: itself when it is one (no request), else asked of the hub
    once per process and logged."""
    if COMMIT.fullmatch(cfg.revision):
        return cfg.revision
    key = (_hub(cfg).endpoint, cfg.path, cfg.revision)
    if key not in _RESOLVED:
        quiet_hub()
        try:
            _RESOLVED[key] = _hub(cfg).commit(cfg.revision)
        except NMTError:
            raise
        except Exception as e:
            raise NMTError(
                f"could not resolve data.revision={cfg.revision} of Hugging Face dataset {cfg.path}: "
                f"{_one_line(e)}; {_hint(cfg, e)}"
            ) from None
        log.info("data.revision=%s of %s is commit %s", cfg.revision, cfg.path, _RESOLVED[key])
    return _RESOLVED[key]


_RESOLVED: dict[tuple[str, str, str], str] = {}


def _pin_revision(cfg: HFDataConfig) -> HFDataConfig:
    """``cfg`` with ``revision`` a commit, so the prepared corpus is keyed by what was read."""
    if cfg.data_files or COMMIT.fullmatch(cfg.revision):
        return cfg
    commit = hub_commit(cfg)
    if is_dataclass(cfg):
        return replace(cfg, revision=commit)
    pinned = cfg.copy()  # a DictConfig from a script
    pinned.revision = commit
    return pinned


def _arrow_columns(cfg: HFDataConfig, hf_split: str, table: Any) -> Chunk:
    """The two languages of a ``translation`` struct column, as lists of stripped strings."""
    import pyarrow.compute as pc

    names = table.schema.names
    fields = [f.name for f in table.schema.field("translation").type] if "translation" in names else []
    for key in ("translation", cfg.src_lang, cfg.tgt_lang):
        if key not in names + fields:
            raise NMTError(
                f"{cfg.path}, split {hf_split!r}: rows must look like {{'translation': "
                f"{{'{cfg.src_lang}': ..., '{cfg.tgt_lang}': ...}}}}; missing key '{key}'"
            )
    pairs = table.column("translation")
    src, tgt = (
        [text.strip() for text in pc.struct_field(pairs, lang).to_pylist()]
        for lang in (cfg.src_lang, cfg.tgt_lang)
    )
    return src, tgt


def _hf_data_files(cfg: HFDataConfig, hf_split: str) -> list[str]:
    """The files ``data_files`` names for a split, resolved by ``datasets`` as it would load them."""
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
    """``load(datasets, kwargs)`` for the split's ``data_files``; any failure as one NMTError."""
    import datasets  # slow to import; only data_files needs it

    quiet_hub()
    if "{split}" not in cfg.data_files:
        raise NMTError(f"data.data_files={cfg.data_files!r} must contain '{{split}}'")
    files = cfg.data_files.replace("{split}", hf_split)
    try:
        return load(datasets, {"data_files": {hf_split: files}})
    except Exception as e:  # file errors come as different types
        raise NMTError(
            f"could not load Hugging Face dataset {cfg.path} files {files}: {_one_line(e)}; {_hint(cfg, e)}"
        ) from None


def quiet_hub() -> None:
    """No retry chatter from the hub client and no line per HTTP request: a failure is reported once,
    as an NMTError, and what was read is logged a line per file."""
    from huggingface_hub.utils import logging as hub_logging

    hub_logging.set_verbosity_error()
    for name in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _one_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _hint(cfg: HFDataConfig, error: Exception | None = None) -> str:
    if cfg.data_files:
        return "check data.data_files"
    if getattr(getattr(error, "response", None), "status_code", None) == 404:
        return (
            f"check data.path={cfg.path}, data.config_name={cfg.config_name} and "
            f"data.revision={cfg.revision} (a commit, branch or tag of the dataset on the hub)"
        )
    return (
        "run again to retry; without internet access use local files: experiment=multi30k_cpu data.dir=... "
        "(a copy of Multi30k), experiment=wmt14_subset_cpu data.dir=..., or data=local data.dir=..."
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
            f"{cfg.path}, split {hf_split!r}: reading failed: {_one_line(e)}; {_hint(cfg, e)}"
        ) from None
    return out


# -------------------------------------------------------------------------------------------- toy


TOY_LANGS = ("src", "tgt")
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def make_toy(cfg: ToyDataConfig) -> RawCorpus:
    """A learnable synthetic task: translate word by word through an invented lexicon, then swap
    adjacent word pairs ("a b c d e" -> "B A D C E"; ``cfg.swap_pairs=False``: "A B C D E").

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
    reorder = _swap_pairs if cfg.swap_pairs else list
    corpus: RawCorpus = {}
    for split, size in (("train", cfg.train_size), ("valid", cfg.valid_size), ("test", cfg.test_size)):
        sentences = [rng.choices(source_words, k=rng.randint(cfg.min_len, cfg.max_len)) for _ in range(size)]
        corpus[split] = {
            "src": [" ".join(s) for s in sentences],
            "tgt": [" ".join(reorder([lexicon[w] for w in s])) for s in sentences],
        }
    return corpus


def _toy_chunks(cfg: ToyDataConfig, split: str) -> Iterator[Chunk]:
    """The toy task is small: made whole, handed out as one chunk."""
    corpus = make_toy(cfg)[split]
    yield corpus[cfg.src_lang], corpus[cfg.tgt_lang]


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


# The readers, by the data.source choices (nmt.config.DataConfig; checked at start).
READERS: dict[str, Callable[[Any, str], Iterator[Chunk]]] = {
    "hf": _hf_chunks,
    "local": _local_chunks,
    "multi30k": _multi30k_chunks,
    "toy": _toy_chunks,
}
