"""Evaluating a data split scores every line of it, empty lines included, as the sacrebleu CLI does."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from nmt.checkpoint import FORMAT_VERSION, atomic_save
from nmt.config import DecodingOverrides, EvaluateConfig, TrainConfig, to_container
from nmt.data import PreparedData, prepare_corpus, read_lines
from nmt.evaluation.evaluate import evaluate_checkpoint
from nmt.metrics import corpus_scores
from nmt.models import build_model
from nmt.tooling.shortlist_builder import build_shortlist

EN = ["a man rides a bike", "two dogs play in the park", "a woman sings a song", "the sun is hot"]
DE = ["ein mann fährt rad", "zwei hunde spielen im park", "eine frau singt ein lied", "die sonne ist heiß"]
# An ordinary pair, an empty one, an empty source, an empty reference.
TEST_EN = ["two dogs play", "", "", "a woman sings"]
TEST_DE = ["zwei hunde spielen", "", "die sonne", ""]


def write_corpus(folder: Path) -> None:
    folder.mkdir()
    valid = [line.replace(" a ", " the ") for line in EN], DE  # not a training pair: those are held out
    for split, en, de in (("train", EN * 10, DE * 10), ("valid", *valid), ("test", TEST_EN, TEST_DE)):
        (folder / f"{split}.en").write_text("".join(f"{line}\n" for line in en), encoding="utf-8")
        (folder / f"{split}.de").write_text("".join(f"{line}\n" for line in de), encoding="utf-8")


def tiny_config(tmp_path: Path, compose_train_cfg) -> TrainConfig:
    """A width-16 Transformer on the corpus above (written into ``tmp_path``), beam 2."""
    write_corpus(tmp_path / "corpus")
    return compose_train_cfg(
        "data=local",
        f"data.dir={tmp_path / 'corpus'}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "tokenizer.vocab_size=40",
        "model=transformer_small",
        "model.d_model=16",
        "model.ff_dim=32",
        "model.heads=2",
        "model.encoder_layers=1",
        "model.decoder_layers=1",
        "decoding.beam_size=2",
    )


def save_model(cfg: TrainConfig, data: PreparedData, path: Path, seed: int) -> Path:
    """A randomly initialised model as a checkpoint that evaluates."""
    torch.manual_seed(seed)
    tok = data.tokenizer
    model = build_model(cfg.model, tok.src_vocab_size, tok.tgt_vocab_size, tok.joint)
    atomic_save(
        {
            "format": FORMAT_VERSION,
            "model": model.state_dict(),
            "config": to_container(cfg),
            "tokenizer": tok.state_dict(),
            "vocab": dict(model.vocab_sizes),
        },
        path,
    )
    return path


def test_a_test_split_with_empty_lines_is_prepared_and_evaluated_whole(tmp_path, compose_train_cfg):
    cfg = tiny_config(tmp_path, compose_train_cfg)
    data = prepare_corpus(cfg.data, cfg.tokenizer, progress=False)
    assert data.raw("test") == (TEST_EN, TEST_DE) and len(data.splits["test"]) == 4

    checkpoint = save_model(cfg, data, tmp_path / "model.pt", seed=0)
    report = evaluate_checkpoint(EvaluateConfig(checkpoint=str(checkpoint), device="cpu"), tmp_path / "eval")
    hyps = read_lines(Path(report.hypotheses))
    assert report.test_set == "test" and report.sentences == len(hyps) == 4
    assert hyps[1] == hyps[2] == ""  # an empty source translates to an empty line
    assert report.scores["bleu"].score == corpus_scores(hyps, TEST_DE)["bleu"].score


def test_ensembles_that_share_their_first_model_write_their_own_files(tmp_path, compose_train_cfg):
    cfg = tiny_config(tmp_path, compose_train_cfg)
    data = prepare_corpus(cfg.data, cfg.tokenizer, progress=False)
    a, b, c = (save_model(cfg, data, tmp_path / f"{name}.pt", seed) for seed, name in enumerate("abc"))
    reports = [
        evaluate_checkpoint(EvaluateConfig(checkpoint=[str(a), str(m)], device="cpu"), tmp_path / "eval")
        for m in (b, c)
    ]
    hyps, jsons = ({Path(getattr(r, kind)) for r in reports} for kind in ("hypotheses", "report"))
    assert len(hyps) == len(jsons) == 2 and all(p.is_file() for p in hyps | jsons)
    assert all(p.name.startswith("a.ensemble2-") and p.name.endswith(".test.beam2.hyp") for p in hyps)
    for report, member in zip(reports, (b, c)):  # each file holds its own ensemble's report
        written = json.loads(Path(report.report).read_text())
        assert written["checkpoint"] == f"{a.resolve()} + {member.resolve()}"


def test_a_search_over_a_shortlist_writes_its_own_files(tmp_path, compose_train_cfg):
    cfg = tiny_config(tmp_path, compose_train_cfg)
    data = prepare_corpus(cfg.data, cfg.tokenizer, progress=False)
    checkpoint = save_model(cfg, data, tmp_path / "model.pt", seed=0)
    tok = data.tokenizer
    shortlist = build_shortlist(
        tok.encode_src(EN), tok.encode_tgt(DE), tok, k=2, frequent=1, direction=("en", "de")
    )
    shortlist.save(tmp_path / "shortlist.k2.n1.json")
    full, listed = (
        evaluate_checkpoint(
            EvaluateConfig(checkpoint=str(checkpoint), device="cpu", decoding=DecodingOverrides(shortlist=s)),
            tmp_path / "eval",
        )
        for s in (None, str(tmp_path / "shortlist.k2.n1.json"))
    )
    assert Path(full.hypotheses).name == "model.test.beam2.hyp"
    assert Path(listed.hypotheses).name == "model.test.beam2.shortlist.k2.n1.hyp"
    assert Path(full.report) != Path(listed.report) and Path(full.report).is_file()
