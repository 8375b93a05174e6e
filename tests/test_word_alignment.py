"""Word alignments from attention: subwords grouped into words, links from a layer's attention, Pharaoh
format, and the agreement scores (precision, recall, F1, AER)."""

import pytest
import torch

from nmt.analysis.word_alignment import (
    alignment_scores,
    attention_links,
    grow_diag_final_and,
    parse_pharaoh,
    pharaoh,
    word_ids,
    words,
)
from nmt.errors import NMTError


def test_pieces_that_start_with_the_space_mark_start_words():
    assert word_ids(["▁Ein", "▁Mann", "▁fähr", "t", "▁", "."]) == [0, 1, 2, 2, 3, 3]
    assert word_ids(["<unk>", "x", "▁y"]) == [0, 0, 1]  # the first piece starts a word anyway
    assert word_ids([]) == []


def attention(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows)


# Source "▁a ▁bc d" (words a, bcd) + EOS; target "▁X ▁Y" + EOS.
SRC, TGT = ["▁a", "▁bc", "d"], ["▁X", "▁Y"]


def test_each_target_word_links_to_its_best_source_word_and_never_to_eos():
    weights = attention(
        [
            [0.1, 0.6, 0.1, 0.2],  # predicting X: looks at bc
            [0.3, 0.0, 0.0, 0.7],  # predicting Y: mostly at EOS, else at a
            [0.5, 0.2, 0.2, 0.1],  # predicting EOS (read Y)
        ]
    )
    assert attention_links(weights, SRC, TGT, shift=False) == [(1, 0), (0, 1)]
    assert attention_links(weights, SRC, TGT, shift=True) == [(0, 0), (0, 1)]


def test_mean_and_sum_differ_on_multi_piece_words():
    weights = attention([[0.4, 0.3, 0.3, 0.0], [0.4, 0.3, 0.3, 0.0], [1.0, 0.0, 0.0, 0.0]])
    # word "bcd" gets 0.6 in sum, 0.3 in mean: only the mean prefers "a"
    assert attention_links(weights, SRC, TGT, shift=False, method="mean") == [(0, 0), (0, 1)]
    assert attention_links(weights, SRC, TGT, shift=False, method="sum") == [(1, 0), (1, 1)]


def test_piece_method_links_every_target_piece():
    src, tgt = ["▁a", "▁b"], ["▁X", "y"]  # one target word of two pieces
    weights = attention([[0.9, 0.1, 0.0], [0.2, 0.8, 0.0], [0.5, 0.5, 0.0]])
    assert attention_links(weights, src, tgt, shift=False, method="piece") == [(0, 0), (1, 0)]
    assert attention_links(weights, src, tgt, shift=False, method="mean") == [(0, 0)]  # 0.55 vs 0.45


def test_a_wrongly_shaped_attention_or_unknown_method_is_refused():
    with pytest.raises(NMTError, match=r"expected \(3, 4\)"):
        attention_links(torch.zeros(3, 3), SRC, TGT, shift=False)
    with pytest.raises(NMTError, match="choose one of mean, sum, piece"):
        attention_links(torch.zeros(3, 4), SRC, TGT, shift=False, method="max")
    assert attention_links(torch.ones(1, 4), SRC, [], shift=False) == []


def test_pharaoh_round_trip_and_errors():
    links = [(0, 0), (2, 1), (1, 2)]
    assert pharaoh(links) == "0-0 2-1 1-2"
    assert parse_pharaoh("0-0 2-1  1-2\n") == set(links)
    assert parse_pharaoh("") == set()
    with pytest.raises(NMTError, match=r"ref.align:3: '0-x' is not a Pharaoh link"):
        parse_pharaoh("0-0 0-x", "ref.align:3")


def test_scores_count_links_over_the_corpus():
    predicted = [{(0, 0), (1, 1)}, {(2, 1)}]
    sure = [{(0, 0), (1, 1)}, {(2, 2)}]
    scores = alignment_scores(predicted, sure)
    assert (scores.precision, scores.recall) == (2 / 3, 2 / 3)
    assert scores.f1 == pytest.approx(2 / 3) and scores.aer == pytest.approx(1 / 3)
    assert (scores.links, scores.reference_links) == (3, 3)
    # a possible link counts for precision and AER, not for recall
    with_possible = alignment_scores(predicted, sure, [{(0, 0), (1, 1)}, {(2, 2), (2, 1)}])
    assert with_possible.precision == 1.0 and with_possible.recall == 2 / 3
    assert with_possible.aer == pytest.approx(1 - (2 + 3) / (3 + 3))
    with pytest.raises(NMTError, match="2 predicted alignments for 1 reference"):
        alignment_scores(predicted, sure[:1])


def test_grow_diag_final_and_grows_from_the_intersection():
    forward = {(0, 0), (1, 1), (2, 1), (3, 3), (7, 6)}
    reverse = {(0, 0), (1, 1), (2, 2), (5, 3)}
    # Growing from the intersection {0-0, 1-1}: 2-1 and 2-2 neighbour 1-1 and align a new word, 3-3
    # then neighbours 2-2; 5-3 neighbours nothing. Final-and adds 7-6 (both words unaligned), not 5-3
    # (target word 3 is aligned).
    assert grow_diag_final_and(forward, reverse) == {(0, 0), (1, 1), (2, 1), (2, 2), (3, 3), (7, 6)}
    # one direction alone: only final-and, which skips 2-1 (target word 1 has 1-1)
    assert grow_diag_final_and(forward, set()) == forward - {(2, 1)}
    assert grow_diag_final_and(set(), set()) == set()


def test_words_are_the_decoded_pieces_of_each_word():
    pieces = ["▁Ein", "▁Fahr", "rad", "."]
    got = words([5, 6, 7, 8], pieces, lambda groups: ["+".join(map(str, g)) for g in groups])
    assert got == ["5", "6+7+8"]
    assert words([], [], lambda groups: groups) == []
