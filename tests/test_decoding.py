"""Greedy and beam search on a tiny Transformer trained for a few dozen steps to copy sequences.

The model is half-trained on purpose: its outputs vary in length and content, and greedy and beam
search disagree on some sentences, so the comparisons below have something to compare.
"""

import itertools
import math
from dataclasses import replace

import pytest
import reference_beam_search as reference
import torch
from helpers import copy_sentences, tiny_rnnsearch, tiny_transformer, train_to_copy

from nmt.config import DecodingConfig, TransformerConfig
from nmt.decoding import (
    beam_search,
    block_repeated_ngrams,
    greedy_search,
    length_penalty,
    pad_batch,
    score_ids,
    search,
    translate_ids,
)
from nmt.decoding.common import budget_for_source, max_lengths
from nmt.errors import NMTError
from nmt.models import Seq2Seq, Transformer, kernels
from nmt.models import attention as attention_module
from nmt.models.base import select_sentences
from nmt.models.ensemble import Ensemble
from nmt.text.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID

VOCAB = 24
LIMIT = 63  # max_positions - 1
CFG = TransformerConfig(
    d_model=32, ff_dim=64, heads=4, encoder_layers=2, decoder_layers=2, dropout=0.0, max_positions=64
)
GREEDY = DecodingConfig(beam_size=1, alpha=0.0)


def random_sentences(count: int, seed: int, min_len: int = 2, max_len: int = 9) -> list[list[int]]:
    return copy_sentences(count, VOCAB, seed, min_len, max_len)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model() -> Transformer:
    """Trained to copy its input (UNK included) for 80 steps: right on some sentences, not all."""
    torch.manual_seed(0)
    return train_to_copy(Transformer(CFG, VOCAB, VOCAB, joint_vocab=True), VOCAB, steps=80)


@pytest.fixture(scope="module")
def sources() -> list[list[int]]:
    return random_sentences(12, seed=1000)


@pytest.fixture(scope="module")
def src(sources) -> torch.Tensor:
    return pad_batch(sources, "cpu")


def sequence_log_prob(model: Seq2Seq, src_row: torch.Tensor, tokens: list[int]) -> float:
    """log P(tokens + EOS | src) under teacher forcing, independent of any search code."""
    src_row = src_row[src_row.ne(PAD_ID)][None]
    tgt_in = torch.tensor([[BOS_ID, *tokens]])
    with torch.no_grad():
        log_probs = torch.log_softmax(model(src_row, tgt_in)[0].float(), dim=-1)
    return log_probs.gather(1, torch.tensor([*tokens, EOS_ID])[:, None]).sum().item()


def test_the_fixture_model_is_not_degenerate(model, src, sources):
    hyps = greedy_search(model, src, GREEDY, LIMIT)
    assert len({len(h.tokens) for h in hyps}) > 3  # lengths vary
    correct = sum(h.tokens == s for h, s in zip(hyps, sources))
    assert 0 < correct < len(sources)  # learned something, not everything


def test_scores_are_the_model_log_probabilities(model, src):
    for h, row in zip(greedy_search(model, src, replace(GREEDY, alpha=0.6), LIMIT), src):
        assert h.log_prob == pytest.approx(sequence_log_prob(model, row, h.tokens), abs=1e-4)
        assert h.score == pytest.approx(h.log_prob / ((5 + len(h.tokens) + 1) / 6) ** 0.6, rel=1e-6)
    nbest = beam_search(model, src, DecodingConfig(beam_size=4, nbest=4, alpha=0.6), LIMIT)
    for hyps, row in zip(nbest, src):
        for h in hyps:
            assert h.log_prob == pytest.approx(sequence_log_prob(model, row, h.tokens), abs=1e-4)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_size_one_is_greedy(model, src, alpha):
    cfg = replace(GREEDY, alpha=alpha)
    greedy = greedy_search(model, src, cfg, LIMIT)
    beam = beam_search(model, src, cfg, LIMIT)
    assert [h[0].tokens for h in beam] == [h.tokens for h in greedy]
    for (b,), g in zip(beam, greedy):
        assert b.log_prob == pytest.approx(g.log_prob, abs=1e-5)
        assert b.score == pytest.approx(g.score, abs=1e-5)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_cached_decoding_equals_recomputing_the_prefix(model, src, beam_size):
    cfg = DecodingConfig(beam_size=beam_size, nbest=beam_size, alpha=0.6)
    run = beam_search if beam_size > 1 else (lambda m, s, c, n: [[h] for h in greedy_search(m, s, c, n)])
    cached = run(model, src, cfg, LIMIT)
    recomputed = run(model, src, replace(cfg, cache=False), LIMIT)
    assert [[h.tokens for h in hs] for hs in cached] == [[h.tokens for h in hs] for hs in recomputed]
    for a, b in zip(cached, recomputed):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


