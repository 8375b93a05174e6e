"""Vocabulary shortlists: the k likeliest targets of each source subword by sentence-level co-occurrence,
the N most frequent targets and the specials always in, a versioned file tied to its tokenizer, and a
CTranslate2 vocabulary map that CTranslate2 reads and decodes within."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import tiny_transformer

import nmt.data.corpus as corpus_module
from nmt.checkpoint import FORMAT_VERSION, atomic_save
from nmt.config import (
    ShortlistConfig,
    TokenizerConfig,
    ToyDataConfig,
    TrainConfig,
    TransformerConfig,
    to_container,
)
from nmt.data import prepare_text, read_text, text_path
from nmt.decoding.shortlist import coverage, load_shortlist, write_vmap
from nmt.errors import NMTError
from nmt.text.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt.text.tokenizer import Tokenizer, train_tokenizer
from nmt.tooling.shortlist_builder import _count, build_shortlist, shortlist_for_checkpoint

REPO = Path(__file__).resolve().parents[1]
SPECIALS = [PAD_ID, UNK_ID, BOS_ID, EOS_ID]
TOY = ("src", "tgt")  # the toy task's direction


def toy_tokenizer(folder: Path, vocab_size: int) -> Tokenizer:
    """A joint SentencePiece model of the toy task's text (cached in ``folder``)."""
    text = prepare_text(ToyDataConfig(cache_dir=str(folder), train_size=300), progress=False)
    return train_tokenizer(
        TokenizerConfig(vocab_size=vocab_size),
        text_path(text, "train", "src"),
        text_path(text, "train", "tgt"),
        folder,
    )


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    return toy_tokenizer(tmp_path_factory.mktemp("tok"), 120)


# Source 10 occurs in four pairs: with target 20 in all four, 21 in three, 23 and 22 in two (a tie,
# broken by id), 24 in one. Target 30 is in every pair, twice: the most frequent, so always a candidate
# and never one of a source's k. Source 11 occurs once, beside 10.
SOURCES = [[10, 12], [10, 10], [10], [10, 11]]
TARGETS = [[20, 21, 22, 30, 30], [20, 21, 23, 30, 30], [20, 21, 22, 23, 30, 30], [20, 24, 30, 30]]


def test_each_source_keeps_its_k_likeliest_targets_beyond_the_frequent_ones(tokenizer):
    shortlist = build_shortlist(SOURCES, TARGETS, tokenizer, k=4, frequent=1, direction=TOY)
    assert shortlist.always == [*SPECIALS, 30]
    assert shortlist.candidates[10] == [20, 21, 22, 23]  # p = 1, 3/4, 1/2, 1/2; 24 (1/4) is the fifth
    assert shortlist.candidates[11] == [20, 24]  # every target of its pair but the frequent one
    assert shortlist.candidates[12] == [20, 21, 22]
    assert build_shortlist(SOURCES, TARGETS, tokenizer, k=2, frequent=1, direction=TOY).candidates[10] == [
        20,
        21,
    ]
    assert shortlist.candidates[13] == [] and len(shortlist.candidates) == tokenizer.src_vocab_size
    assert shortlist.pairs == 4 and shortlist.tokenizer_fingerprint == tokenizer.fingerprint
    # Without frequent targets, 30 competes like any other: p = 1 as 20's, after it by id.
    assert build_shortlist(SOURCES, TARGETS, tokenizer, k=2, frequent=0, direction=TOY).candidates[10] == [
        20,
        30,
    ]


def test_the_frequent_targets_and_the_specials_are_candidates_of_every_batch(tokenizer):
    shortlist = build_shortlist(SOURCES, TARGETS, tokenizer, k=1, frequent=3, direction=TOY)
    # 30 (8 times), 20 and 21 (4 and 3 times); the specials, though never counted, are in.
    assert shortlist.always == [*SPECIALS, 20, 21, 30]
    assert shortlist.select([]) == shortlist.always
    assert shortlist.select([[12]]) == [*SPECIALS, 20, 21, 22, 30]
    assert shortlist.select([[11], [12, 12]]) == [*SPECIALS, 20, 21, 22, 24, 30]  # the batch's union
    # The specials keep their ids as positions in the sorted candidates: masks by id still apply.
    assert shortlist.select([[10, 11]])[: len(SPECIALS)] == SPECIALS


