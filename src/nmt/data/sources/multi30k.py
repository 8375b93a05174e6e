"""Multi30k task 1 (Elliott et al., 2016; 2017): English image captions with German, French and Czech
translations, from the multi30k/dataset repository at one commit, each file checked against its pinned
SHA-256 (:mod:`nmt.data.download`). Any direction between English and one of the others."""

from __future__ import annotations

from collections.abc import Iterator

from nmt.config import LocalDataConfig, Multi30kDataConfig
from nmt.data.download import MULTI30K_COMMIT, multi30k_dir
from nmt.data.sources import local
from nmt.data.sources.shapes import Chunk

REMOVE_HELD_OUT = True  # training pairs that are valid or test pairs are dropped
SCHEMA = Multi30kDataConfig


def resolve(cfg: Multi30kDataConfig) -> Multi30kDataConfig:
    return cfg


def pin(cfg: Multi30kDataConfig) -> Multi30kDataConfig:
    return cfg


def describe(cfg: Multi30kDataConfig) -> str:
    return f"Multi30k task 1 (multi30k/dataset@{MULTI30K_COMMIT}, SHA-256 pinned)"


def cache_key(cfg: Multi30kDataConfig, settings: dict) -> dict:
    """Pinned by digests, wherever the files are found: the folder and the mirror are not the key."""
    settings.pop("dir"), settings.pop("url")
    return settings


def read(cfg: Multi30kDataConfig, split: str) -> Iterator[Chunk]:
    folder = LocalDataConfig(dir=str(multi30k_dir(cfg, progress=True)), name=cfg.name)
    folder.src_lang, folder.tgt_lang = cfg.src_lang, cfg.tgt_lang
    return local.read(folder, split)