def test_cached_step_log_probs_equal_recomputed_ones(model, src):
    """Teacher-force a few tokens through ``step``: every step's distribution agrees."""
    rows = torch.arange(src.size(0))
    targets = torch.randint(4, VOCAB, (src.size(0), 8), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        states = {cache: model.init_state(model.encode(src), cache=cache) for cache in (True, False)}
        tokens = torch.full((src.size(0),), BOS_ID)
        for t in range(targets.size(1)):
            out = {}
            for cache, state in states.items():
                out[cache], states[cache] = model.step(tokens, state)
            torch.testing.assert_close(out[True], out[False], rtol=0, atol=1e-5)
            if t == 3:  # a reorder in between, as beam search does
                rows = torch.tensor([3, 3, 0, 1, 2, 5, 4, 7, 6, 9, 8, 11])
                states = {cache: model.reorder(state, rows) for cache, state in states.items()}
                targets = targets[rows]
            tokens = targets[:, t]
    assert out[True].shape == (src.size(0), VOCAB) and out[True].dtype == torch.float32


@pytest.mark.parametrize("beam_size", [1, 4])
def test_batched_decoding_equals_one_sentence_at_a_time(model, sources, beam_size):
    cfg = DecodingConfig(beam_size=beam_size, nbest=beam_size, alpha=0.6)
    batched = translate_ids(model, sources, cfg, "cpu", CFG.max_positions)
    for s, hyps in zip(sources, batched):
        (alone,) = translate_ids(model, [s], cfg, "cpu", CFG.max_positions)
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-5)
    small_batches = translate_ids(model, sources, replace(cfg, max_tokens=20 * beam_size), "cpu", 64)
    assert [[h.tokens for h in hs] for hs in small_batches] == [[h.tokens for h in hs] for hs in batched]


@pytest.mark.parametrize("beam_size", [1, 4])
def test_an_empty_source_translates_to_nothing(model, sources, beam_size):
    """Not decoded from a lone EOS (the model never saw one): empty, as Translator.translate makes it."""
    cfg = DecodingConfig(beam_size=beam_size, nbest=beam_size, alpha=0.6)
    with_empty = translate_ids(model, [[], sources[0], [], sources[1]], cfg, "cpu", CFG.max_positions)
    assert [[(h.tokens, h.score) for h in hs] for hs in with_empty[::2]] == [[([], 0.0)]] * 2
    without = translate_ids(model, sources[:2], cfg, "cpu", CFG.max_positions)
    assert [[h.tokens for h in hs] for hs in with_empty[1::2]] == [[h.tokens for h in hs] for hs in without]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_nbest_lists_are_sorted_with_the_gnmt_length_penalty(model, src, alpha):
    k = 5
    nbest = beam_search(model, src, DecodingConfig(beam_size=k, nbest=k, alpha=alpha), LIMIT)
    for hyps in nbest:
        assert len(hyps) == k
        assert len({tuple(h.tokens) for h in hyps}) == k  # distinct hypotheses
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        for h in hyps:
            # documented: log P(y|x) / ((5 + |y|) / 6) ** alpha, with |y| counting EOS
            assert h.score == pytest.approx(h.log_prob / ((5 + len(h.tokens) + 1) / 6) ** alpha, rel=1e-6)
    assert length_penalty(3, 0.6) == pytest.approx((8 / 6) ** 0.6)
    top = beam_search(model, src, DecodingConfig(beam_size=k, nbest=2, alpha=alpha), LIMIT)
    assert [[h.tokens for h in hs] for hs in top] == [[h.tokens for h in hs[:2]] for hs in nbest]


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize(("a", "b"), [(0.0, 1), (0.0, 3), (0.5, 0), (1.0, 2)])
def test_output_length_budget(model, src, beam_size, a, b):
    rambler = AlwaysLonger(model)  # would never stop on its own
    cfg = DecodingConfig(beam_size=beam_size, nbest=beam_size, max_len_a=a, max_len_b=b)
    for hyps, row in zip(search(rambler, src, cfg, LIMIT), src):
        budget = max(1, int(a * int(row.ne(PAD_ID).sum()) + b))  # src length counts EOS
        assert max(len(h.tokens) for h in hyps) == budget
    for hyps, row in zip(search(model, src, cfg, LIMIT), src):  # the real model, well within budget
        assert all(len(h.tokens) <= max(1, int(a * int(row.ne(PAD_ID).sum()) + b)) for h in hyps)


def test_output_length_is_bounded_by_the_model_positions(model, src):
    cfg = DecodingConfig(beam_size=2, max_len_a=10.0, max_len_b=100)
    assert all(len(h[0].tokens) == 7 for h in search(AlwaysLonger(model), src, cfg, limit=7))


@pytest.mark.parametrize("beam_size", [1, 4])
def test_no_unk_never_emits_unk(model, src, beam_size):
    unk_lover = PrefersUnk(model)
    cfg = DecodingConfig(beam_size=beam_size, nbest=beam_size)
    assert any(UNK_ID in h.tokens for hs in search(unk_lover, src, cfg, LIMIT) for h in hs)
    hyps = search(unk_lover, src, replace(cfg, no_unk=True), LIMIT)
    assert all(UNK_ID not in h.tokens for hs in hyps for h in hs)


def test_special_tokens_are_never_generated(model, src):
    for hs in beam_search(model, src, DecodingConfig(beam_size=4, nbest=4), LIMIT):
        for h in hs:
            assert not {PAD_ID, BOS_ID, EOS_ID} & set(h.tokens)