@pytest.mark.parametrize("block", [1, 3])
def test_counting_in_blocks_counts_each_pair_of_sentences_once(tokenizer, block):
    vocab = tokenizer.src_vocab_size, tokenizer.tgt_vocab_size
    targets, with_source, one_block = _count(SOURCES, TARGETS, *vocab)
    in_blocks = _count(SOURCES, TARGETS, *vocab, block=block)
    assert targets.tolist() == in_blocks[0].tolist() and with_source.tolist() == in_blocks[1].tolist()
    for a, b in zip(one_block, in_blocks[2]):
        assert a.tolist() == b.tolist()
    pairs = dict(zip(zip(one_block[0].tolist(), one_block[1].tolist()), one_block[2].tolist()))
    assert pairs[(10, 20)] == 4 and pairs[(10, 30)] == 4 and pairs[(11, 24)] == 1 and (12, 23) not in pairs
    assert targets[30] == 8 and with_source[10] == 4 and with_source[12] == 1


def test_coverage_is_the_share_of_reference_subwords_among_the_candidates(tokenizer):
    shortlist = build_shortlist(SOURCES, TARGETS, tokenizer, k=1, frequent=1, direction=TOY)  # 10 -> 20, ...
    result = coverage(shortlist, [[10], [12]], [[20, 21, 30], [99]])
    assert result.sentences == 2 and result.covered == 2 / 4
    assert result.mean_candidates == len(shortlist.select([[10]]))  # both sentences get 20 and 30


def test_the_file_is_versioned_and_tied_to_its_tokenizer_and_direction(tokenizer, tmp_path):
    shortlist = build_shortlist(SOURCES, TARGETS, tokenizer, k=3, frequent=2, direction=("en", "de"))
    path = tmp_path / shortlist.filename()
    assert path.name == "shortlist.k3.n2.json"
    shortlist.save(path)
    assert load_shortlist(path, tokenizer, ("en", "de")) == shortlist

    stored = json.loads(path.read_text())
    assert (stored["format"], stored["version"], stored["k"], stored["frequent"]) == (
        "nmt-shortlist",
        2,
        3,
        2,
    )
    assert (stored["src_lang"], stored["tgt_lang"]) == ("en", "de")
    # a joint tokenizer serves both directions: the shortlist of one is refused by a model of the other
    with pytest.raises(NMTError) as e:
        load_shortlist(path, tokenizer, ("de", "en"))
    assert str(e.value) == (
        f"{path} was built for en->de, the model translates de->en; build one for this model with "
        "scripts/build_shortlist.py"
    )
    # a file written before the direction was recorded cannot be checked: refused, to be built again
    old = {key: value for key, value in stored.items() if key not in ("src_lang", "tgt_lang", "built_from")}
    path.write_text(json.dumps({**old, "version": 1}))
    with pytest.raises(NMTError) as e:
        load_shortlist(path, tokenizer, ("en", "de"))
    assert str(e.value) == (
        f"{path}: shortlist format version 1, which records no direction, this nmt reads version 2; "
        "build it again with scripts/build_shortlist.py"
    )
    path.write_text(json.dumps({key: value for key, value in stored.items() if key != "tgt_lang"}))
    with pytest.raises(NMTError, match=r"not a shortlist \(no 'tgt_lang'\); build it again"):
        load_shortlist(path, tokenizer, ("en", "de"))
    path.write_text(json.dumps(stored))
    other = toy_tokenizer(tmp_path / "other", 100)
    with pytest.raises(NMTError, match=r"built for another tokenizer \(fingerprint \w+\) than the model's"):
        load_shortlist(path, other, ("en", "de"))
    with pytest.raises(NMTError, match="another tokenizer"):
        write_vmap(shortlist, other, tmp_path / "vmap.txt")

    path.write_text(json.dumps({**stored, "version": 3}))
    with pytest.raises(
        NMTError, match="shortlist format version 3, this nmt reads version 2; build it again"
    ):
        load_shortlist(path, tokenizer, TOY)
    path.write_text("{not json")
    with pytest.raises(NMTError, match="not a shortlist"):
        load_shortlist(path, tokenizer, TOY)
    with pytest.raises(NMTError, match="shortlist not found"):
        load_shortlist(tmp_path / "missing.json", tokenizer, TOY)
    with pytest.raises(NMTError, match="k=-1, frequent=2: must be >= 0"):
        build_shortlist(SOURCES, TARGETS, tokenizer, k=-1, frequent=2, direction=TOY)


