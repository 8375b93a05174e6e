"""Output diagnostics: length ratio, repetition loops, over-long hypotheses, words from the source."""

import pytest

from nmt.metrics import output_stats

SOURCES = ["a man plays", "two dogs run fast", "the cat", "x", "empty ref"]
REFS = ["ein Mann spielt", "zwei Hunde laufen schnell", "die Katze", "y", ""]


def test_clean_outputs_have_nothing_to_report():
    stats = output_stats(SOURCES, REFS, REFS)
    assert stats.length_ratio == 1.0
    assert stats.repeats_3gram == stats.loops == stats.over_long == stats.empty == 0.0
    assert stats.source_words == 0.0


def test_loops_over_long_outputs_copies_and_empty_lines_are_counted():
    hyps = [
        "ein Mann spielt ein Mann spielt ein Mann spielt",  # a loop (3x), 3x the reference: over-long
        "two dogs run fast",  # copied from the source
        "die Katze die Katze",  # 4 words vs 2: over-long, but no repeated 3-gram
        "",  # empty
        "whatever",  # empty reference: not counted
    ]
    stats = output_stats(SOURCES, hyps, REFS)
    assert stats.repeats_3gram == stats.loops == pytest.approx(1 / 4)
    assert stats.over_long == pytest.approx(2 / 4)
    assert stats.over_long_looping == pytest.approx(1 / 2)
    assert stats.source_words == pytest.approx(4 / 17)
    assert stats.empty == pytest.approx(1 / 4)
    assert stats.length_ratio == pytest.approx(17 / 10)
    assert "25.0% repeat a 3-gram" in stats.summary()


def test_a_repeat_that_is_not_a_loop():
    stats = output_stats(["s"], ["a b c d a b c"], ["a b c d e f g"])
    assert stats.repeats_3gram == 1.0 and stats.loops == 0.0


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="2 sources, 1 hypotheses"):
        output_stats(["a", "b"], ["a"], ["a"])