def test_larger_beams_find_at_least_the_greedy_model_score(model, src):
    greedy = greedy_search(model, src, GREEDY, LIMIT)
    improved = 0
    for k in (2, 5, 8):
        best = beam_search(model, src, DecodingConfig(beam_size=k, alpha=0.0), LIMIT)
        for (b,), g in zip(best, greedy):
            assert b.log_prob >= g.log_prob - 1e-5
            improved += b.log_prob > g.log_prob + 1e-4
    assert improved > 0  # beam search actually found better hypotheses somewhere


def test_a_finished_hypothesis_never_becomes_a_live_beam():
    """The issue's reproduction: 3 usable tokens besides EOS, beam 4; EOS used to fill the 4th beam."""
    cfg = DecodingConfig(beam_size=4, nbest=4, no_unk=True, alpha=0.0)
    for seed in range(5):
        model = tiny_transformer(7, seed)
        (hyps,) = beam_search(model, pad_batch([[4, 5]], "cpu"), cfg, limit=31)
        assert all(EOS_ID not in h.tokens for h in hyps), [h.tokens for h in hyps]


@pytest.mark.parametrize("vocab", [5, 6, 7, 8])
def test_beam_search_on_tiny_vocabularies_returns_proper_hypotheses(vocab):
    """Property test over random models: however few tokens there are, every hypothesis is a real one."""
    rng = torch.Generator().manual_seed(vocab)
    for seed in range(3):
        model = tiny_transformer(vocab, seed)
        sources = [torch.randint(4, vocab, (n,), generator=rng).tolist() for n in (1, 2, 4)]
        src = pad_batch(sources, "cpu")
        for k, no_unk, alpha in [(2, True, 0.0), (4, True, 0.6), (5, False, 0.0), (3, False, 1.0)]:
            cfg = DecodingConfig(beam_size=k, nbest=k, no_unk=no_unk, alpha=alpha, max_len_b=4)
            for hyps, row in zip(beam_search(model, src, cfg, limit=31), src):
                assert 1 <= len(hyps) <= k
                assert len({tuple(h.tokens) for h in hyps}) == len(hyps)
                assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
                budget = max(1, int(1.2 * int(row.ne(PAD_ID).sum()) + 4))
                for h in hyps:
                    banned = {PAD_ID, BOS_ID, EOS_ID} | ({UNK_ID} if no_unk else set())
                    assert not banned & set(h.tokens) and len(h.tokens) <= budget, h.tokens
                    assert math.isfinite(h.score)
                    assert h.log_prob == pytest.approx(sequence_log_prob(model, row, h.tokens), abs=1e-4)


def test_a_sentence_without_live_beams_is_done(model, src):
    """When every extension ends, nothing is left to search: one step, not the whole length budget."""
    only_eos = OnlyEos(model)
    cfg = DecodingConfig(beam_size=4, nbest=4, max_len_b=20)
    results = beam_search(only_eos, src, cfg, LIMIT)
    assert [[h.tokens for h in hyps] for hyps in results] == [[[]]] * src.size(0)
    assert only_eos.steps == 1


# ------------------------------------------------------------------ the reference (the search before)


def as_tuples(nbest: list[list]) -> list[list[tuple]]:
    """Everything a search returns, compared bit for bit (floats with ==)."""
    return [[(h.tokens, h.score, h.log_prob) for h in hyps] for hyps in nbest]


