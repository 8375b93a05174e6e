"""Prepare a corpus once, reuse it on every later run: cleaned text, tokenizer, encoded ids.

Layout under ``{cache_dir}/{name}/``::

    text-<data hash>/                  one folder per data setting (source, files, sizes, cleaning)
        meta.json                      the settings and the counts of kept/dropped pairs
        {train,valid,test}.{lang}      cleaned text of BOTH languages, one sentence per line
        tokenizer-<hash>/              SentencePiece model(s), see nmt.tokenizer.train_tokenizer
        ids-<tokenizer fingerprint>/   {split}.{lang}.ids.npy (flat int32) + .offsets.npy (int64)
        samples-<fingerprint>-<hash>/  train{k}.{lang}.*.npy: sampled segmentations of the training
                                       split (tokenizer.sampling_alpha > 0), one per k < sampled_copies

The data hash ignores the translation direction, so en->de and de->en share the text (and, with a
joint tokenizer, the encoded ids too). Each folder is written atomically and never modified, so its
existence means it is complete; changed settings simply get a new folder.
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from nmt.cache import atomic_dir, config_dict, hash_key
from nmt.config import DataConfig, TokenizerConfig
from nmt.data.clean import clean_pairs
from nmt.data.sources import SPLITS, load_source, local_files, read_lines, resolve_source
from nmt.errors import NMTError
from nmt.tokenizer import Tokenizer, train_tokenizer

log = logging.getLogger(__name__)


class EncodedSplit:
    """Token ids (no BOS/EOS) of one split as flat arrays plus offsets: opening a memory-mapped split
    costs nothing, whatever its size."""

    def __init__(
        self, src_ids: np.ndarray, src_offsets: np.ndarray, tgt_ids: np.ndarray, tgt_offsets: np.ndarray
    ):
        if len(src_offsets) != len(tgt_offsets):
            raise ValueError("source and target have different numbers of sentences")
        self._src_ids, self._src_offsets = src_ids, src_offsets
        self._tgt_ids, self._tgt_offsets = tgt_ids, tgt_offsets
        self.src_lengths: np.ndarray = np.diff(src_offsets)
        self.tgt_lengths: np.ndarray = np.diff(tgt_offsets)

    @classmethod
    def load(cls, folder: Path, split: str, src_lang: str, tgt_lang: str) -> EncodedSplit:
        def arrays(lang: str) -> tuple[np.ndarray, np.ndarray]:
            return tuple(
                np.load(folder / f"{split}.{lang}.{kind}.npy", mmap_mode="r") for kind in ("ids", "offsets")
            )

        return cls(*arrays(src_lang), *arrays(tgt_lang))

    def __len__(self) -> int:
        return len(self.src_lengths)

    def src(self, i: int) -> np.ndarray:
        return self._src_ids[self._src_offsets[i] : self._src_offsets[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self._tgt_ids[self._tgt_offsets[i] : self._tgt_offsets[i + 1]]


@dataclass
class PreparedData:
    root: Path  # the text-<hash> folder
    tokenizer: Tokenizer
    splits: dict[str, EncodedSplit]  # "train", "valid", "test"
    summary: dict  # pairs per split, dropped per reason, vocab size, tokens per split, mean lengths
    src_lang: str
    tgt_lang: str
    train_copies: list[EncodedSplit] = field(default_factory=list)  # sampled segmentations of "train"

    @property
    def train_segmentations(self) -> list[EncodedSplit]:
        """What the epochs train on in turn (epoch e: item e % len): the sampled copies, or the one best
        segmentation when subword sampling is off. Same sentences in the same order in each."""
        return self.train_copies or [self.splits["train"]]

    def raw(self, split: str) -> tuple[list[str], list[str]]:
        """Cleaned source and reference text, in corpus order (the references for BLEU)."""
        return read_lines(self.root / f"{split}.{self.src_lang}"), read_lines(
            self.root / f"{split}.{self.tgt_lang}"
        )


def prepare_corpus(data_cfg: DataConfig, tok_cfg: TokenizerConfig, progress: bool = True) -> PreparedData:
    """Text, tokenizer and encoded ids for ``data_cfg.src_lang -> data_cfg.tgt_lang``, from the cache
    when present (seconds), otherwise built and cached."""
    src, tgt = data_cfg.src_lang, data_cfg.tgt_lang
    if src == tgt:
        raise NMTError(f"data.src_lang and data.tgt_lang are both {src!r}")
    sampling = tok_cfg.sampling_alpha > 0
    with tqdm(total=3 + sampling, desc="preparing data", unit="step", disable=not progress) as bar:
        bar.set_postfix_str("text")
        root = _prepare_text(data_cfg, progress)
        bar.update()
        bar.set_postfix_str("tokenizer")
        tokenizer = train_tokenizer(tok_cfg, root / f"train.{src}", root / f"train.{tgt}", root)
        bar.update()
        bar.set_postfix_str("encoding")
        ids_dir = _encode(root, tokenizer, src, tgt)
        bar.update()
        copies = []
        if sampling:
            bar.set_postfix_str("sampling")
            copies = _sample_train(root, tokenizer, tok_cfg, src, tgt)
            bar.update()
    splits = {split: EncodedSplit.load(ids_dir, split, src, tgt) for split in SPLITS}
    meta = json.loads((root / "meta.json").read_text())
    summary = _summary(data_cfg, root, tokenizer, splits, meta, copies)
    return PreparedData(root, tokenizer, splits, summary, src, tgt, copies)


# ----------------------------------------------------------------------------------------------- text


def _text_settings(cfg: DataConfig) -> dict:
    """Everything that changes the cleaned text; not the direction, nor where the cache lives."""
    settings = config_dict(cfg)
    for key in ("name", "cache_dir", "src_lang", "tgt_lang"):
        settings.pop(key, None)
    settings["langs"] = sorted([cfg.src_lang, cfg.tgt_lang])
    settings["text_version"] = 2  # version 1 dropped empty valid/test pairs: its text must not be reused
    if cfg.source == "multi30k":  # pinned by digests, wherever the files are found
        settings.pop("dir"), settings.pop("url")
    if cfg.source == "local":
        settings.pop("origin"), settings.pop("hub_fallback_pairs")  # said or used only without the files
        settings["dir"] = str(Path(cfg.dir).resolve())
        # Sorted by name: local_files lists them in the direction's order, the key must not follow it.
        settings["files"] = sorted(
            [p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in local_files(cfg) if p.is_file()
        )
    return settings


def _prepare_text(cfg: DataConfig, progress: bool) -> Path:
    name, cfg = cfg.name, resolve_source(cfg)
    settings = _text_settings(cfg)
    root = Path(cfg.cache_dir) / name / f"text-{hash_key(settings)}"
    if root.is_dir():
        return root
    log.info("reading %s data -> %s", cfg.source, root)
    corpus = load_source(cfg, progress=progress)
    lang_a, lang_b = settings["langs"]
    meta: dict = {"config": settings, "pairs": {}, "dropped": {}}
    with atomic_dir(root) as tmp:
        for split in SPLITS:
            a, b, dropped = clean_pairs(corpus[split][lang_a], corpus[split][lang_b], cfg.clean, split)
            _write_lines(tmp / f"{split}.{lang_a}", a)
            _write_lines(tmp / f"{split}.{lang_b}", b)
            meta["pairs"][split], meta["dropped"][split] = len(a), dropped
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return root


def _write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


# ----------------------------------------------------------------------------------------------- ids


def _encode(root: Path, tokenizer: Tokenizer, src: str, tgt: str) -> Path:
    folder = root / f"ids-{tokenizer.fingerprint}"
    if folder.is_dir():
        return folder
    log.info("encoding -> %s", folder)
    with atomic_dir(folder) as tmp:
        for split in SPLITS:
            for lang, encode in ((src, tokenizer.encode_src), (tgt, tokenizer.encode_tgt)):
                ids, offsets = _flatten(encode(read_lines(root / f"{split}.{lang}")))
                np.save(tmp / f"{split}.{lang}.ids.npy", ids)
                np.save(tmp / f"{split}.{lang}.offsets.npy", offsets)
    return folder


def _sample_train(
    root: Path, tokenizer: Tokenizer, cfg: TokenizerConfig, src: str, tgt: str
) -> list[EncodedSplit]:
    """``cfg.sampled_copies`` sampled segmentations of the training split, encoded once and cached: copy k
    is drawn with seed ``cfg.seed + k``, so the same settings give the same copies on any machine."""
    settings = {"alpha": cfg.sampling_alpha, "copies": cfg.sampled_copies, "seed": cfg.seed}
    folder = root / f"samples-{tokenizer.fingerprint}-{hash_key(settings)}"
    if not folder.is_dir():
        log.info(
            "sampling %d segmentations of train (alpha %g) -> %s",
            cfg.sampled_copies,
            cfg.sampling_alpha,
            folder,
        )
        sides = [(src, tokenizer.sample_src), (tgt, tokenizer.sample_tgt)]
        texts = {lang: read_lines(root / f"train.{lang}") for lang, _ in sides}
        with atomic_dir(folder) as tmp:
            for k in range(cfg.sampled_copies):
                for lang, sample in sides:
                    ids, offsets = _flatten(sample(texts[lang], cfg.sampling_alpha, cfg.seed + k))
                    np.save(tmp / f"train{k}.{lang}.ids.npy", ids)
                    np.save(tmp / f"train{k}.{lang}.offsets.npy", offsets)
    return [EncodedSplit.load(folder, f"train{k}", src, tgt) for k in range(cfg.sampled_copies)]


def _flatten(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs)), out=offsets[1:])
    ids = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int32, count=int(offsets[-1]))
    return ids, offsets


# -------------------------------------------------------------------------------------------- summary


def _summary(
    cfg: DataConfig,
    root: Path,
    tokenizer: Tokenizer,
    splits: dict[str, EncodedSplit],
    meta: dict,
    copies: list[EncodedSplit],
) -> dict:
    def mean(lengths: np.ndarray) -> float:
        return float(lengths.mean()) if len(lengths) else 0.0

    return {
        "name": cfg.name,
        "root": str(root),
        "direction": [cfg.src_lang, cfg.tgt_lang],
        "joint": tokenizer.joint,
        "vocab_size": {"src": tokenizer.src_vocab_size, "tgt": tokenizer.tgt_vocab_size},
        "pairs": {split: len(s) for split, s in splits.items()},
        "dropped": meta["dropped"],
        "tokens": {
            split: {"src": int(s.src_lengths.sum()), "tgt": int(s.tgt_lengths.sum())}
            for split, s in splits.items()
        },
        "mean_length": {
            split: {"src": mean(s.src_lengths), "tgt": mean(s.tgt_lengths)} for split, s in splits.items()
        },
        "sampled_copies": {
            "copies": len(copies),
            "tokens": sum(int(c.src_lengths.sum() + c.tgt_lengths.sum()) for c in copies)
            // max(len(copies), 1),
        },
    }


def format_summary(summary: dict) -> str:
    """One screen: where the corpus is, the vocabulary, and per split pairs, subword tokens and drops."""
    src, tgt = summary["direction"]
    vocab = summary["vocab_size"]
    vocab_text = (
        f"joint, {vocab['src']}" if summary["joint"] else f"{vocab['src']} (src) / {vocab['tgt']} (tgt)"
    )
    lines = [
        f"corpus   {summary['name']}  {src} -> {tgt}   ({summary['root']})",
        f"vocab    {vocab_text} subwords",
        "",
        f"{'split':<6} {'pairs':>9} {'src tokens':>12} {'tgt tokens':>12} {'src len':>8} {'tgt len':>8}"
        "  dropped",
    ]
    for split, pairs in summary["pairs"].items():
        tokens, mean = summary["tokens"][split], summary["mean_length"][split]
        dropped = summary["dropped"][split]
        details = ", ".join(f"{reason} {n:,}" for reason, n in dropped.items() if n)
        drop_text = f"{sum(dropped.values()):,}" + (f" ({details})" if details else "")
        lines.append(
            f"{split:<6} {pairs:>9,} {tokens['src']:>12,} {tokens['tgt']:>12,} "
            f"{mean['src']:>8.1f} {mean['tgt']:>8.1f}  {drop_text}"
        )
    sampled = summary["sampled_copies"]
    if sampled["copies"]:
        best = summary["tokens"]["train"]["src"] + summary["tokens"]["train"]["tgt"]
        lines.append(
            f"train is also segmented {sampled['copies']} times by sampling (tokenizer.sampling_alpha): "
            f"{sampled['tokens'] / max(best, 1) - 1:+.0%} tokens per copy"
        )
    return "\n".join(lines)


def prepare_text(data_cfg: Any, progress: bool = True) -> Path:
    """Only the cleaned text (no tokenizer): what evaluation needs for its sources and references."""
    return _prepare_text(data_cfg, progress)
