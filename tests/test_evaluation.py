"""Evaluating a data split scores every line of it, empty lines included, as the sacrebleu CLI does."""

from __future__ import annotations

from pathlib import Path

import torch

from nmt.checkpoint import FORMAT_VERSION, atomic_save
from nmt.config import EvaluateConfig, to_container
from nmt.data import prepare_corpus, read_lines
from nmt.evaluation import evaluate_checkpoint
from nmt.metrics import corpus_scores
from nmt.models import build_model

EN = ["a man rides a bike", "two dogs play in the park", "a woman sings a song", "the sun is hot"]
DE = ["ein mann fährt rad", "zwei hunde spielen im park", "eine frau singt ein lied", "die sonne ist heiß"]
# An ordinary pair, an empty one, an empty source, an empty reference.
TEST_EN = ["two dogs play", "", "", "a woman sings"]
TEST_DE = ["zwei hunde spielen", "", "die sonne", ""]


def write_corpus(folder: Path) -> None:
    folder.mkdir()
    for split, en, de in (("train", EN * 10, DE * 10), ("valid", EN, DE), ("test", TEST_EN, TEST_DE)):
        (folder / f"{split}.en").write_text("".join(f"{line}\n" for line in en), encoding="utf-8")
        (folder / f"{split}.de").write_text("".join(f"{line}\n" for line in de), encoding="utf-8")


def test_a_test_split_with_empty_lines_is_prepared_and_evaluated_whole(tmp_path, compose_train_cfg):
    write_corpus(tmp_path / "corpus")
    cfg = compose_train_cfg(
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
    data = prepare_corpus(cfg.data, cfg.tokenizer, progress=False)
    assert data.raw("test") == (TEST_EN, TEST_DE) and len(data.splits["test"]) == 4

    torch.manual_seed(0)
    tok = data.tokenizer
    model = build_model(cfg.model, tok.src_vocab_size, tok.tgt_vocab_size, tok.joint)
    checkpoint = tmp_path / "model.pt"
    atomic_save(
        {
            "format": FORMAT_VERSION,
            "model": model.state_dict(),
            "config": to_container(cfg),
            "tokenizer": tok.state_dict(),
            "vocab": dict(model.vocab_sizes),
        },
        checkpoint,
    )
    report = evaluate_checkpoint(EvaluateConfig(checkpoint=str(checkpoint), device="cpu"), tmp_path / "eval")
    hyps = read_lines(Path(report.hypotheses))
    assert report.test_set == "test" and report.sentences == len(hyps) == 4
    assert hyps[1] == hyps[2] == ""  # an empty source translates to an empty line
    assert report.scores["bleu"].score == corpus_scores(hyps, TEST_DE)["bleu"].score