def mixed_lengths(vocab: int, seed: int) -> torch.Tensor:
    """Seven sources of 1 to 14 tokens (UNK included) in one padded batch."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 15, (7,), generator=g).tolist()
    return pad_batch([torch.randint(UNK_ID, vocab, (n,), generator=g).tolist() for n in lengths], "cpu")


REFERENCE_MODELS = {
    "trained transformer": lambda trained: (trained, None),
    "rambling transformer": lambda trained: (AlwaysLonger(trained), None),  # ends at its length budget
    "unk-loving transformer": lambda trained: (PrefersUnk(trained), None),
    "random transformer": lambda trained: (tiny_transformer(11, seed=3), 11),
    "random transformer, large vocabulary": lambda trained: (tiny_transformer(300, seed=4), 300),
    "random additive transformer": lambda trained: (
        tiny_transformer(13, seed=5, self_attention="additive", cross_attention="additive"),
        13,
    ),
    "random rnnsearch": lambda trained: (tiny_rnnsearch(11, seed=6), 11),
}


@pytest.fixture
def per_beam_cross_attention(monkeypatch):
    """The cross-attention each hypothesis computes with its own copy of the keys and values, as the
    reference search does: the same float operations in the same order, so that the comparisons below
    are bit for bit. (The fused kernel's beams-as-positions layout rounds a sentence's beams together,
    in the last bits: :func:`test_the_model_infers_the_beams_per_sentence_from_the_rows` and
    :func:`test_beam_search_with_beams_as_query_positions_finds_what_the_reference_finds`.)"""
    monkeypatch.setattr(
        attention_module.DotProductAttention, "attend_shared", attention_module.Attention.attend_shared
    )


@pytest.mark.usefixtures("per_beam_cross_attention")
@pytest.mark.parametrize("name", REFERENCE_MODELS)
def test_beam_search_returns_exactly_what_the_reference_returns(model, src, name):
    """Same hypotheses, same scores, bit for bit (the float operations are the same, in the same
    order), for beams 1 to 5, n-best lists, three length penalties and no_unk on and off; with
    no_repeat_ngram and word_reward at their defaults (off)."""
    searched, vocab = REFERENCE_MODELS[name](model)
    batches = [src] if vocab is None else [mixed_lengths(vocab, seed) for seed in (1, 2)]
    batches += [batches[0][i : i + 1] for i in (0, 1)]  # one sentence at a time, as translate.py does
    for batch, k, alpha, no_unk in itertools.product(batches, range(1, 6), (0.0, 0.6, 2.0), (False, True)):
        cfg = DecodingConfig(beam_size=k, nbest=k if alpha else 1, alpha=alpha, no_unk=no_unk, max_len_b=4)
        assert cfg.no_repeat_ngram == 0 and cfg.word_reward == 0.0
        expected = reference.beam_search(searched, batch, cfg, LIMIT)
        assert as_tuples(beam_search(searched, batch, cfg, LIMIT)) == as_tuples(expected), cfg


def test_beam_search_with_beams_as_query_positions_finds_what_the_reference_finds(model, src):
    """The search as it runs (a sentence's beams as query positions of one cross-attention block):
    the reference's hypotheses, scores equal up to rounding."""
    for batch, k in itertools.product((src, src[:1]), (2, 5)):
        cfg = DecodingConfig(beam_size=k, nbest=k, alpha=0.6, max_len_b=4)
        expected, got = reference.beam_search(model, batch, cfg, LIMIT), beam_search(model, batch, cfg, LIMIT)
        assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in expected]
        for a, b in zip(itertools.chain(*got), itertools.chain(*expected)):
            assert a.score == pytest.approx(b.score, abs=1e-5)


@pytest.mark.usefixtures("per_beam_cross_attention")
@pytest.mark.parametrize("name", REFERENCE_MODELS)
def test_greedy_search_and_uncached_beam_search_return_exactly_what_the_reference_returns(model, src, name):
    searched, vocab = REFERENCE_MODELS[name](model)
    whole = src if vocab is None else mixed_lengths(vocab, 1)
    for alpha, no_unk, cache, batch in itertools.product(
        (0.0, 0.6, 2.0), (False, True), (True, False), (whole, whole[:1])
    ):
        cfg = DecodingConfig(beam_size=1, alpha=alpha, no_unk=no_unk, cache=cache, max_len_b=4)
        expected = reference.greedy_search(searched, batch, cfg, LIMIT)
        assert as_tuples([greedy_search(searched, batch, cfg, LIMIT)]) == as_tuples([expected]), cfg
        cfg = replace(cfg, beam_size=3, nbest=2)
        expected = reference.beam_search(searched, batch, cfg, LIMIT)
        assert as_tuples(beam_search(searched, batch, cfg, LIMIT)) == as_tuples(expected), cfg


def test_beam_search_keeps_one_copy_of_the_cross_attention_keys_per_sentence(model, src):
    """Once the search regroups the per-sentence part, it is not repeated per beam: reorder moves the
    beams and leaves it alone, and it is only selected when sentences leave."""
    k, batch = 4, src.size(0)
    rows = torch.arange(batch).repeat_interleave(k)
    _, state = model.step(
        torch.full((batch * k,), BOS_ID), model.init_state(model.reorder(model.encode(src), rows))
    )
    assert state["sentence"].beams == 1 and state["sentence"]["cross"][0]["k"].size(0) == batch * k
    state = select_sentences(state, torch.arange(batch) * k, beams=k)
    assert state["sentence"].beams == k
    _, state = model.step(torch.full((batch * k,), 5), state)
    cross = state["sentence"]["cross"][0]["k"]
    assert cross.size(0) == batch and state["self"][0]["k"].size(0) == batch * k
    reordered = model.reorder(state, torch.arange(batch * k).flip(0))
    assert reordered["sentence"]["cross"][0]["k"] is cross  # beams moved: the sentences did not
    rows = torch.tensor([4, 5, 6, 7, 0, 1, 2, 3])  # sentences 1 and 0 stay, in that order
    left = model.reorder(select_sentences(state, torch.tensor([1, 0]), beams=k), rows)
    assert left["sentence"].beams == k and torch.equal(left["sentence"]["cross"][0]["k"], cross[[1, 0]])
    assert torch.equal(left["self"][0]["k"].take(), state["self"][0]["k"].take()[rows])


