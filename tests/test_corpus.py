"""prepare_corpus end to end (toy, tiny local files, the shared data) and the prepare_data.py script."""

import json
import logging
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import nmt.data.corpus as corpus_module
import nmt.text.tokenizer as tokenizer_module
from nmt.config import CleanConfig, LocalDataConfig, TokenizerConfig, ToyDataConfig
from nmt.data import format_summary, prepare_corpus
from nmt.errors import NMTError

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO / "../shared/data"
TOY_TOKENIZER = TokenizerConfig(vocab_size=150)


def toy(tmp_path: Path, **kwargs) -> ToyDataConfig:
    return ToyDataConfig(cache_dir=str(tmp_path), train_size=400, valid_size=20, test_size=30, **kwargs)


def forbid_rebuilding(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("rebuilt although cached")

    monkeypatch.setattr(corpus_module, "grouped_chunks", fail)
    monkeypatch.setattr(tokenizer_module, "_train", fail)
    monkeypatch.setattr(corpus_module, "EncodedWriter", fail)


def test_toy_end_to_end(tmp_path):
    data = prepare_corpus(toy(tmp_path), TOY_TOKENIZER, progress=False)
    assert data.root.parent == tmp_path / "toy"
    assert {name: len(split) for name, split in data.splits.items()} == {
        "train": 400,
        "valid": 20,
        "test": 30,
    }
    src_text, ref_text = data.raw("test")
    test = data.splits["test"]
    assert data.tokenizer.decode_src([test.src(i) for i in range(len(test))]) == src_text
    assert data.tokenizer.decode_tgt([test.tgt(i) for i in range(len(test))]) == ref_text
    assert test.src_lengths.tolist() == [len(test.src(i)) for i in range(len(test))]
    assert isinstance(test.tgt(0), np.memmap) and test.tgt(0).dtype == np.uint16
    assert data.summary["pairs"] == {"train": 400, "valid": 20, "test": 30}
    assert data.summary["tokens"]["train"]["src"] == int(data.splits["train"].src_lengths.sum())
    assert data.summary["vocab_size"] == {"src": 150, "tgt": 150}


def test_second_run_reuses_everything(tmp_path, monkeypatch):
    first = prepare_corpus(toy(tmp_path), TOY_TOKENIZER, progress=False)
    forbid_rebuilding(monkeypatch)
    started = time.perf_counter()
    second = prepare_corpus(toy(tmp_path), TOY_TOKENIZER, progress=False)
    assert time.perf_counter() - started < 2
    assert second.summary == first.summary and second.raw("valid") == first.raw("valid")


def test_swapped_direction_shares_text_and_ids(tmp_path, monkeypatch):
    forward = prepare_corpus(toy(tmp_path), TOY_TOKENIZER, progress=False)
    forbid_rebuilding(monkeypatch)
    backward = prepare_corpus(toy(tmp_path, src_lang="tgt", tgt_lang="src"), TOY_TOKENIZER, progress=False)
    assert backward.raw("test") == tuple(reversed(forward.raw("test")))
    assert backward.splits["train"].src(5).tolist() == forward.splits["train"].tgt(5).tolist()


def test_changed_settings_prepare_anew(tmp_path):
    first = prepare_corpus(toy(tmp_path), TOY_TOKENIZER, progress=False)
    other_data = prepare_corpus(toy(tmp_path, seed=5), TOY_TOKENIZER, progress=False)
    other_cleaning = prepare_corpus(
        toy(tmp_path, clean=CleanConfig(max_words=6)), TOY_TOKENIZER, progress=False
    )
    assert len({first.root, other_data.root, other_cleaning.root}) == 3
    assert other_cleaning.summary["dropped"]["train"]["too_long"] > 0
    other_tokenizer = prepare_corpus(toy(tmp_path), replace(TOY_TOKENIZER, vocab_size=120), progress=False)
    assert other_tokenizer.root == first.root and other_tokenizer.tokenizer.src_vocab_size == 120


def local_corpus(tmp_path: Path) -> LocalDataConfig:
    """{train,valid,test}.{en,de} of 120/8/8 lines; a quarter of the pairs have an empty English side."""
    src_dir = tmp_path / "corpus"
    src_dir.mkdir()
    en = ["hello world", "", "a b c d e f g h i j", "good morning"] * 30
    de = ["hallo welt", "leer", "a", "guten morgen"] * 30
    for split, n in (("train", 120), ("valid", 8), ("test", 8)):
        lines = en[:n] if split == "train" else [f"{line} {split}" if line else "" for line in en[:n]]
        (src_dir / f"{split}.en").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        (src_dir / f"{split}.de").write_text("".join(f"{line}\n" for line in de[:n]), encoding="utf-8")
    return LocalDataConfig(dir=str(src_dir), name="corpus", cache_dir=str(tmp_path / "cache"))


SAMPLING = replace(TOY_TOKENIZER, sampling_alpha=0.3, sampled_copies=3)


def test_subword_sampling_resegments_the_same_training_text_once(tmp_path, monkeypatch):
    plain = prepare_corpus(toy(tmp_path), TOY_TOKENIZER, progress=False)
    assert plain.train_segmentations == [plain.splits["train"]]
    monkeypatch.setattr(tokenizer_module, "_train", lambda *a, **k: pytest.fail("retrained"))
    data = prepare_corpus(toy(tmp_path), SAMPLING, progress=False)  # same tokenizer, new copies
    assert data.tokenizer.fingerprint == plain.tokenizer.fingerprint
    assert len(data.train_segmentations) == 3 and data.splits["train"] not in data.train_segmentations
    src_text, tgt_text = data.raw("train")
    rows = [[tuple(copy.src(i)) for i in range(len(copy))] for copy in data.train_segmentations]
    for copy in data.train_segmentations:
        assert data.tokenizer.decode_src([copy.src(i) for i in range(len(copy))]) == src_text
        assert data.tokenizer.decode_tgt([copy.tgt(i) for i in range(len(copy))]) == tgt_text
        assert copy.src_lengths.sum() > plain.splits["train"].src_lengths.sum()  # merges were dropped
    assert len({tuple(r) for r in rows}) == 3  # each copy its own segmentation
    assert "segmented 3 times by sampling" in format_summary(data.summary)

    # SentencePiece's sampling differs between processes whatever the seed, so the copies are made once
    # and every later run (resumed ones too) trains on the cached ones.
    forbid_rebuilding(monkeypatch)
    again = prepare_corpus(toy(tmp_path), SAMPLING, progress=False)
    assert [[tuple(c.src(i)) for i in range(len(c))] for c in again.train_segmentations] == rows


def test_local_corpus_records_what_cleaning_dropped(tmp_path):
    data = prepare_corpus(local_corpus(tmp_path), TokenizerConfig(vocab_size=40), progress=False)
    assert data.summary["pairs"] == {"train": 60, "valid": 8, "test": 8}  # valid/test kept whole
    assert data.summary["dropped"]["train"] == {
        "empty": 30, "too_short": 0, "too_long": 0, "ratio": 30, "in_valid_test": 0
    }  # fmt: skip
    assert sum(data.summary["dropped"]["test"].values()) == 0
    assert data.raw("test")[0][1] == "" and len(data.splits["test"].src(1)) == 0
    meta = json.loads((data.root / "meta.json").read_text())
    assert meta["dropped"] == data.summary["dropped"]
    table = format_summary(data.summary)
    assert "train" in table and "60 (empty 30, ratio 30)" in table and "en -> de" in table


def test_training_pairs_that_are_valid_or_test_pairs_are_removed_and_counted(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    cfg = local_corpus(tmp_path)
    folder = Path(cfg.dir)
    test_en = (folder / "test.en").read_text(encoding="utf-8").splitlines()
    test_de = (folder / "test.de").read_text(encoding="utf-8").splitlines()
    with (
        open(folder / "train.en", "a", encoding="utf-8") as en,
        open(folder / "train.de", "a", encoding="utf-8") as de,
    ):
        for _ in range(3):  # the first test pair three times, the valid pair once
            en.write(f"{test_en[0]}\n"), de.write(f"{test_de[0]}\n")
        en.write("good morning valid\n"), de.write("guten morgen\n")
        en.write("good morning\n"), de.write("guten morgen valid\n")  # one side only: kept
    data = prepare_corpus(cfg, TokenizerConfig(vocab_size=40), progress=False)
    assert data.summary["dropped"]["train"]["in_valid_test"] == 4
    assert data.summary["pairs"]["train"] == 61
    assert test_en[0] not in data.raw("train")[0]
    assert "train: kept 61 pairs, dropped 64 (empty 30, ratio 30, in_valid_test 4)" in caplog.text


def test_local_corpus_swapped_direction_reuses_the_cleaned_text(tmp_path, monkeypatch):
    cfg = local_corpus(tmp_path)
    forward = prepare_corpus(cfg, TokenizerConfig(vocab_size=40), progress=False)
    forbid_rebuilding(monkeypatch)  # no re-reading, re-cleaning, re-training or re-encoding
    backward = prepare_corpus(replace(cfg, src_lang="de", tgt_lang="en"), TokenizerConfig(vocab_size=40))
    assert backward.root == forward.root
    assert backward.raw("train") == tuple(reversed(forward.raw("train")))
    assert backward.raw("test") == tuple(reversed(forward.raw("test")))
    assert backward.splits["train"].src(3).tolist() == forward.splits["train"].tgt(3).tolist()
    assert backward.summary["direction"] == ["de", "en"]


def test_same_languages_are_refused(tmp_path):
    with pytest.raises(NMTError, match="both 'src'"):
        prepare_corpus(toy(tmp_path, tgt_lang="src"), TOY_TOKENIZER, progress=False)


# ------------------------------------------------------------------------------------------- script


def run_script(*overrides: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts/prepare_data.py"), *overrides],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_prepare_data_script_prints_the_summary(tmp_path):
    result = run_script("experiment=toy", f"data.cache_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 0, result.stderr
    assert "src -> tgt" in result.stdout and "4,000" in result.stdout
    assert (tmp_path / "toy").is_dir()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data=local"], "error: missing required setting(s): data.dir"),
        (
            ["data=local", "data.dir=/nonexistent/corpus"],
            "error: data.dir=/nonexistent/corpus: no such folder; data=local reads train.en, train.de,",
        ),
    ],
)
def test_prepare_data_script_reports_user_errors_in_one_line(tmp_path, overrides, message):
    result = run_script(*overrides, f"data.cache_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 1
    assert any(line.startswith(message) for line in result.stderr.splitlines()), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(not (SHARED / "multi30k-de-en/train.en").is_file(), reason="../shared/data not available")
def test_prepare_shared_multi30k(tmp_path):
    result = run_script(
        "data=local",
        "data.dir=../shared/data/multi30k-de-en",
        f"data.cache_dir={tmp_path}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert result.returncode == 0, result.stderr
    assert "28,998" in result.stdout and "1,014" in result.stdout and "1,000" in result.stdout


def test_a_training_split_entirely_in_valid_or_test_is_refused_and_nothing_cached(tmp_path):
    cfg = local_corpus(tmp_path)
    folder = Path(cfg.dir)
    for lang in ("en", "de"):
        (folder / f"train.{lang}").write_text((folder / f"valid.{lang}").read_text(encoding="utf-8"))
    with pytest.raises(NMTError, match=r"no training pair is left to train on \(dropped: .*in_valid_test"):
        prepare_corpus(cfg, TokenizerConfig(vocab_size=40), progress=False)
    assert not list((tmp_path / "cache").rglob("meta.json"))