def test_the_vmap_lists_the_always_candidates_then_each_source_subwords(tokenizer, tmp_path):
    shortlist = build_shortlist(SOURCES, TARGETS, tokenizer, k=2, frequent=1, direction=TOY)
    write_vmap(shortlist, tokenizer, tmp_path / "vmap.txt")
    lines = (tmp_path / "vmap.txt").read_text(encoding="utf-8").splitlines()
    src, tgt = tokenizer.src_pieces, tokenizer.tgt_pieces
    # CTranslate2's format: the source n-gram, a tab, the target tokens separated by spaces; the empty
    # source's targets are candidates of every batch.
    assert lines[0] == "\t" + " ".join(tgt([*SPECIALS, 30]))
    assert lines[1:] == [
        f"{src([10])[0]}\t{' '.join(tgt([20, 21]))}",
        f"{src([11])[0]}\t{' '.join(tgt([20, 24]))}",
        f"{src([12])[0]}\t{' '.join(tgt([20, 21]))}",
    ]


def test_an_export_with_a_shortlist_decodes_within_its_vmap_and_only_for_that_shortlist(tokenizer, tmp_path):
    pytest.importorskip("ctranslate2")
    from nmt.config import DecodingConfig
    from nmt.ct2.backend import CT2Backend
    from nmt.ct2.export import export_model
    from nmt.ct2.format import read_export_info
    from nmt.inference.backends import TorchBackend

    text = prepare_text(ToyDataConfig(cache_dir=str(tmp_path), train_size=300))
    sources = tokenizer.encode_src(read_text(text, "train", "src"))
    targets = tokenizer.encode_tgt(read_text(text, "train", "tgt"))
    shortlist = build_shortlist(sources, targets, tokenizer, k=2, frequent=3, direction=TOY)
    shortlist.save(tmp_path / "s.json")
    model = tiny_transformer(tokenizer.src_vocab_size, seed=0, max_positions=48)
    mapped = export_model(model, tokenizer, tmp_path / "mapped", shortlist=tmp_path / "s.json", direction=TOY)
    plain = export_model(model, tokenizer, tmp_path / "plain")

    write_vmap(shortlist, tokenizer, tmp_path / "vmap.txt")
    assert (mapped / "vmap.txt").read_text() == (tmp_path / "vmap.txt").read_text()
    recorded = read_export_info(mapped)["shortlist"]
    assert (recorded["k"], recorded["frequent"], recorded["file"]) == (2, 3, str(tmp_path / "s.json"))
    assert read_export_info(plain)["shortlist"] is None and not (plain / "vmap.txt").exists()

    batch = sources[:3]  # few: their candidates are a small set
    search = DecodingConfig(beam_size=2, alpha=0.0, max_len_a=0.0, max_len_b=12)
    reference = TorchBackend(model, tokenizer, torch.device("cpu"), 48, TOY)  # for the hypotheses it cut
    free = CT2Backend(mapped, tokenizer, intra_threads=1).translate_ids(batch, search)
    within = CT2Backend(mapped, tokenizer, intra_threads=1, reference=reference).translate_ids(
        batch, DecodingConfig(**{**search.__dict__, "shortlist": str(tmp_path / "s.json")})
    )
    allowed = set(shortlist.select(batch))  # CTranslate2 decodes a call over its sentences' union
    assert all(set(hyps[0].tokens) <= allowed for hyps in within)
    assert any(not set(hyps[0].tokens) <= allowed for hyps in free)  # the random model strays without it

    other = build_shortlist(sources, targets, tokenizer, k=3, frequent=3, direction=TOY)
    other.save(tmp_path / "other.json")
    with pytest.raises(
        NMTError,
        match=r"other.json: the vocabulary map of ct2_model=.*mapped was made from "
        r"another shortlist \(.*s.json, k=2, frequent=3\); export it again with shortlist=",
    ):
        CT2Backend(mapped, tokenizer).check_shortlist(str(tmp_path / "other.json"))
    with pytest.raises(NMTError, match=r"s.json: ct2_model=.*plain has no vocabulary map; export it again"):
        CT2Backend(plain, tokenizer).check_shortlist(str(tmp_path / "s.json"))
    with pytest.raises(NMTError, match="shortlist not found: .*missing.json"):
        CT2Backend(mapped, tokenizer).check_shortlist(str(tmp_path / "missing.json"))


def write_checkpoint(tokenizer: Tokenizer, data_dir: Path, path: Path) -> None:
    """A checkpoint of a random tiny model, trained (so the config says) on the toy task."""
    cfg = TrainConfig(
        data=ToyDataConfig(cache_dir=str(data_dir), train_size=300, valid_size=50),
        model=TransformerConfig(d_model=16, ff_dim=32, heads=2, encoder_layers=1, decoder_layers=1),
    )
    model = tiny_transformer(tokenizer.src_vocab_size, seed=0)
    state = {"format": FORMAT_VERSION, "model": model.state_dict(), "config": to_container(cfg)}
    atomic_save({**state, "tokenizer": tokenizer.state_dict(), "vocab": dict(model.vocab_sizes)}, path)