def test_the_model_infers_the_beams_per_sentence_from_the_rows(model, src):
    """Shared keys and values (one row per sentence, k beams each) give each beam exactly what its own
    copy of them gives, up to rounding: the attention needs no beam count, only the row counts."""
    k, batch = 3, src.size(0)
    tokens = torch.randint(4, VOCAB, (batch * k, 4), generator=torch.Generator().manual_seed(3))
    copied = model.init_state(model.reorder(model.encode(src), torch.arange(batch).repeat_interleave(k)))
    shared = model.init_state(model.encode(src))
    _, shared = model.step(torch.full((batch,), BOS_ID), shared)
    shared = model.reorder(
        select_sentences(shared, torch.arange(batch), beams=k), torch.arange(batch).repeat_interleave(k)
    )
    _, copied = model.step(torch.full((batch * k,), BOS_ID), copied)
    for t in range(tokens.size(1)):
        expected, copied = model.step(tokens[:, t], copied)
        got, shared = model.step(tokens[:, t], shared)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    assert shared["sentence"]["cross"][0]["k"].size(0) == batch


class SharedRows(Seq2Seq):
    """Records, at every step, the hypothesis rows and the rows of the cross-attention keys."""

    def __init__(self, inner: Seq2Seq):
        super().__init__()
        self.inner, self.vocab_sizes, self.rows = inner, inner.vocab_sizes, []

    def encode(self, src):
        return self.inner.encode(src)

    def init_state(self, encoded, cache=True):
        return self.inner.init_state(encoded, cache)

    def step(self, tokens, state):
        log_probs, state = self.inner.step(tokens, state)
        self.rows.append((tokens.size(0), state["sentence"]["cross"][0]["k"].size(0)))
        return log_probs, state

    def reorder(self, state, beam_indices):
        return self.inner.reorder(state, beam_indices)


def test_beam_search_computes_the_cross_attention_keys_once_per_sentence(model, src):
    """From the second step on, k hypothesis rows per row of keys, while sentences leave."""
    k, recorder = 4, SharedRows(model)
    beam_search(recorder, src, DecodingConfig(beam_size=k, nbest=k), LIMIT)
    assert recorder.rows[0] == (src.size(0) * k,) * 2  # the first step: a row per beam
    assert all(hyps == k * sentences for hyps, sentences in recorder.rows[1:])
    assert recorder.rows[-1][1] < src.size(0)  # sentences left


@pytest.mark.parametrize("kv_heads", [0, 1])
def test_beam_search_runs_on_a_torch_without_sdpa_head_sharing(model, src, monkeypatch, kv_heads):
    """torch 2.4 (the lowest declared) has no ``enable_gqa``: beam search then repeats the key/value
    heads for their query heads (kv_heads < heads), with the same hypotheses and scores."""
    searched = model if not kv_heads else tiny_transformer(VOCAB, seed=8, kv_heads=kv_heads)
    cfg = DecodingConfig(beam_size=4, nbest=2, alpha=0.6, max_len_b=4)
    expected = as_tuples(beam_search(searched, src, cfg, 31))
    sdpa = kernels.F.scaled_dot_product_attention

    def sdpa_of_torch_2_4(*args, **kwargs):
        if "enable_gqa" in kwargs:
            raise TypeError("scaled_dot_product_attention() got an unexpected keyword argument 'enable_gqa'")
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(kernels, "SDPA_GQA", False)
    monkeypatch.setattr(kernels.F, "scaled_dot_product_attention", sdpa_of_torch_2_4)
    assert as_tuples(beam_search(searched, src, cfg, 31)) == expected


# --------------------------------------------------------------------------- repeated n-gram blocking


def repeats_an_ngram(tokens: list[int], n: int) -> bool:
    ngrams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(ngrams) != len(set(ngrams))


def test_blocking_bans_exactly_the_tokens_that_would_repeat_an_ngram():
    g = torch.Generator().manual_seed(0)
    for n, length in itertools.product((1, 2, 3, 4), (0, 1, 2, 3, 5, 9, 20)):
        prefixes = torch.randint(4, 9, (16, length), generator=g)
        log_probs = torch.zeros(16, 10)
        log_probs[:, PAD_ID] = -math.inf
        block_repeated_ngrams(log_probs, prefixes, n)
        for row, prefix in zip(log_probs, prefixes.tolist()):
            banned = {t for t in range(10) if row[t] == -math.inf} - {PAD_ID}
            ngrams = {tuple(prefix[i : i + n]) for i in range(length - n + 1)}
            expected = {t for t in range(10) if tuple([*prefix, t][-n:]) in ngrams}
            assert banned == expected, (n, prefix)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_blocked_searches_never_repeat_an_ngram(n):
    """Property test over random models that repeat themselves: greedy and beam search."""
    repeated = 0
    for seed, vocab in itertools.product(range(3), (7, 12)):
        model = tiny_transformer(vocab, seed)
        batch = mixed_lengths(vocab, seed)
        for k in (1, 2, 4):
            cfg = DecodingConfig(beam_size=k, nbest=k, max_len_a=2.0, max_len_b=10)
            free = search(model, batch, cfg, limit=31)
            repeated += any(repeats_an_ngram(h.tokens, n) for hyps in free for h in hyps)
            blocked = search(model, batch, replace(cfg, no_repeat_ngram=n), limit=31)
            for hyps, row in zip(blocked, batch):
                for h in hyps:
                    assert not repeats_an_ngram(h.tokens, n), h.tokens
                    assert not {PAD_ID, BOS_ID, EOS_ID} & set(h.tokens)
                    assert h.log_prob == pytest.approx(sequence_log_prob(model, row, h.tokens), abs=1e-4)
    assert repeated  # without blocking, these models do repeat n-grams


