"""Greedy and beam search over a vocabulary shortlist: the model scores the union of the candidates
of each group of sentences, each sentence only its own (so batching never changes a translation), a
shortlist of the whole vocabulary changes nothing, and the Translator reads ``decoding.shortlist``
once."""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from helpers import copy_sentences, tiny_rnnsearch, tiny_transformer, train_to_copy
from test_translator import DE, EN, write_checkpoint

from nmt.config import DecodingConfig, DecodingOverrides, ExportCT2Config, ToyDataConfig, check_decoding
from nmt.decoding import pad_batch, score_ids, translate_ids
from nmt.decoding.common import BatchVocab
from nmt.decoding.shortlist import SPECIALS, Shortlist
from nmt.errors import NMTError
from nmt.inference import backends
from nmt.inference.translator import Translator
from nmt.models import Seq2Seq
from nmt.models.base import OutputVocab
from nmt.models.ensemble import Ensemble
from nmt.serve.batch_decoding import ScoreSettings, translate_batch
from nmt.serve.requests import TranslateRequest
from nmt.text.special import BOS_ID, EOS_ID, PAD_ID
from nmt.tooling.shortlist_builder import build_shortlist

VOCAB = 24
POSITIONS = 32
COPY = ("src", "tgt")  # the direction the copy task's shortlists are built for
SEARCHES = {
    "greedy": DecodingConfig(beam_size=1, alpha=0.0),
    "beam 4": DecodingConfig(beam_size=4, nbest=4, alpha=0.6),
    "beam 3, no_unk, blocking": DecodingConfig(beam_size=3, nbest=2, no_unk=True, no_repeat_ngram=2),
    "greedy, no cache, blocking": DecodingConfig(beam_size=1, cache=False, no_repeat_ngram=1),
}
GREEDY_AND_BEAM = {name: SEARCHES[name] for name in ("greedy", "beam 4")}

pytestmark = pytest.mark.usefixtures("one_thread")


def untrained(name: str) -> Seq2Seq:
    """Random tiny models of every kind: the Transformer's output projection tied to the embeddings or
    not, RNNsearch (an output bias), an ensemble of both."""
    if name == "transformer":
        return tiny_transformer(VOCAB, seed=1)
    if name == "transformer, untied output":
        return tiny_transformer(VOCAB, seed=2, share_embeddings=False)
    if name == "rnnsearch":
        return tiny_rnnsearch(VOCAB, seed=3)
    return Ensemble([tiny_transformer(VOCAB, seed=4), tiny_rnnsearch(VOCAB, seed=5)]).eval()


MODELS = ["transformer", "transformer, untied output", "rnnsearch", "ensemble"]


def vocabulary(size: int) -> SimpleNamespace:
    """What building a shortlist needs of a tokenizer."""
    return SimpleNamespace(src_vocab_size=size, tgt_vocab_size=size, fingerprint="test")


def whole_vocabulary() -> Shortlist:
    return Shortlist(0, VOCAB, "test", VOCAB, list(range(VOCAB)), [[] for _ in range(VOCAB)], 0, *COPY, {})


def narrow() -> Shortlist:
    """Two or three candidates per source id, few shared between sentences (no frequent ones)."""
    candidates = [[] if s in SPECIALS else sorted({s, 4 + (s * 7) % (VOCAB - 4)}) for s in range(VOCAB)]
    return Shortlist(2, 0, "test", VOCAB, list(SPECIALS), candidates, 0, *COPY, {})


def own_candidates(shortlist: Shortlist, source: list[int], prefix: list[int] = ()) -> set[int]:
    return set(shortlist.select([source])) | set(prefix)


def results(nbest: list[list]) -> list[list[tuple]]:
    return [[(h.tokens, h.log_prob, h.score) for h in hyps] for hyps in nbest]


@pytest.fixture(scope="module")
def sources() -> list[list[int]]:
    return copy_sentences(12, VOCAB, seed=2000)


@pytest.fixture(scope="module")
def copier() -> Seq2Seq:
    """Trained to copy for 60 steps: right on some sentences, wrong (other tokens) on others."""
    return train_to_copy(tiny_transformer(VOCAB, seed=0, max_positions=POSITIONS), VOCAB, steps=60)


