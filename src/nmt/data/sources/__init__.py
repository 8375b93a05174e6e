"""Where parallel text comes from: one module per source kind, and the registry that picks one by
``data.source``.

Every source gives the same shape: per split (train/valid/test), chunks of ``(source lines, target
lines)`` in the direction's order (:func:`source_chunks`), so the rest of the pipeline does not care
where the text came from, and a corpus of millions of pairs is never held whole. Each source module
owns its reader (``read``), what of its settings keys the prepared cache (``cache_key``), what it
actually reads (``resolve``: a hub branch pinned to its commit, a missing folder's fallback), the
config a checkpoint records (``pin``), a line for reports (``describe``), and its checks and messages.
Its schema (``SCHEMA``) lives with the other settings in :mod:`nmt.config`, which is checked before any
data module is imported. A new source is one module and one line in :data:`SOURCES`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType

from nmt.config import DataConfig, keyed_by_choices
from nmt.data.sources import hub, local, multi, multi30k, toy
from nmt.data.sources.local import local_files, read_lines, read_parallel, read_parallel_chunks
from nmt.data.sources.shapes import SPLITS, Chunk, RawCorpus
from nmt.data.sources.toy import make_toy

# The sources, by the data.source choices (nmt.config.DataConfig; checked at start).
SOURCES: dict[str, ModuleType] = keyed_by_choices(
    DataConfig, "source", {"hf": hub, "local": local, "multi": multi, "multi30k": multi30k, "toy": toy}
)


def source_of(cfg: DataConfig) -> ModuleType:
    return SOURCES[cfg.source]


def resolve_source(cfg: DataConfig) -> DataConfig:
    """The config actually read (see each source's ``resolve``); may differ in kind from ``cfg``."""
    return source_of(cfg).resolve(cfg)


def pin_source(cfg: DataConfig) -> DataConfig:
    """``cfg`` naming the exact data it reads (a hub branch as its commit): what checkpoints record."""
    return source_of(cfg).pin(cfg)


def describe_source(cfg: DataConfig) -> str:
    """The data read, in a line: for reports."""
    return source_of(cfg).describe(cfg)


def removes_held_out(cfg: DataConfig) -> bool:
    """Whether training pairs that are also valid or test pairs are removed from training."""
    rule = source_of(cfg).REMOVE_HELD_OUT
    return rule(cfg) if callable(rule) else rule


def held_out_key(cfg: DataConfig) -> Callable[[str, str], tuple]:
    """What of a pair is compared with the held-out pairs: the pair (a source's own rule else)."""
    return getattr(source_of(cfg), "held_out_key", _pair)


def _pair(src: str, tgt: str) -> tuple:
    return ((src, tgt),)


def grouped_chunks(cfg: DataConfig, split: str) -> Iterator[tuple[int, Chunk]]:
    """``source_chunks`` with the index of the corpus each chunk is from: 0, but for several corpora
    (data.source=multi), whose lines the pipeline tags once clean (:func:`source_tagger`)."""
    cfg = resolve_source(cfg)
    module = source_of(cfg)
    if hasattr(module, "read_grouped"):
        return module.read_grouped(cfg, split)
    return ((0, chunk) for chunk in module.read(cfg, split))


def source_tagger(cfg: DataConfig) -> Callable[[int, list[str]], list[str]] | None:
    """What tags a group's source lines (None: a bilingual corpus, untagged)."""
    module = source_of(cfg)
    return module.tagger(cfg) if hasattr(module, "tagger") else None


def source_tags(cfg: DataConfig) -> tuple[str, ...]:
    """The target-language tags of the corpus (none for a bilingual one)."""
    module = source_of(cfg)
    return module.tags(cfg) if hasattr(module, "tags") else ()


def source_directions(cfg: DataConfig) -> list[tuple[str, str]]:
    """The directions of the corpus, in the order of its groups."""
    module = source_of(cfg)
    return module.directions(cfg) if hasattr(module, "directions") else [(cfg.src_lang, cfg.tgt_lang)]


def source_chunks(cfg: DataConfig, split: str) -> Iterator[Chunk]:
    """The raw pairs of ``split`` in chunks, as the (resolved) source reads them."""
    cfg = resolve_source(cfg)
    return source_of(cfg).read(cfg, split)


def cache_key(cfg: DataConfig, settings: dict) -> dict:
    """``settings`` (the resolved config as a dict) less what does not change the text read, plus what
    does that the config does not say (a local file's size and time), by the source's rule."""
    return source_of(cfg).cache_key(cfg, settings)


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


__all__ = [
    "SOURCES",
    "SPLITS",
    "Chunk",
    "RawCorpus",
    "cache_key",
    "grouped_chunks",
    "held_out_key",
    "source_directions",
    "source_tagger",
    "source_tags",
    "describe_source",
    "pin_source",
    "load_source",
    "local_files",
    "make_toy",
    "read_lines",
    "removes_held_out",
    "read_parallel",
    "read_parallel_chunks",
    "resolve_source",
    "source_chunks",
]