@pytest.mark.usefixtures("per_beam_cross_attention")
def test_blocking_off_is_the_reference_search(model, src):
    for k in (1, 4):
        cfg = DecodingConfig(beam_size=k, nbest=k, no_repeat_ngram=0)
        assert as_tuples(search(model, src, cfg, LIMIT)) == as_tuples(
            [[h] for h in reference.greedy_search(model, src, cfg, LIMIT)]
            if k == 1
            else reference.beam_search(model, src, cfg, LIMIT)
        )


# ------------------------------------------------------------------------------------ word reward


@pytest.mark.usefixtures("per_beam_cross_attention")
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_word_reward_reranks_the_same_hypotheses_by_length(model, src, alpha):
    """All candidates a step compares have the same length, so the reward changes no search step:
    the same k finished hypotheses, ranked by score + reward * |y|; longer best ones for a reward,
    shorter for a penalty, and the same output at reward 0."""
    k = 5
    cfg = DecodingConfig(beam_size=k, nbest=k, alpha=alpha)
    plain = beam_search(model, src, cfg, LIMIT)
    assert as_tuples(beam_search(model, src, replace(cfg, word_reward=0.0), LIMIT)) == as_tuples(
        reference.beam_search(model, src, cfg, LIMIT)
    )
    mean_length = {}
    for reward in (-1.0, 0.0, 0.5, 2.0):
        rewarded = beam_search(model, src, replace(cfg, word_reward=reward), LIMIT)
        for with_reward, without in zip(rewarded, plain):
            assert {tuple(h.tokens) for h in with_reward} == {tuple(h.tokens) for h in without}
            assert [h.score for h in with_reward] == sorted((h.score for h in with_reward), reverse=True)
            for h in with_reward:
                assert h.score == pytest.approx(
                    h.log_prob / length_penalty(len(h.tokens) + 1, alpha) + reward * (len(h.tokens) + 1)
                )
        mean_length[reward] = sum(len(hyps[0].tokens) for hyps in rewarded) / len(rewarded)
        best = beam_search(model, src, replace(cfg, nbest=1, word_reward=reward), LIMIT)
        assert [h[0].tokens for h in best] == [h[0].tokens for h in rewarded]
    assert mean_length[-1.0] <= mean_length[0.0] <= mean_length[0.5] <= mean_length[2.0]
    assert mean_length[-1.0] < mean_length[2.0]


def test_a_larger_word_reward_never_shortens_a_translation(model, src):
    cfg = DecodingConfig(beam_size=4, alpha=0.6)
    lengths = [
        [len(h[0].tokens) for h in beam_search(model, src, replace(cfg, word_reward=r), LIMIT)]
        for r in (0.0, 0.3, 1.0, 3.0)
    ]
    for shorter, longer in itertools.pairwise(lengths):
        assert all(a <= b for a, b in zip(shorter, longer))


def test_greedy_word_reward_only_changes_the_score(model, src):
    plain = greedy_search(model, src, GREEDY, LIMIT)
    rewarded = greedy_search(model, src, replace(GREEDY, word_reward=0.7), LIMIT)
    assert [h.tokens for h in rewarded] == [h.tokens for h in plain]
    assert [h.score for h in rewarded] == pytest.approx([h.score + 0.7 * (len(h.tokens) + 1) for h in plain])


# ----------------------------------------------------------------------------------- model wrappers


class Wrapped(Seq2Seq):
    """A model whose next-token distribution is the wrapped model's, reshaped by ``adjust``."""

    def __init__(self, inner: Seq2Seq):
        super().__init__()
        self.inner, self.vocab_sizes = inner, inner.vocab_sizes

    def encode(self, src):
        return self.inner.encode(src)

    def init_state(self, encoded, cache=True):
        return self.inner.init_state(encoded, cache)

    def step(self, tokens, state):
        log_probs, state = self.inner.step(tokens, state)
        return torch.log_softmax(self.adjust(log_probs), dim=-1), state

    def reorder(self, state, beam_indices):
        return self.inner.reorder(state, beam_indices)


class AlwaysLonger(Wrapped):
    def adjust(self, log_probs):
        log_probs = log_probs.clone()
        log_probs[:, EOS_ID] = -30.0
        return log_probs


class OnlyEos(Wrapped):
    """Can only end; counts its decoding steps."""

    steps = 0

    def adjust(self, log_probs):
        self.steps += 1
        log_probs = torch.full_like(log_probs, -math.inf)
        log_probs[:, EOS_ID] = 0.0
        return log_probs


class PrefersUnk(Wrapped):
    def adjust(self, log_probs):
        log_probs = log_probs.clone()
        log_probs[:, UNK_ID] += 3.0
        return log_probs


def test_wrappers_do_what_the_tests_need(model, src):
    log_probs, _ = AlwaysLonger(model).step(
        torch.full((src.size(0),), BOS_ID), model.init_state(model.encode(src))
    )
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(src.size(0)))
    assert (log_probs[:, EOS_ID] < math.log(1e-10)).all()


