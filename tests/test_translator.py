"""The Translator, the one way in for every caller: empty lines stay empty, truncation warns naming the
line, backends sit behind one interface, ``info()`` and ``attention()`` answer what the service shows,
ensembles are checked when loaded, and translating never loads matplotlib."""

from __future__ import annotations

import inspect
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from helpers import tiny_transformer

from nmt.checkpoint import atomic_save, make_checkpoint
from nmt.config import (
    DataConfig,
    DecodingConfig,
    DecodingOverrides,
    ServerLimits,
    TokenizerConfig,
    ToyDataConfig,
    TrainConfig,
    to_container,
)
from nmt.ct2.backend import CT2Backend
from nmt.decoding import Backend, Hypothesis, translate_ids
from nmt.errors import NMTError
from nmt.inference.backends import BACKENDS, ProcessesBackend, TorchBackend, load_backend
from nmt.inference.translator import Translator
from nmt.models.ensemble import Ensemble
from nmt.text.tokenizer import train_tokenizer
from nmt.tooling.shortlist_builder import build_shortlist

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
DECODING = DecodingConfig(beam_size=2, nbest=2, max_len_b=3)

EN = [
    f"the {a} sees {b} near the house"
    for a, b in itertools.product(("cat", "dog", "bird"), ("it", "us", "me"))
]
DE = [
    f"die {a} sieht {b} am Haus"
    for a, b in itertools.product(("Katze", "Hund", "Vogel"), ("es", "uns", "mich"))
]


def write_checkpoint(
    path: Path,
    texts: Path,
    model_type: str,
    seed: int,
    data: DataConfig | None = None,
    step: int | None = None,
) -> Path:
    """A tiny random Transformer (32 positions) with a joint SentencePiece model trained on EN + DE."""
    (texts / "train.en").write_text("\n".join(EN) + "\n", encoding="utf-8")
    (texts / "train.de").write_text("\n".join(DE) + "\n", encoding="utf-8")
    tokenizer = train_tokenizer(
        TokenizerConfig(vocab_size=30, model_type=model_type), texts / "train.en", texts / "train.de", texts
    )
    model = tiny_transformer(tokenizer.src_vocab_size, seed=seed)
    config = to_container(TrainConfig(data=data or ToyDataConfig(), model=model.cfg))
    progress = {} if step is None else {"step": step}
    atomic_save(
        make_checkpoint(model.state_dict(), config, tokenizer.state_dict(), model.vocab_sizes, progress), path
    )
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("translator")
    return write_checkpoint(folder / "model.pt", folder, "bpe", seed=1, step=12)


@pytest.fixture(scope="module")
def translator(checkpoint) -> Translator:
    return Translator.from_checkpoint(str(checkpoint), CPU)


class Recorder:
    """A backend that answers each source with its ids reversed and records what it was asked."""

    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[list[list[int]]] = []

    def translate_ids(self, sources, cfg, progress=False):
        self.calls.append([list(s) for s in sources])
        return [[Hypothesis(list(reversed(s)), -1.0, -2.0)] for s in sources]

    def check_shortlist(self, path):
        if path is not None:
            raise NMTError(f"decoding.shortlist={path}: the recorder decodes over no shortlist")


# ------------------------------------------------------------------------------------ lines in, lines out
def test_empty_lines_stay_empty_and_are_not_decoded(translator):
    lines = ["the cat sees it", "", "   ", "the dog sees us near the house"]
    hyps = translator.translations(lines, DECODING).nbest
    assert [len(h) for h in hyps] == [2, 0, 0, 2]
    out = translator.translate(lines, DECODING)
    assert out[1] == out[2] == "" and len(out) == 4
    assert out[0] == translator.texts(hyps[0])[0] and out == translator.best(hyps)


def test_a_truncated_line_is_named_in_the_warning(translator, caplog):
    long = " ".join(["the cat sees it near the house"] * 8)
    with caplog.at_level(logging.WARNING, logger="nmt.inference.translator"):
        ids = translator.encode(["the cat", long], first_line=41)
    assert len(ids[1]) == translator.max_source == 31
    assert [r.getMessage() for r in caplog.records] == [
        f"line 42: {len(translator.tokenizer.encode_src([long])[0])} subwords, truncated to the "
        "model's limit of 31"
    ]