def test_a_checkpoints_shortlist_is_built_from_its_training_data_and_saved_beside_it(tokenizer, tmp_path):
    write_checkpoint(tokenizer, tmp_path / "data", tmp_path / "run" / "model.pt")
    cfg = ShortlistConfig(checkpoint=str(tmp_path / "run" / "model.pt"), k=5, frequent=10)
    shortlist, path, valid = shortlist_for_checkpoint(cfg, progress=False)
    assert (
        path == tmp_path / "run" / "shortlist.k5.n10.json"
        and load_shortlist(path, tokenizer, TOY) == shortlist
    )
    text = tmp_path / "data" / "toy"
    assert shortlist.pairs == 300 and valid.sentences == 50 and 0.9 < valid.covered <= 1.0
    (text_dir,) = text.glob("text-*")
    src = tokenizer.encode_src(read_text(text_dir, "train", "src"))
    tgt = tokenizer.encode_tgt(read_text(text_dir, "train", "tgt"))
    assert shortlist.candidates == build_shortlist(src, tgt, tokenizer, 5, 10, direction=TOY).candidates
    assert (shortlist.src_lang, shortlist.tgt_lang) == TOY
    assert shortlist.built_from == {"checkpoint": str(tmp_path / "run" / "model.pt"), "data": "toy"}


def test_a_shortlist_reads_the_prepared_ids_and_encodes_nothing_twice(tokenizer, tmp_path, monkeypatch):
    """The training text is read from the prepared ids (memory-mapped, the training run's when they
    exist), never encoded as whole lists: a corpus of millions of pairs would not fit in memory."""
    write_checkpoint(tokenizer, tmp_path / "data", tmp_path / "run" / "model.pt")
    cfg = ShortlistConfig(checkpoint=str(tmp_path / "run" / "model.pt"), k=5, frequent=10)
    first, _, valid = shortlist_for_checkpoint(cfg, progress=False)
    (text,) = (tmp_path / "data" / "toy").glob("text-*")
    assert [p.name for p in text.glob("ids-*")] == [f"ids-{tokenizer.fingerprint}"]

    def encoding(*args, **kwargs):
        raise AssertionError("encoded again")

    for name in ("encode_src", "encode_tgt"):
        monkeypatch.setattr(Tokenizer, name, encoding)
    monkeypatch.setattr(corpus_module, "encode_chunk", encoding)
    monkeypatch.setattr(corpus_module, "encode_lines", encoding)
    again, _, valid_again = shortlist_for_checkpoint(cfg, progress=False)
    assert again == first and valid_again == valid


def test_the_script_writes_the_shortlist_the_export_takes_it_and_both_refuse_in_one_line(tokenizer, tmp_path):
    write_checkpoint(tokenizer, tmp_path / "data", tmp_path / "model.pt")

    def script(*args: str, name: str = "build_shortlist.py") -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(REPO / "scripts" / name), f"checkpoint={tmp_path / 'model.pt'}", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )

    done = script("k=3", "frequent=4")
    assert done.returncode == 0, done.stderr
    assert f"-> {tmp_path / 'shortlist.k3.n4.json'}" in done.stdout and "valid: " in done.stdout
    shortlist = load_shortlist(tmp_path / "shortlist.k3.n4.json", tokenizer, TOY)
    if importlib.util.find_spec("ctranslate2"):
        export = ["output=ct2", "shortlist=shortlist.k3.n4.json"]
        exported = script(*export, name="export_ct2.py")
        assert exported.returncode == 0, exported.stderr
        assert (tmp_path / "ct2" / "vmap.txt").read_text(encoding="utf-8").splitlines()[0] == "\t" + " ".join(
            tokenizer.tgt_pieces(shortlist.always)
        )
        missing = script("output=other", "shortlist=missing.json", name="export_ct2.py")
        assert missing.returncode == 1 and missing.stderr.strip().splitlines() == [
            "error: shortlist not found: missing.json; build it with scripts/build_shortlist.py"
        ]
        assert not (tmp_path / "other").exists() and not (tmp_path / ".other.tmp").exists()
    wrong = script("data=toy", "data.src_lang=tgt", "data.tgt_lang=src")
    assert wrong.returncode == 1 and wrong.stderr.strip().splitlines() == [
        "error: data.src_lang=tgt data.tgt_lang=src: the model translates src -> tgt; "
        "set data.src_lang and data.tgt_lang to match"
    ]