# ------------------------------------------------------------------------------------ target prefixes

PREFIX_SEARCHES = [
    DecodingConfig(beam_size=1, alpha=0.6),
    DecodingConfig(beam_size=4, nbest=4, alpha=0.6),
    DecodingConfig(beam_size=5, alpha=0.0, no_unk=True),
]


@pytest.mark.parametrize("cfg", PREFIX_SEARCHES, ids=["greedy", "beam 4", "beam 5 no_unk"])
def test_a_prefix_of_the_best_translation_gives_that_translation(model, sources, cfg):
    """Greedy search takes the same way, exactly. Beam search spends its whole beam on the prefix: it
    returns the same translation, or one with that start that scores better than the unconstrained
    search's best (which that search missed: beam search is not exact)."""
    free = translate_ids(model, sources, cfg, "cpu", CFG.max_positions)
    for length in (1, 2, 4):
        prefixes = [hyps[0].tokens[:length] for hyps in free]
        forced = translate_ids(model, sources, cfg, "cpu", CFG.max_positions, prefixes=prefixes)
        same = 0
        for (best, *_), (free_best, *_), prefix in zip(forced, free, prefixes):
            if best.tokens == free_best.tokens:
                assert best.log_prob == pytest.approx(free_best.log_prob, abs=1e-5)
                assert best.score == pytest.approx(free_best.score, abs=1e-5)
                same += 1
            else:
                assert cfg.beam_size > 1 and best.tokens[:length] == prefix and best.score > free_best.score
        assert same > len(sources) // 2


@pytest.mark.parametrize("cfg", PREFIX_SEARCHES, ids=["greedy", "beam 4", "beam 5 no_unk"])
def test_the_output_starts_with_any_prefix_and_counts_its_log_probabilities(model, src, sources, cfg):
    free = translate_ids(model, sources, cfg, "cpu", CFG.max_positions)
    prefixes = [[UNK_ID, 5 + i % 7, 20] for i in range(len(sources))]  # UNK is forced even with no_unk
    forced = translate_ids(model, sources, cfg, "cpu", CFG.max_positions, prefixes=prefixes)
    changed = 0
    for hyps, prefix, row, without in zip(forced, prefixes, src, free):
        assert len(hyps) == cfg.nbest
        for h in hyps:
            assert h.tokens[:3] == prefix
            assert h.log_prob == pytest.approx(sequence_log_prob(model, row, h.tokens), abs=1e-4)
            assert not cfg.no_unk or UNK_ID not in h.tokens[3:]
            assert not {PAD_ID, BOS_ID, EOS_ID} & set(h.tokens)
        changed += hyps[0].tokens != without[0].tokens
    assert changed == len(sources)


@pytest.mark.parametrize("cfg", PREFIX_SEARCHES, ids=["greedy", "beam 4", "beam 5 no_unk"])
def test_an_empty_prefix_is_no_prefix(model, sources, cfg):
    free = translate_ids(model, sources, cfg, "cpu", CFG.max_positions)
    empty = translate_ids(model, sources, cfg, "cpu", CFG.max_positions, prefixes=[[]] * len(sources))
    assert as_tuples(empty) == as_tuples(free)


@pytest.mark.parametrize("cfg", PREFIX_SEARCHES, ids=["greedy", "beam 4", "beam 5 no_unk"])
def test_mixed_prefixes_in_a_batch_give_what_each_gives_alone(model, sources, cfg):
    prefixes = [[], [7], [9, 9], [], [4, 5, 6, 7, 8], [UNK_ID]] * 2
    batched = translate_ids(model, sources, cfg, "cpu", CFG.max_positions, prefixes=prefixes)
    for source, prefix, hyps in zip(sources, prefixes, batched):
        (alone,) = translate_ids(model, [source], cfg, "cpu", CFG.max_positions, prefixes=[prefix])
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert [h.log_prob for h in hyps] == pytest.approx([h.log_prob for h in alone], abs=1e-5)
        assert all(h.tokens[: len(prefix)] == prefix for h in hyps)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_prefix_as_long_as_the_budget_is_the_whole_output(model, sources, beam_size):
    cfg = DecodingConfig(beam_size=beam_size, max_len_a=0.0, max_len_b=4)
    prefixes = [[5, 6, 7, 8]] * 3
    for (h,), row in zip(translate_ids(model, sources[:3], cfg, "cpu", 64, prefixes=prefixes), sources):
        assert h.tokens == [5, 6, 7, 8]
        assert h.log_prob == pytest.approx(
            sequence_log_prob(model, pad_batch([row], "cpu")[0], h.tokens), abs=1e-4
        )


def test_an_empty_source_with_a_prefix_is_decoded(model, sources):
    cfg = DecodingConfig(beam_size=3)
    out = translate_ids(model, [[], [], sources[0]], cfg, "cpu", 64, prefixes=[[], [6, 7], [6, 7]])
    assert out[0][0].tokens == [] and out[0][0].log_prob == 0.0
    assert out[1][0].tokens[:2] == [6, 7] and out[1][0].log_prob < 0


