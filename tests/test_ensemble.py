"""Ensembles: several models behind the search interface, the mean of their probabilities at every step."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from helpers import tiny_rnnsearch, tiny_transformer

from nmt.config import DecodingConfig
from nmt.decoding import beam_search, greedy_search, pad_batch
from nmt.models.ensemble import Ensemble
from nmt.text.special import BOS_ID, EOS_ID

VOCAB, LIMIT = 24, 31


@pytest.fixture(scope="module")
def src() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return pad_batch(
        [torch.randint(EOS_ID + 1, VOCAB, (n,), generator=g).tolist() for n in (3, 7, 5, 2)], "cpu"
    )


def as_tuples(nbest: list[list]) -> list[list[tuple]]:
    return [[(h.tokens, h.score, h.log_prob) for h in hyps] for hyps in nbest]


SETTINGS = [
    DecodingConfig(beam_size=k, nbest=k, alpha=a, max_len_b=4)
    for k, a in itertools.product((1, 4), (0.0, 1.0))
]


def test_an_ensemble_of_one_is_that_model(src):
    model = tiny_transformer(VOCAB, seed=1)
    for cfg in SETTINGS:
        assert as_tuples(beam_search(Ensemble([model]), src, cfg, LIMIT)) == as_tuples(
            beam_search(model, src, cfg, LIMIT)
        )
    greedy = DecodingConfig(beam_size=1, max_len_b=4)
    assert as_tuples([greedy_search(Ensemble([model]), src, greedy, LIMIT)]) == as_tuples(
        [greedy_search(model, src, greedy, LIMIT)]
    )


def test_an_ensemble_of_two_copies_finds_the_same_hypotheses(src):
    model = tiny_transformer(VOCAB, seed=2)
    twice = Ensemble([model, copy.deepcopy(model)])
    for cfg in SETTINGS:
        alone, both = beam_search(model, src, cfg, LIMIT), beam_search(twice, src, cfg, LIMIT)
        assert [[h.tokens for h in hs] for hs in both] == [[h.tokens for h in hs] for hs in alone]
        for a, b in zip(itertools.chain(*alone), itertools.chain(*both)):
            assert b.score == pytest.approx(a.score, rel=1e-5, abs=1e-5)


@torch.no_grad()
def test_the_step_is_the_log_of_the_mean_probability(src):
    models = [tiny_transformer(VOCAB, seed=3), tiny_rnnsearch(VOCAB, seed=4)]
    ensemble = Ensemble(models)
    tokens = torch.full((src.size(0),), BOS_ID)
    got, _ = ensemble.step(tokens, ensemble.init_state(ensemble.encode(src)))
    probs = [m.step(tokens, m.init_state(m.encode(src)))[0].exp() for m in models]
    torch.testing.assert_close(got, ((probs[0] + probs[1]) / 2).log())


def test_mixed_architectures_search_together_and_beam_one_is_greedy(src):
    ensemble = Ensemble(
        [
            tiny_transformer(VOCAB, seed=5),
            tiny_transformer(VOCAB, seed=6, kv_heads=1, positional="rope"),
            tiny_transformer(VOCAB, seed=7, self_attention="additive", cross_attention="additive"),
            tiny_rnnsearch(VOCAB, seed=8),
        ]
    )
    cfg = DecodingConfig(beam_size=1, max_len_b=4)
    greedy = greedy_search(ensemble, src, cfg, LIMIT)
    assert [b[0].tokens for b in beam_search(ensemble, src, cfg, LIMIT)] == [h.tokens for h in greedy]
    nbest = beam_search(ensemble, src, DecodingConfig(beam_size=4, nbest=3, max_len_b=4), LIMIT)
    assert all(
        len(hs) == 3 and [h.score for h in hs] == sorted((h.score for h in hs), reverse=True) for hs in nbest
    )
    assert all(math.isfinite(h.log_prob) for hs in nbest for h in hs)