@pytest.fixture(scope="module")
def copy_shortlist() -> Shortlist:
    """Built from copy pairs like any shortlist: each source id's likeliest target is itself."""
    pairs = copy_sentences(2000, VOCAB, seed=77)
    return build_shortlist(pairs, pairs, vocabulary(VOCAB), k=1, frequent=0, direction=COPY)


# ---------------------------------------------------------------------------------- the same search
@pytest.mark.parametrize("search", SEARCHES, ids=list(SEARCHES))
@pytest.mark.parametrize("name", MODELS)
def test_a_shortlist_of_the_whole_vocabulary_changes_nothing(sources, name, search):
    """Bit for bit in one group (one product over every row, as without a shortlist); in groups of
    two sentences the same translations, up to the rounding of products over fewer rows."""
    model, cfg = untrained(name), SEARCHES[search]
    prefixes = [[5, 6] if i % 3 == 0 else [] for i in range(len(sources))]
    for given in (None, prefixes):
        plain = translate_ids(model, sources, cfg, "cpu", POSITIONS, prefixes=given)
        one_group, pairs = (
            translate_ids(
                model,
                sources,
                replace(cfg, shortlist_group=group),
                "cpu",
                POSITIONS,
                given,
                shortlist=whole_vocabulary(),
            )
            for group in (len(sources), 2)
        )
        assert results(one_group) == results(plain)  # bit for bit
        assert [[h.tokens for h in hs] for hs in pairs] == [[h.tokens for h in hs] for hs in plain]
        for hyps, alone in zip(pairs, plain):
            assert [h.log_prob for h in hyps] == pytest.approx([h.log_prob for h in alone], abs=1e-5)


@pytest.mark.parametrize("name", ["transformer", "rnnsearch"])
def test_the_step_scores_each_groups_candidates_in_id_order(name):
    """Column i of a restricted step is target id ids[g, i] of the row's group g, as in the full step
    (up to normalisation over the row's own candidates); a group's padding columns are -inf."""
    model = untrained(name)
    src = pad_batch(copy_sentences(3, VOCAB, seed=4), "cpu")
    ids = torch.tensor([[0, 1, 2, 3, 7, 11, 19], [0, 1, 2, 3, 5, 8, 0]])
    allowed = torch.ones(3, 7, dtype=torch.bool)
    allowed[1, 5] = allowed[2, 6] = False  # row 1 lacks id 11, row 2's last column is padding
    state = model.init_state(model.encode(src))
    full, _ = model.step(torch.full((3,), BOS_ID), state)
    vocab = OutputVocab(ids, allowed, torch.tensor([0, 0, 1]))
    restricted, _ = model.step(torch.full((3,), BOS_ID), model.restrict_output(state, vocab))
    expected = full[:, ids[[0, 0, 1]]].diagonal().t().masked_fill(~allowed, -torch.inf).log_softmax(dim=-1)
    torch.testing.assert_close(restricted, expected, rtol=0, atol=1e-6)


def test_each_group_of_sentences_is_scored_over_the_union_of_its_candidates(sources):
    """Groups of consecutive sentences, each with its sorted union (specials at their own columns),
    padded with PAD columns that are nobody's candidate; a group size past the batch is one group."""
    shortlist = narrow()
    src = pad_batch(sources[:5], "cpu")
    vocab = BatchVocab.of(shortlist, src, None, VOCAB, group_size=2)
    assert vocab.group.tolist() == [0, 0, 1, 1, 2]
    for g, members in enumerate([sources[0:2], sources[2:4], sources[4:5]]):
        union = shortlist.select(members)
        row = vocab.ids[g].tolist()
        assert row[: len(union)] == union and row[len(union) :] == [PAD_ID] * (len(row) - len(union))
        assert all(vocab.position[g, t] == i for i, t in enumerate(union))
    for i, source in enumerate(sources[:5]):
        own = vocab.ids[vocab.group[i]][vocab.allowed[i]].tolist()
        assert own == sorted(own_candidates(shortlist, source))  # padding columns are not allowed
    one = BatchVocab.of(shortlist, src, None, VOCAB, group_size=10**12)
    assert one.ids.tolist() == [shortlist.select(sources[:5])] and one.group.tolist() == [0] * 5


