"""Sentence-pair filters, for training pairs only: pairs with an empty side (nothing to learn), too
short, too long or too unequal. Valid and test are kept whole, empty lines included, so that scores
are over every line of the test set, as the sacrebleu command line counts them."""

from __future__ import annotations

import logging

from nmt.config import CleanConfig

log = logging.getLogger(__name__)

REASONS = ("empty", "too_short", "too_long", "ratio")


def clean_pairs(
    src: list[str], tgt: list[str], cfg: CleanConfig, split: str
) -> tuple[list[str], list[str], dict[str, int]]:
    """Stripped one-line pairs of ``split`` that pass the filters (all of them outside training), and
    the number dropped per reason (the first that applies), which is also logged.

    Lengths are whitespace words; the checks are symmetric, so the result does not depend on the
    translation direction.
    """
    keep_src, keep_tgt, dropped = clean_chunk(src, tgt, cfg, split == "train")
    log_dropped(split, len(keep_src), dropped)
    return keep_src, keep_tgt, dropped


def clean_chunk(
    src: list[str], tgt: list[str], cfg: CleanConfig, train: bool
) -> tuple[list[str], list[str], dict[str, int]]:
    """:func:`clean_pairs` of one chunk of a split, without the log line: a corpus is cleaned in chunks."""
    dropped = dict.fromkeys(REASONS, 0)
    keep_src, keep_tgt = [], []
    for s, t in zip(src, tgt, strict=True):
        s, t = _one_line(s), _one_line(t)
        reason = _reject(s, t, cfg, train)
        if reason:
            dropped[reason] += 1
        else:
            keep_src.append(s)
            keep_tgt.append(t)
    return keep_src, keep_tgt, dropped


def _one_line(text: str) -> str:
    """Stripped, inner newlines (possible in datasets rows) as spaces: the cache stores a line per pair."""
    return text.strip().replace("\n", " ")


def _reject(src: str, tgt: str, cfg: CleanConfig, train: bool) -> str | None:
    if not train:
        return None
    if not src or not tgt:
        return "empty"
    shorter, longer = sorted((len(src.split()), len(tgt.split())))
    if shorter < cfg.min_words:
        return "too_short"
    if longer > cfg.max_words:
        return "too_long"
    if longer > cfg.max_ratio * shorter:
        return "ratio"
    return None


def log_dropped(split: str, kept: int, dropped: dict[str, int]) -> None:
    total = sum(dropped.values())
    details = ", ".join(f"{reason} {n}" for reason, n in dropped.items() if n) or "none"
    log.info("%s: kept %d pairs, dropped %d (%s)", split, kept, total, details)
