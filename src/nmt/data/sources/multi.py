"""Several corpora in one model: each entry of ``data.corpora`` is a data config of its own source and
direction. Their splits are read one corpus after the other, each chunk labelled with its corpus (its
group), and the source lines get their target language's tag after cleaning (:mod:`nmt.text.tags`). A pair
whose source or target sentence is in any direction's valid or test is kept out of every direction's
training (when any of the corpora's sources keeps its held-out pairs out), counted as
``in_valid_test``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from nmt.cache import config_dict
from nmt.config import MultiDataConfig, corpus_configs, with_absolute_folders
from nmt.data.sources.shapes import Chunk
from nmt.text.tags import Direction, tag, tagged, untagged

SCHEMA = MultiDataConfig


def _sources():  # the registry imports this module: the other sources are looked up when needed
    from nmt.data import sources

    return sources


def directions(cfg: MultiDataConfig) -> list[Direction]:
    """The corpora's directions, in order: the groups of the prepared text."""
    return [(c.src_lang, c.tgt_lang) for c in corpus_configs(cfg)]


def REMOVE_HELD_OUT(cfg: MultiDataConfig) -> bool:  # noqa: N802 (the sources' constant, per config here)
    return any(_sources().removes_held_out(c) for c in corpus_configs(cfg))


def held_out_key(src: str, tgt: str) -> tuple[str, ...]:
    """Sentences, not pairs: en->de's test English is also en->fr's, and de->fr's zero-shot test."""
    return (untagged(src), tgt)


def tags(cfg: MultiDataConfig) -> tuple[str, ...]:
    """The target-language tags, SentencePiece user-defined symbols."""
    return tuple(dict.fromkeys(tag(tgt) for _, tgt in directions(cfg)))


def tagger(cfg: MultiDataConfig) -> Callable[[int, list[str]], list[str]]:
    langs = [tgt for _, tgt in directions(cfg)]
    return lambda group, lines: tagged(langs[group], lines)


def resolve(cfg: MultiDataConfig) -> MultiDataConfig:
    return cfg


def pin(cfg: MultiDataConfig) -> MultiDataConfig:
    """Every corpus pinned (a hub branch as its commit) and its folders absolute, whole."""
    sources = _sources()
    pinned = [config_dict(sources.pin_source(with_absolute_folders(c))) for c in corpus_configs(cfg)]
    return dataclasses.replace(cfg, corpora=pinned)


def describe(cfg: MultiDataConfig) -> str:
    sources = _sources()
    parts = [f"{c.src_lang}->{c.tgt_lang}: {sources.describe_source(c)}" for c in corpus_configs(cfg)]
    return f"{len(parts)} corpora (temperature {cfg.temperature:g}): " + "; ".join(parts)


def cache_key(cfg: MultiDataConfig, settings: dict) -> dict:
    """Each corpus by its own source's rule, with its direction (it decides the tag); not the
    temperature, which draws from the text but does not change it."""
    sources = _sources()
    settings.pop("temperature", None)
    keyed = []
    for corpus in corpus_configs(cfg):
        own = config_dict(corpus)
        for key in ("name", "cache_dir", "workers"):
            own.pop(key, None)
        keyed.append(sources.cache_key(corpus, own))
    settings["corpora"] = keyed
    return settings


def read_grouped(cfg: MultiDataConfig, split: str) -> Iterator[tuple[int, Chunk]]:
    """Each corpus's chunks of ``split`` in turn, with the corpus's index (untagged: tagged once clean)."""
    sources = _sources()
    for group, corpus in enumerate(corpus_configs(cfg)):
        for chunk in sources.source_chunks(corpus, split):
            yield group, chunk


def read(cfg: MultiDataConfig, split: str) -> Iterator[Chunk]:
    """The chunks tagged, uncleaned: for readers of whole splits (the pipeline tags them once clean)."""
    tag_lines = tagger(cfg)
    for group, (src, tgt) in read_grouped(cfg, split):
        yield tag_lines(group, src), tgt