# --------------------------------------------------------------------------- only the candidates
@pytest.mark.parametrize("search", GREEDY_AND_BEAM, ids=list(GREEDY_AND_BEAM))
def test_a_trained_model_outputs_only_its_sentences_candidates(copier, copy_shortlist, search):
    cfg = SEARCHES[search]
    sources = copy_sentences(24, VOCAB, seed=3000)
    plain = translate_ids(copier, sources, cfg, "cpu", POSITIONS)
    shortlisted = translate_ids(copier, sources, cfg, "cpu", POSITIONS, shortlist=copy_shortlist)
    outside = 0
    for source, free, hyps in zip(sources, plain, shortlisted):
        own = own_candidates(copy_shortlist, source)
        assert own == set(source) | set(SPECIALS)  # the copy task's shortlist: the source's own ids
        assert all(set(h.tokens) <= own for h in hyps)
        outside += any(not set(h.tokens) <= own for h in free)
    assert outside  # unrestricted, the half-trained model goes elsewhere on some sentences


@pytest.mark.parametrize("search", GREEDY_AND_BEAM, ids=list(GREEDY_AND_BEAM))
def test_a_prefix_is_forced_even_through_tokens_outside_the_candidates(copier, copy_shortlist, search):
    cfg = SEARCHES[search]
    sources = copy_sentences(6, VOCAB, seed=3100)
    prefixes = [[t for t in range(4, VOCAB) if t not in s][:2] for s in sources]
    found = translate_ids(copier, sources, cfg, "cpu", POSITIONS, prefixes, shortlist=copy_shortlist)
    for source, prefix, hyps in zip(sources, prefixes, found):
        for h in hyps:
            assert h.tokens[:2] == prefix
            assert set(h.tokens) <= own_candidates(copy_shortlist, source, prefix)


def test_blocked_ngrams_are_banned_by_their_target_ids(copier, copy_shortlist):
    """The history holds target ids; with a shortlist they are mapped to the step's columns."""
    sources = [[5, 9, 5, 9, 5, 9], [7, 7, 7, 12], [20, 4, 20, 4, 20]]
    cfg = replace(SEARCHES["beam 4"], no_repeat_ngram=1)
    for hyps in translate_ids(copier, sources, cfg, "cpu", POSITIONS, shortlist=copy_shortlist):
        for h in hyps:
            assert len(set(h.tokens)) == len(h.tokens), h.tokens


# ----------------------------------------------------------------------------- batch independence
@pytest.mark.parametrize("search", GREEDY_AND_BEAM, ids=list(GREEDY_AND_BEAM))
@pytest.mark.parametrize("name", ["transformer", "rnnsearch", "ensemble"])
def test_batching_never_changes_a_translation(sources, name, search):
    model, cfg, shortlist = untrained(name), SEARCHES[search], narrow()
    batched = translate_ids(model, sources, cfg, "cpu", POSITIONS, shortlist=shortlist)
    assert len({frozenset(shortlist.select([s])) for s in sources}) > 1  # the union is more than each
    for source, hyps in zip(sources, batched):
        (alone,) = translate_ids(model, [source], cfg, "cpu", POSITIONS, shortlist=shortlist)
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert [h.log_prob for h in hyps] == pytest.approx([h.log_prob for h in alone], abs=1e-5)
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-5)
    pairs = translate_ids(model, sources, replace(cfg, max_tokens=12), "cpu", POSITIONS, shortlist=shortlist)
    assert [[h.tokens for h in hs] for hs in pairs] == [[h.tokens for h in hs] for hs in batched]


@pytest.mark.parametrize("search", GREEDY_AND_BEAM, ids=list(GREEDY_AND_BEAM))
def test_log_probabilities_are_normalised_over_the_sentences_own_candidates(sources, search):
    """Teacher-forced logits, softmax over the sentence's candidates alone: what the search sums."""
    model, shortlist = untrained("transformer"), narrow()
    found = translate_ids(model, sources, SEARCHES[search], "cpu", POSITIONS, shortlist=shortlist)
    for source, hyps in zip(sources, found):
        outside = torch.ones(VOCAB, dtype=torch.bool)
        outside[sorted(own_candidates(shortlist, source))] = False
        for h in hyps:
            with torch.no_grad():
                logits = model(torch.tensor([[*source, EOS_ID]]), torch.tensor([[BOS_ID, *h.tokens]]))[0]
            log_probs = logits.masked_fill(outside, -torch.inf).log_softmax(dim=-1)
            expected = log_probs.gather(1, torch.tensor([*h.tokens, EOS_ID])[:, None]).sum().item()
            assert h.log_prob == pytest.approx(expected, abs=1e-4)