# ------------------------------------------------------------------------------------ backends
def test_the_torch_backend_is_our_search_over_the_model(translator):
    assert isinstance(translator.backend, TorchBackend) and translator.backend.name == "torch"
    ids = translator.encode(["the cat sees it", "the bird sees me near the house"])
    expected = translate_ids(translator.model, ids, DECODING, CPU, translator.cfg.model.max_positions)
    assert translator.search(ids, DECODING) == expected


@pytest.mark.parametrize("implementation", [TorchBackend, ProcessesBackend, CT2Backend])
def test_every_backend_implements_the_one_interface(implementation):
    """Each method of the protocol is the implementation's own (not the protocol's empty body), with
    the protocol's signature."""
    assert Backend in implementation.__mro__ and implementation.name in BACKENDS
    for method in ("translate_ids", "score_ids", "check_shortlist"):
        own = getattr(implementation, method)
        assert own is not getattr(Backend, method), f"{implementation.__name__}.{method} is not implemented"
        assert inspect.signature(own) == inspect.signature(getattr(Backend, method))


def test_any_backend_plugs_in_and_sees_only_the_non_empty_sources(translator):
    recorder = Recorder()
    other = Translator(translator.model, translator.tokenizer, translator.cfg, recorder, step=3)
    lines = ["the cat sees it", "", "the dog sees us"]
    out = other.translate(lines, DECODING)
    ids = translator.encode(lines)
    assert recorder.calls == [[ids[0], ids[2]]]  # one call, empty line left out
    assert out == translator.tokenizer.decode_tgt([ids[0][::-1], [], ids[2][::-1]])
    assert other.info()["backend"] == "recorder" and other.info()["step"] == 3
    assert not other.has_attention and translator.has_attention
    with pytest.raises(NMTError, match="^the recorder backend has no attention weights; use backend=torch$"):
        other.attention("the cat sees it", ids[0][::-1])