def test_the_prefix_budget_checked_up_front_is_the_one_each_search_stops_at():
    """A prefix is refused before decoding (Translator.encode_prefixes, translate_ids) by the budget its
    batch's search then enforces, capped sources included."""
    cfg = DecodingConfig(max_len_a=1.2, max_len_b=10)
    sources = [[5, 6, 7, 8], [5], [9, 10], [], [5] * 30]
    for limit in (8, 12, 64):
        up_front = [budget_for_source(len(s[:limit]), cfg, limit) for s in sources]
        batch = pad_batch([s[:limit] for s in sources], "cpu")
        assert up_front == max_lengths(batch, cfg.max_len_a, cfg.max_len_b, limit)
    assert budget_for_source(2, cfg, 64) == 13  # int(1.2 * (2 + EOS) + 10)


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ([5] * 14, r"target prefix of sentence 2 has 14 tokens, more than its output length budget of 13"),
        ([5, EOS_ID], r"target prefix of sentence 2: token id 3 is not an output token"),
        ([BOS_ID], r"target prefix of sentence 2: token id 2 is not an output token"),
        ([PAD_ID], r"target prefix of sentence 2: token id 0 is not an output token"),
        ([VOCAB], rf"target prefix of sentence 2: token id {VOCAB} is not an output token"),
    ],
)
@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_prefix_that_cannot_be_forced_is_refused_naming_the_sentence(model, prefix, message, beam_size):
    """Sentence 2 has 2 tokens (3 with EOS): a budget of int(1.2 * 3 + 10) = 13 tokens."""
    sources, prefixes = [[5, 6, 7, 8], [5], [9, 10]], [[5], [], prefix]
    cfg = DecodingConfig(beam_size=beam_size)
    with pytest.raises(NMTError, match=message) as error:
        translate_ids(model, sources, cfg, "cpu", CFG.max_positions, prefixes=prefixes)
    assert "\n" not in str(error.value)
    with pytest.raises(NMTError, match="2 target prefixes for 3 sentences"):
        translate_ids(model, sources, cfg, "cpu", CFG.max_positions, prefixes=prefixes[:2])
    with pytest.raises(NMTError, match="target prefix of sentence 0"):  # the search alone: rows of its batch
        search(model, pad_batch(sources[2:], "cpu"), cfg, LIMIT, [prefix])


# ---------------------------------------------------------------------------------------------- scoring


def ensemble_of(trained: Transformer) -> Ensemble:
    return Ensemble([trained, tiny_transformer(VOCAB, seed=11), tiny_rnnsearch(VOCAB, seed=12)])


SCORED_MODELS = {
    "transformer": lambda trained: trained,
    "rnnsearch": lambda trained: tiny_rnnsearch(VOCAB, seed=13),
    "ensemble": ensemble_of,
    "ensemble of one": lambda trained: Ensemble([trained]),
}


@pytest.mark.parametrize("name", SCORED_MODELS)
@pytest.mark.parametrize("beam_size", [1, 4])
def test_scoring_the_search_output_gives_its_log_probabilities(model, sources, name, beam_size):
    scored_model = SCORED_MODELS[name](model)
    cfg = DecodingConfig(beam_size=beam_size, nbest=beam_size, alpha=0.6, max_len_b=6)
    nbest = translate_ids(scored_model, sources, cfg, "cpu", CFG.max_positions)
    pairs = [(s, h) for s, hyps in zip(sources, nbest) for h in hyps]
    scores = score_ids(scored_model, [s for s, _ in pairs], [h.tokens for _, h in pairs], "cpu", 64, 8000)
    for (_, h), score in zip(pairs, scores):
        assert score.log_prob == pytest.approx(h.log_prob, abs=1e-5)
        assert len(score.token_log_probs) == len(h.tokens) + 1  # EOS's last
        assert sum(score.token_log_probs) == pytest.approx(score.log_prob, abs=1e-9)
        assert all(lp <= 0 for lp in score.token_log_probs)


def test_scoring_is_one_forward_pass_per_batch_and_batching_changes_nothing(model, sources, monkeypatch):
    targets = [s[::-1] for s in sources]  # translations the model would not choose
    expected = [sequence_log_prob(model, row, t) for row, t in zip(pad_batch(sources, "cpu"), targets)]
    calls = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *args: calls.append(1) or forward(*args))
    together = score_ids(model, sources, targets, "cpu", 64, 8000)
    assert len(calls) == 1
    apart = score_ids(model, sources, targets, "cpu", 64, 30)
    assert 1 < len(calls) - 1 < len(sources)
    assert [s.log_prob for s in together] == pytest.approx(expected, abs=1e-4)
    assert [s.log_prob for s in apart] == pytest.approx([s.log_prob for s in together], abs=1e-5)
    assert [len(s.token_log_probs) for s in together] == [len(t) + 1 for t in targets]


def test_scoring_refuses_what_it_cannot_score(model, sources):
    with pytest.raises(NMTError, match="2 targets for 3 sources"):
        score_ids(model, sources[:3], sources[:2], "cpu", 64, 8000)
    with pytest.raises(NMTError, match="target 1 has 64 tokens; the model scores at most 63"):
        score_ids(model, sources[:2], [[5], [5] * 64], "cpu", 64, 8000)