# ---------------------------------------------------------------------------------------- checks
def test_a_shortlist_for_other_vocabularies_is_refused(sources):
    other = Shortlist(0, 0, "test", VOCAB + 1, list(SPECIALS), [[] for _ in range(VOCAB)], 0, *COPY, {})
    with pytest.raises(NMTError, match=r"vocabularies of 24/25 source/target subwords, the model has 24/24"):
        translate_ids(untrained("transformer"), sources, SEARCHES["greedy"], "cpu", 32, shortlist=other)


def test_the_option_is_a_file_set_where_the_model_runs_never_by_a_request():
    check_decoding(DecodingConfig(shortlist="shortlist.k50.n100.json"))
    with pytest.raises(NMTError, match="decoding.shortlist= : must be a file or null"):
        check_decoding(DecodingConfig(shortlist=" "))
    assert "shortlist" not in TranslateRequest.model_fields


# ------------------------------------------------------------------------------------ the Translator
def test_the_translator_reads_the_shortlist_once_and_decodes_over_it(tmp_path, monkeypatch):
    checkpoint = write_checkpoint(tmp_path / "model.pt", tmp_path, "bpe", seed=1)
    translator = Translator.from_checkpoint(str(checkpoint), torch.device("cpu"))
    tokenizer = translator.tokenizer
    pairs = tokenizer.encode_src(EN), tokenizer.encode_tgt(DE)
    shortlist = build_shortlist(*pairs, tokenizer, k=2, frequent=1, direction=("src", "tgt"))
    path = tmp_path / shortlist.filename()
    shortlist.save(path)
    reads = []
    monkeypatch.setattr(backends, "load_shortlist", lambda *a: reads.append(a) or shortlist)

    decoding = translator.decoding_with(DecodingOverrides(shortlist=str(path), beam_size=2, nbest=2))
    assert len(reads) == 1  # read when the settings are checked, before any decoding
    lines = EN[:4]
    for _ in range(2):
        for source, hyps in zip(translator.encode(lines), translator.translations(lines, decoding).nbest):
            assert all(set(h.tokens) <= set(shortlist.select([source])) for h in hyps)
    assert len(reads) == 1

    monkeypatch.undo()
    with pytest.raises(NMTError, match="shortlist not found: .*missing.json"):
        translator.decoding_with(DecodingOverrides(shortlist=str(tmp_path / "missing.json")))


def test_the_translator_asks_its_backend_to_check_the_shortlist_before_decoding(tmp_path):
    checkpoint = write_checkpoint(tmp_path / "model.pt", tmp_path, "bpe", seed=1)
    torch_translator = Translator.from_checkpoint(str(checkpoint), torch.device("cpu"))
    checked = []
    other = SimpleNamespace(name="ct2", check_shortlist=checked.append)
    translator = Translator(torch_translator.model, torch_translator.tokenizer, torch_translator.cfg, other)
    assert translator.decoding_with(DecodingOverrides()).shortlist is None
    translator.decoding_with(DecodingOverrides(shortlist="s.json"))
    assert checked == [None, "s.json"]


def test_a_shortlist_of_the_other_direction_is_refused_in_one_line(tmp_path):
    """A joint tokenizer serves en->de and de->en: the tokenizer check lets the other direction's
    shortlist pass, the direction it records does not (the search, and an export's vocabulary map)."""
    en_de = write_checkpoint(
        tmp_path / "en-de.pt", tmp_path, "bpe", 1, ToyDataConfig(src_lang="en", tgt_lang="de")
    )
    de_en = write_checkpoint(
        tmp_path / "de-en.pt", tmp_path, "bpe", 2, ToyDataConfig(src_lang="de", tgt_lang="en")
    )
    forward = Translator.from_checkpoint(str(en_de), torch.device("cpu"))
    tokenizer = forward.tokenizer
    shortlist = build_shortlist(
        tokenizer.encode_src(EN), tokenizer.encode_tgt(DE), tokenizer, 2, 1, ("en", "de")
    )
    path = tmp_path / shortlist.filename()
    shortlist.save(path)
    assert forward.decoding_with(DecodingOverrides(shortlist=str(path))).shortlist == str(path)

    backward = Translator.from_checkpoint(str(de_en), torch.device("cpu"))
    assert backward.tokenizer.fingerprint == tokenizer.fingerprint
    refusal = f"{path} was built for en->de, the model translates de->en; build one for this model with "
    with pytest.raises(NMTError) as e:
        backward.decoding_with(DecodingOverrides(shortlist=str(path)))
    assert str(e.value) == refusal + "scripts/build_shortlist.py"
    if importlib.util.find_spec("ctranslate2"):
        from nmt.ct2.export import export_checkpoint

        cfg = ExportCT2Config(checkpoint=str(de_en), output=str(tmp_path / "ct2"), shortlist=str(path))
        with pytest.raises(NMTError, match=re.escape(refusal)):
            export_checkpoint(cfg)
        assert not (tmp_path / "ct2").exists()