def test_the_service_answers_through_the_translator_whatever_the_backend(translator):
    """Nothing in the service asks which backend runs: it reports the backend's name, and refuses
    attention where the Translator has none."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from nmt.serve import create_app

    other = Translator(translator.model, translator.tokenizer, translator.cfg, Recorder(), step=3)
    limits, decoding = ServerLimits(), translator.decoding_with(DecodingOverrides())
    with TestClient(create_app(other, limits, decoding)) as client:
        body = client.post("/translate", json={"text": ["the cat sees it", ""]}).json()
        refused = client.post("/translate", json={"text": ["the cat"], "attention": True})
        unaligned = client.post("/translate", json={"text": ["the cat"], "alignments": True})
        unscored = client.post("/score", json={"text": ["the cat"], "target": ["a"], "alignments": True})
        info = client.get("/info").json()
    assert body["backend"] == "recorder"
    assert [t["text"] for t in body["translations"]] == other.translate(["the cat sees it", ""], decoding)
    assert refused.status_code == 422 and refused.json() == {
        "error": "attention: the recorder backend has no attention weights; use backend=torch",
        "field": "attention",
    }
    for answer in (unaligned, unscored):
        assert answer.status_code == 422 and answer.json() == {
            "error": "alignments: the recorder backend has no attention weights; use backend=torch",
            "field": "alignments",
        }
    assert info == {**other.info(), "decoding": asdict(decoding), "limits": asdict(limits)}


def test_one_sentence_of_a_served_batch_cannot_fail_the_others(translator):
    """Requests batched together by the service (same settings, same prefixes): an empty source with a
    prefix and attention is answered beside the others, and a request the backend refuses gets its
    refusal alone while the others of its batch are translated."""
    from nmt.serve.batch_decoding import TranslateSettings, translate_batch

    decoding = replace(DECODING, nbest=1)
    prefix = translator.encode_targets(["die"])
    settings = TranslateSettings(decoding, attention=True, prefixes=prefix)
    items = [(translator.encode(["the cat sees it"]), settings), (translator.encode([""]), settings)]
    cat, empty = [json.loads(r.translations) for r in translate_batch(translator, 10**7, items)]
    assert cat[0]["text"].startswith("die") and empty[0]["text"].startswith("die")
    assert empty[0]["attention"]["source_tokens"] == ["</s>"]

    class Picky:
        """The torch backend, refusing any batch with the source it is given."""

        name = "picky"

        def __init__(self, inner, bad):
            self.inner, self.bad = inner, bad

        def translate_ids(self, sources, cfg, progress=False, **kwargs):
            if self.bad in [list(s) for s in sources]:
                raise NMTError("decoding.beam_size=2: this source is refused")
            return self.inner.translate_ids(sources, cfg, progress, **kwargs)

    ids = translator.encode(["the cat sees it", "the dog sees us", "the bird sees me"])
    backend = Picky(translator.backend, ids[1])
    picky = Translator(translator.model, translator.tokenizer, translator.cfg, backend)
    plain = TranslateSettings(decoding)
    results = translate_batch(picky, 10**7, [([ids[0]], plain), ([ids[1]], plain), ([ids[2]], plain)])
    assert [r.refused for r in results] == [None, "decoding.beam_size=2: this source is refused", None]
    texts = [json.loads(r.translations)[0]["text"] for r in (results[0], results[2])]
    assert texts == translator.translate(["the cat sees it", "the bird sees me"], decoding)


def test_the_search_memory_of_a_sentence_is_its_key_value_caches(translator):
    """``Translator.search_bytes``: the Transformer's caches (kv_cache_bytes) over the source and the
    longest output the length budget allows, per beam; an ensemble keeps one per model."""
    from nmt.models import kv_cache_bytes

    ids = translator.encode(["the cat sees it", "the bird sees me near the house"])
    cfg = translator.cfg.model
    for beam in (1, 4):
        decoding = replace(DECODING, beam_size=beam, nbest=1, max_len_a=1.5, max_len_b=4)
        expected = [
            kv_cache_bytes(
                cfg, min(int(1.5 * (len(s) + 1) + 4), translator.max_source) + 1, len(s) + 1, 4, beam
            )
            for s in ids
        ]
        assert translator.search_bytes(ids, decoding) == expected
    model = Ensemble([translator.model, translator.model])
    twice = Translator(model, translator.tokenizer, translator.cfg, translator.backend)
    assert twice.search_bytes(ids, DECODING) == [2 * n for n in translator.search_bytes(ids, DECODING)]


def same_translations(parts: list, whole: list) -> bool:
    """What a search in other company promises: float32 kernels sum in an order that depends on the
    batch's shape (a matrix of fewer than 8 rows takes another kernel; padding lengthens the attention's
    sums), so scores agree within rounding, and a translation differs only where its search met a tie
    within rounding (the two translations' scores agree as closely)."""
    for mine, theirs in zip(parts, whole, strict=True):
        for a, b in zip(json.loads(mine.translations), json.loads(theirs.translations), strict=True):
            pairs = list(zip(a["nbest"], b["nbest"], strict=True))
            if [x["score"] for x, _ in pairs] != pytest.approx([y["score"] for _, y in pairs], rel=1e-5):
                return False
    return True


def test_a_served_request_is_searched_in_parts_that_fit_the_memory_limit(translator):
    """serve.max_search_mb in the worker: the sentences of a batch are searched as many at a time as fit
    together (a sentence over it alone, alone), and get the translations one search gives them, their
    scores within float rounding (:func:`same_translations`)."""
    from nmt.serve.batch_decoding import TranslateSettings, translate_batch

    class Counting:
        name = "counting"

        def __init__(self, inner):
            self.inner, self.calls = inner, []

        def translate_ids(self, sources, cfg, progress=False, **kwargs):
            self.calls.append([list(s) for s in sources])
            return self.inner.translate_ids(sources, cfg, progress, **kwargs)

    decoding = replace(DECODING, beam_size=3, nbest=1)
    ids = translator.encode(EN[:6])
    prefixes = translator.encode_targets(["die", "", "der", "", "", "das"])
    sizes = dict(zip(map(tuple, ids), translator.search_bytes(ids, decoding)))
    settings = (
        TranslateSettings(decoding, prefixes=prefixes[:3]),
        TranslateSettings(decoding, prefixes=prefixes[3:]),
    )
    items = [(ids[:3], settings[0]), (ids[3:], settings[1])]
    whole = translate_batch(translator, 10**7, items)
    counting = Counting(translator.backend)
    cut = Translator(translator.model, translator.tokenizer, translator.cfg, counting)
    limit = 2 * max(sizes.values())
    assert same_translations(translate_batch(cut, 10**7, items, max_search=limit), whole)
    assert len(counting.calls) == 3 and sorted(map(tuple, sum(counting.calls, []))) == sorted(sizes)
    assert all(sum(sizes[tuple(s)] for s in call) <= limit for call in counting.calls)
    counting.calls.clear()
    assert same_translations(translate_batch(cut, 10**7, items, max_search=1), whole)  # each alone
    assert [len(call) for call in counting.calls] == [1] * 6


def test_an_alignment_layer_the_model_lacks_is_refused_before_anything_is_decoded(translator):
    """The service refuses to start with it (the page asks for alignments with every translation)."""
    pytest.importorskip("fastapi")
    from nmt.serve import create_app

    for layer in (None, 0, -1):  # tiny_transformer: one decoder layer
        translator.check_alignment_layer(layer)
    for layer in (1, -2):
        with pytest.raises(NMTError, match=rf"^alignment_layer={layer} out of range: the model has 1 "):
            translator.check_alignment_layer(layer)
    decoding = translator.decoding_with(DecodingOverrides())
    with pytest.raises(NMTError, match=r"^alignment_layer=3 out of range"):
        create_app(translator, ServerLimits(), decoding, alignment_layer=3)
    other = Translator(translator.model, translator.tokenizer, translator.cfg, Recorder())
    other.check_alignment_layer(3)  # no attention weights, no alignments: nothing to refuse


def test_score_requests_are_scored_in_batches_within_serve_max_score_mb(translator, monkeypatch):
    """/score holds tokens x target vocabulary log-probabilities at once: its batches are cut to
    serve.max_score_mb whatever decoding.max_tokens says, and a limit too small for one translation
    stops the service at start."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from nmt.serve import create_app

    vocab, decoding = translator.tokenizer.tgt_vocab_size, translator.decoding_with(DecodingOverrides())
    limits = ServerLimits(max_score_mb=40 * vocab * 8 / 2**20)  # 40 tokens' log-probabilities
    seen, score_ids = [], translator.backend.score_ids

    def recorded(sources, targets, max_tokens, *args, **kwargs):
        seen.append(max_tokens)
        return score_ids(sources, targets, max_tokens, *args, **kwargs)

    monkeypatch.setattr(translator.backend, "score_ids", recorded)
    with TestClient(create_app(translator, limits, decoding)) as client:
        pairs = {"text": ["the cat sees it near the house"] * 6, "target": ["die Katze sieht es"] * 6}
        response = client.post("/score", json=pairs)
    assert response.status_code == 200, response.text
    assert set(seen) == {40} and decoding.max_tokens > 40 and response.json()["decoding"] == asdict(decoding)
    expected = translator.score(pairs["text"], pairs["target"], decoding)
    assert [s["log_prob"] for s in response.json()["scores"]] == pytest.approx([s.log_prob for s in expected])
    with pytest.raises(NMTError, match=r"^serve.max_score_mb=.*: scoring one translation of 31 subwords"):
        create_app(translator, ServerLimits(max_score_mb=8 * vocab * 8 / 2**20), decoding)


def test_load_backend_checks_its_settings(translator):
    model, tokenizer = translator.model, translator.tokenizer
    assert isinstance(load_backend("torch", None, model, tokenizer, CPU, 32, ("src", "tgt")), TorchBackend)
    with pytest.raises(NMTError, match="^backend=onnx: must be one of torch, ct2"):
        load_backend("onnx", None, model, tokenizer, CPU, 32, ("src", "tgt"))
    with pytest.raises(NMTError, match="needs ct2_model=DIR"):
        load_backend("ct2", None, model, tokenizer, CPU, 32, ("src", "tgt"))


def test_workers_decode_in_processes_what_one_process_decodes(checkpoint, translator, tmp_path):
    """workers=2: the batches go to two single-threaded processes; the n-best lists are those of one
    process (within float rounding), in input order, with target prefixes and a shortlist alike."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("two decoding processes need two CPU cores")
    lines = [EN[i % len(EN)] + " and" * (i % 5) for i in range(40)] + [""]
    tokenizer = translator.tokenizer
    pairs = tokenizer.encode_src(EN), tokenizer.encode_tgt(DE)
    shortlist = build_shortlist(*pairs, tokenizer, k=3, frequent=2, direction=("src", "tgt"))
    shortlist.save(tmp_path / shortlist.filename())
    parallel = Translator.from_checkpoint(str(checkpoint), CPU, workers=2)
    assert isinstance(parallel.backend, ProcessesBackend) and parallel.has_attention
    prefixes = ["die" if i % 4 == 0 else "" for i in range(len(lines))]
    for overrides in (
        DecodingOverrides(beam_size=3, nbest=2, max_tokens=60),  # many small batches, more than workers
        DecodingOverrides(beam_size=1, shortlist=str(tmp_path / shortlist.filename())),  # one batch
    ):
        decoding = translator.decoding_with(overrides)
        for given in (None, prefixes):
            here = translator.translations(lines, decoding, prefixes=given).nbest
            there = parallel.translations(lines, parallel.decoding_with(overrides), prefixes=given).nbest
            assert [[h.tokens for h in hs] for hs in there] == [[h.tokens for h in hs] for hs in here]
            for mine, theirs in zip(here, there):
                assert [h.score for h in theirs] == pytest.approx([h.score for h in mine], abs=1e-5)

    # a worker's error comes back in one line, and the next call gets its own answers, not stale ones
    other = tmp_path / "other.json"
    shortlist.save(other)
    failing = parallel.decoding_with(DecodingOverrides(beam_size=2, max_tokens=60, shortlist=str(other)))
    other.unlink()  # read here by decoding_with; the workers read it at their first use
    with pytest.raises(NMTError, match="a decoding worker failed: shortlist not found"):
        parallel.translations(lines, failing)
    plain = translator.decoding_with(DecodingOverrides(beam_size=2, max_tokens=60))
    again, alone = parallel.translations(lines, plain).nbest, translator.translations(lines, plain).nbest
    assert [[h.tokens for h in hs] for hs in again] == [[h.tokens for h in hs] for hs in alone]
    parallel.backend.close()
    with pytest.raises(NMTError, match="the decoding worker processes were closed"):
        parallel.translations(lines, plain)


def test_a_worker_killed_between_batches_is_started_again_and_nothing_is_lost(checkpoint, translator):
    """workers=2: a worker that dies between two batches of a call (killed, out of memory) or between two
    calls is replaced by a new one, which decodes the batch it would have had: the same answers."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("two decoding processes need two CPU cores")
    lines = [EN[i % len(EN)] + " and" * (i % 5) for i in range(40)]
    decoding = translator.decoding_with(DecodingOverrides(beam_size=3, max_tokens=60))  # many batches
    expected = [[h.tokens for h in hs] for hs in translator.translations(lines, decoding).nbest]
    parallel = Translator.from_checkpoint(str(checkpoint), CPU, workers=2)
    backend = parallel.backend
    receive, killed = backend._receive, []

    def receive_then_die(conn):  # the worker answers its batch, then is killed before the next one
        value = receive(conn)
        if not killed:
            killed.append(backend.processes[conn].pid)
            os.kill(killed[0], signal.SIGKILL)
            backend.processes[conn].join()
        return value

    try:
        backend._receive = receive_then_die
        assert [[h.tokens for h in hs] for hs in parallel.translations(lines, decoding).nbest] == expected
        del backend._receive
        os.kill(backend.processes[backend.conns[1]].pid, signal.SIGKILL)  # between two calls
        backend.processes[backend.conns[1]].join()
        assert [[h.tokens for h in hs] for hs in parallel.translations(lines, decoding).nbest] == expected
        alive = [p for p in backend.processes.values() if p.is_alive()]
        assert len(killed) == 1 and len(alive) == 2 and killed[0] not in {p.pid for p in alive}
    finally:
        backend.close()


def test_workers_are_checked_before_anything_starts(checkpoint):
    with pytest.raises(NMTError, match="workers=0: must be >= 1"):
        Translator.from_checkpoint(str(checkpoint), CPU, workers=0)
    too_many = (os.cpu_count() or 1) + 1
    with pytest.raises(NMTError, match=f"workers={too_many}: more than the {too_many - 1} CPU cores here"):
        Translator.from_checkpoint(str(checkpoint), CPU, workers=too_many)
    with pytest.raises(NMTError, match="workers=2 is for backend=torch; backend=ct2 decodes in parallel"):
        Translator.from_checkpoint(str(checkpoint), CPU, backend="ct2", workers=2)
    with pytest.raises(NMTError, match="workers=2 decodes in CPU processes; on device cuda use workers=1"):
        Translator.from_checkpoint(str(checkpoint), torch.device("cuda"), workers=2)


# ------------------------------------------------------------------------------------ info, attention
def test_info_describes_model_vocabulary_languages_backend_and_step(translator):
    info = translator.info()
    assert info["model"] == asdict(translator.cfg.model) and info["models"] == 1
    assert info["parameters"] == sum(p.numel() for p in translator.model.parameters())
    tok = translator.tokenizer
    assert info["vocabulary"] == {"src": tok.src_vocab_size, "tgt": tok.tgt_vocab_size, "joint": True}
    assert info["languages"] == {"src": "src", "tgt": "tgt"}
    assert info["backend"] == "torch" and info["step"] == 12


def test_attention_of_a_hypothesis_per_layer_and_head(translator):
    text = "the dog sees me"
    src = translator.encode([text])[0]
    hyp = translator.translations([text], DECODING).nbest[0][0].tokens
    cross = translator.attention(text, hyp)
    assert cross.weights.shape == (1, 2, len(hyp) + 1, len(src) + 1)  # tiny_transformer: 1 layer, 2 heads
    torch.testing.assert_close(cross.weights.sum(-1), torch.ones(cross.weights.shape[:-1]))
    assert cross.source_tokens == [*translator.tokenizer.src_pieces(src), "</s>"]
    assert cross.target_tokens == [*translator.tokenizer.tgt_pieces(hyp), "</s>"]
    torch.testing.assert_close(translator.attention(src, hyp).weights, cross.weights)  # text or ids

    mean, heads = cross.panels(-1, "mean"), cross.panels(0, "all")
    assert mean.weights.shape == (1, len(hyp) + 1, len(src) + 1) and mean.titles is None
    assert heads.weights.shape == (2, len(hyp) + 1, len(src) + 1) and heads.titles == ["head 0", "head 1"]
    assert mean.title == "cross-attention, mean of 2 heads"
    with pytest.raises(NMTError, match=r"^layer=1 out of range: the model has 1 decoder layer"):
        cross.panels(1)
    with pytest.raises(NMTError, match="^heads=.*: must be one of mean, all"):
        cross.panels(-1, "max")
    with pytest.raises(NMTError, match="source is empty"):
        translator.attention("  ", [])
    empty = translator.attention("  ", hyp)  # an empty source continued from a target prefix
    assert empty.source_tokens == ["</s>"] and empty.weights.shape == (1, 2, len(hyp) + 1, 1)
    torch.testing.assert_close(empty.weights, torch.ones_like(empty.weights))


# ------------------------------------------------------------------------------------ ensembles
def test_checkpoints_with_different_vocabularies_are_refused(tmp_path):
    first = write_checkpoint(tmp_path / "a.pt", tmp_path, "bpe", seed=1)
    same = write_checkpoint(tmp_path / "b.pt", tmp_path, "bpe", seed=2)
    other = write_checkpoint(tmp_path / "c.pt", tmp_path, "unigram", seed=3)
    translator = Translator.from_checkpoint([str(first), str(same)], torch.device("cpu"))
    assert isinstance(translator.model, Ensemble) and len(translator.model.models) == 2
    assert translator.translate(["the cat sees it"], DecodingConfig(beam_size=2, max_len_b=3))
    assert translator.info()["models"] == 2 and translator.info()["backend"] == "torch"
    with pytest.raises(NMTError, match=rf"^checkpoint={other} has another vocabulary .* than {first}"):
        Translator.from_checkpoint([str(first), str(other)], torch.device("cpu"))
    with pytest.raises(NMTError, match="an ensemble needs backend=torch"):
        Translator.from_checkpoint([str(first), str(same)], torch.device("cpu"), backend="ct2", ct2_model="x")


def test_an_ensemble_of_opposite_directions_is_refused_naming_both_checkpoints(tmp_path):
    """A joint vocabulary is shared by en->de and de->en models: the vocabulary check lets them pass."""
    en_de = write_checkpoint(
        tmp_path / "en-de.pt", tmp_path, "bpe", 1, ToyDataConfig(src_lang="en", tgt_lang="de")
    )
    de_en = write_checkpoint(
        tmp_path / "de-en.pt", tmp_path, "bpe", 2, ToyDataConfig(src_lang="de", tgt_lang="en")
    )
    with pytest.raises(NMTError) as e:
        Translator.from_checkpoint([str(en_de), str(de_en)], CPU)
    assert str(e.value) == (
        f"checkpoint={de_en} translates de->en, {en_de} en->de: the models of an ensemble must translate "
        "in one direction"
    )


# ------------------------------------------------------------------------------------ no matplotlib
@pytest.mark.slow
def test_translating_and_serving_never_import_matplotlib(checkpoint, tmp_path):
    """The translate script (every module it imports, -X importtime) and the service's and evaluation's
    modules with a translation, its attention and info: none loads matplotlib."""
    script = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            str(REPO / "scripts" / "translate.py"),
            f"checkpoint={checkpoint}",
        ],
        input="the cat sees it\n\nthe dog sees us\n",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert script.returncode == 0, script.stderr[-2000:]
    assert len(script.stdout.splitlines()) == 3 and "import time:" in script.stderr
    assert "matplotlib" not in script.stderr
    code = (
        "import sys, torch\n"
        "import nmt.serve.app, nmt.evaluation.evaluate\n"
        "from nmt.inference.translator import Translator\n"
        f"t = Translator.from_checkpoint({str(checkpoint)!r}, torch.device('cpu'))\n"
        "hyp = t.translations(['the cat sees it'], t.cfg.decoding).nbest[0][0]\n"
        "t.attention('the cat sees it', hyp.tokens), t.info()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))\n"
    )
    service = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert service.returncode == 0, service.stderr[-2000:]
    assert service.stdout.strip() == "[]"


def test_input_the_source_vocabulary_cannot_spell_is_warned_about_a_few_times(translator, caplog):
    """English-like lowercase letters spell, capitals it never saw and Cyrillic do not: still translated."""
    fresh = Translator(translator.model, translator.tokenizer, translator.cfg, Recorder())
    lines = ["the cat sees it", "THE CAT SEES IT", "кошка", "the кошка sees it", "кошка", "кошка", "кошка"]
    with caplog.at_level(logging.WARNING, logger="nmt.inference.translator"):
        out = fresh.translate(lines, DECODING)
    assert len(out) == 7 and all(out)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == (
        "line 2: 11 of its 12 characters (A C E I S T) are not in the model's source vocabulary and become "
        "<unk>: is it src text? The model translates src -> tgt"
    )
    assert [m.split(":")[0] for m in messages] == ["line 2", "line 3", "line 4", "more lines like it"]
