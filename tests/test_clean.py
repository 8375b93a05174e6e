"""Sentence-pair filters: what each split loses, and why."""

import logging

from nmt.config import CleanConfig
from nmt.data.clean import clean_pairs

CFG = CleanConfig(min_words=2, max_words=5, max_ratio=2.0)
PAIRS = [
    ("  a b  ", "x y"),  # kept, stripped
    ("", "x y"),  # empty
    ("a b", "   "),  # empty
    ("a", "x"),  # too_short
    ("a b c d e f", "u v w x y z"),  # too_long
    ("a b", "u v w x y"),  # ratio 2.5
    ("a b c", "u v w x y z"),  # too_long before ratio
    ("a b", "u v w x"),  # ratio exactly 2: kept
    ("a\nb", "x y"),  # kept, on one line
]


def test_train_split_counts_every_reason():
    src, tgt, dropped = clean_pairs(*zip(*PAIRS, strict=True), CFG, "train")
    assert dropped == {"empty": 2, "too_short": 1, "too_long": 2, "ratio": 1}
    assert src == ["a b", "a b", "a b"]
    assert tgt == ["x y", "u v w x", "x y"]


def test_valid_and_test_are_kept_whole():
    """Empty lines included: a test set is scored on all its lines, as the sacrebleu CLI does."""
    for split in ("valid", "test"):
        src, tgt, dropped = clean_pairs(*zip(*PAIRS, strict=True), CFG, split)
        assert dropped == {"empty": 0, "too_short": 0, "too_long": 0, "ratio": 0}
        assert src == [s.strip().replace("\n", " ") for s, _ in PAIRS]
        assert tgt == [t.strip() for _, t in PAIRS]


def test_filters_are_symmetric():
    src, tgt = zip(*PAIRS, strict=True)
    forward = clean_pairs(src, tgt, CFG, "train")
    backward = clean_pairs(tgt, src, CFG, "train")
    assert forward[0] == backward[1] and forward[2] == backward[2]


def test_drops_are_logged(caplog):
    with caplog.at_level(logging.INFO, logger="nmt.data.clean"):
        clean_pairs(*zip(*PAIRS, strict=True), CFG, "train")
    assert "train: kept 3 pairs, dropped 6 (empty 2, too_short 1, too_long 2, ratio 1)" in caplog.text