@pytest.mark.parametrize("name", MODELS)
def test_scoring_over_a_shortlist_normalises_as_the_search_does(name, sources):
    """A search's hypotheses scored again over the shortlist get the log-probabilities the search gave
    them (over the whole vocabulary they get others); a target with subwords outside the candidates
    gets what a search forced through it as a prefix gives."""
    model, shortlist, cfg = untrained(name), narrow(), SEARCHES["beam 4"]
    found = translate_ids(model, sources, cfg, "cpu", POSITIONS, shortlist=shortlist)
    pairs = [(source, h) for source, hyps in zip(sources, found) for h in hyps]
    srcs, tgts = [s for s, _ in pairs], [h.tokens for _, h in pairs]
    scored = score_ids(model, srcs, tgts, "cpu", POSITIONS, 8000, shortlist)
    assert [s.log_prob for s in scored] == pytest.approx([h.log_prob for _, h in pairs], abs=1e-4)
    whole = score_ids(model, srcs, tgts, "cpu", POSITIONS, 8000)
    assert max(abs(a.log_prob - b.log_prob) for a, b in zip(whole, scored)) > 0.1

    source = sources[0]
    strangers = [t for t in range(4, VOCAB) if t not in shortlist.select([source])][:3]
    greedy = replace(SEARCHES["greedy"], max_len_b=8)
    (forced,) = translate_ids(model, [source], greedy, "cpu", POSITIONS, [strangers], shortlist=shortlist)
    assert forced[0].tokens[:3] == strangers
    (again,) = score_ids(model, [source], [forced[0].tokens], "cpu", POSITIONS, 8000, shortlist)
    assert again.log_prob == pytest.approx(forced[0].log_prob, abs=1e-4)


def test_the_translator_scores_over_the_shortlist_its_settings_name(tmp_path):
    """What scripts/score.py and the service's /score call: with decoding.shortlist, a translation's
    score is the one its search gave it, so an edited translation compares with the search's best."""
    checkpoint = write_checkpoint(tmp_path / "model.pt", tmp_path, "bpe", seed=1)
    translator = Translator.from_checkpoint(str(checkpoint), torch.device("cpu"))
    tokenizer = translator.tokenizer
    shortlist = build_shortlist(tokenizer.encode_src(EN), tokenizer.encode_tgt(DE), tokenizer, 2, 1, COPY)
    shortlist.save(tmp_path / "s.json")
    decoding = translator.decoding_with(DecodingOverrides(shortlist=str(tmp_path / "s.json"), nbest=2))
    ids = translator.encode(EN[:4])
    pairs = [(source, h) for source, hyps in zip(ids, translator.search(ids, decoding)) for h in hyps]
    scored = translator.score_ids([s for s, _ in pairs], [h.tokens for _, h in pairs], decoding)
    assert [s.log_prob for s in scored] == pytest.approx([h.log_prob for _, h in pairs], abs=1e-4)
    assert [s.score for s in scored] == pytest.approx([h.score for _, h in pairs], abs=1e-4)
    # the service's /score, with the server's settings (its shortlist among them): the same numbers
    item = ([s for s, _ in pairs], ScoreSettings(decoding, [h.tokens for _, h in pairs]))
    (answer,) = translate_batch(translator, 2**20, [item])
    served = json.loads(answer.translations)
    assert [s["log_prob"] for s in served] == pytest.approx([h.log_prob for _, h in pairs], abs=1e-4)
