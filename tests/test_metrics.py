"""The metrics module (``nmt.metrics``, a leaf over sacrebleu): scores by source length, each row scored
like sacrebleu on its subset, and output diagnostics (length ratio, repetition loops, over-long
hypotheses, words copied from the source)."""

import random

import pytest
import sacrebleu

from nmt.metrics import LENGTH_BUCKETS, format_by_length, output_stats, scores_by_length

# -------------------------------------------------------------------------- scores by source length
WORDS = ["ein", "Mann", "Frau", "spielt", "Gitarre", "auf", "der", "Straße", "mit", "Hund", "im", "Park"]


def corpus(n: int, seed: int) -> tuple[list[int], list[str], list[str]]:
    """Source lengths 0-70 and references with hypotheses that are partly right."""
    rng = random.Random(seed)
    lengths, hyps, refs = [], [], []
    for _ in range(n):
        length = rng.choice([0, rng.randint(1, 70)])
        ref = [rng.choice(WORDS) for _ in range(max(1, length // 2))]
        hyp = [w if rng.random() < 0.7 else rng.choice(WORDS) for w in ref]
        lengths.append(length)
        refs.append(" ".join(ref))
        hyps.append(" ".join(hyp))
    return lengths, hyps, refs


def test_bucket_counts_add_up_to_the_corpus():
    lengths, hyps, refs = corpus(300, seed=0)
    rows = scores_by_length(lengths, hyps, refs)
    assert [r["bucket"] for r in rows] == ["1-10", "11-20", "21-30", "31-50", "51+", "other"]
    assert sum(r["sentences"] for r in rows) == len(lengths)
    assert rows[-1]["sentences"] == lengths.count(0)  # empty sources: in no bucket of the defaults
    for row, (low, high) in zip(rows, LENGTH_BUCKETS):
        assert row["sentences"] == sum(low <= n and (high is None or n <= high) for n in lengths)


def test_each_bucket_scores_like_sacrebleu_on_its_subset():
    lengths, hyps, refs = corpus(300, seed=1)
    buckets = ((0, 10), (11, 30), (31, None))
    rows = scores_by_length(lengths, hyps, refs, buckets=buckets, metrics=("bleu", "chrf", "ter"))
    assert len(rows) == 3  # nothing left over
    for row, (low, high) in zip(rows, buckets):
        members = [i for i, n in enumerate(lengths) if low <= n and (high is None or n <= high)]
        sub_hyps, sub_refs = [hyps[i] for i in members], [[refs[i] for i in members]]
        assert row["bleu"] == pytest.approx(sacrebleu.corpus_bleu(sub_hyps, sub_refs).score, abs=1e-4)
        assert row["chrf"] == pytest.approx(sacrebleu.corpus_chrf(sub_hyps, sub_refs).score, abs=1e-4)
        assert row["ter"] == pytest.approx(sacrebleu.corpus_ter(sub_hyps, sub_refs).score, abs=1e-4)
    assert len({row["bleu"] for row in rows}) == 3  # the buckets do differ


def test_empty_buckets_keep_their_row_and_the_table_prints_them():
    rows = scores_by_length([3, 5, 12], ["a b c", "d e", "f g h"], ["a b c", "d x", "f g h"])
    assert [(r["bucket"], r["sentences"]) for r in rows] == [
        ("1-10", 2),
        ("11-20", 1),
        ("21-30", 0),
        ("31-50", 0),
        ("51+", 0),
    ]
    assert rows[2]["bleu"] is None and rows[2]["chrf"] is None
    table = format_by_length(rows).splitlines()
    assert table[0].split() == ["src", "len", "sentences", "bleu", "chrf"] and len(table) == 6
    assert table[3].split() == ["21-30", "0", "-", "-"]
    with pytest.raises(ValueError, match="3 source lengths, 2 hypotheses"):
        scores_by_length([3, 5, 12], ["a", "b"], ["a", "b", "c"])


# ------------------------------------------------------------------------------- output diagnostics
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
