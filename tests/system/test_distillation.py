"""Sequence-level distillation with the session's toy model as the teacher: the corpus it writes is the
teacher's translations of the training sources (plus the original pairs on request) beside the original
valid and test splits, data=local reads it, an interrupted run resumes to the same files, and a second
run translates nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from nmt.config import DistillConfig, LocalDataConfig
from nmt.data import load_source, prepare_text, read_lines, read_text
from nmt.inference.translator import Translator
from nmt.tooling.distill import distill

pytestmark = pytest.mark.slow

TRAIN = 60  # toy training sources distilled: 3 chunks of 25, the last one short
CHUNK = 25


@pytest.fixture
def distill_cfg(compose_cfg, toy_run, tmp_path):
    """scripts/distill.py's config for the toy teacher over a small toy corpus cached in ``tmp_path``."""

    def make(*overrides: str, cache: Path = tmp_path / "cache") -> DistillConfig:
        return OmegaConf.to_object(
            compose_cfg(
                "distill",
                f"teacher={toy_run.checkpoints / 'last.pt'}",
                "device=cpu",
                "data=toy",
                f"data.cache_dir={cache}",
                f"data.train_size={TRAIN}",
                "data.valid_size=10",
                "data.test_size=10",
                f"distill.chunk_sentences={CHUNK}",
                *overrides,
            )
        )

    return make


def read_corpus(folder: Path) -> dict[str, list[str]]:
    return {path.name: read_lines(path) for path in sorted(folder.iterdir())}


class TranslationCounter:
    """Counts the Translator's translate calls; raises at call ``fail_at`` (1-based) if given."""

    def __init__(self, monkeypatch, fail_at: int | None = None):
        self.calls, self.fail_at = 0, fail_at
        original = Translator.translate

        def translate(translator, lines, *args, **kwargs):
            self.calls += 1
            if self.calls == self.fail_at:
                raise KeyboardInterrupt  # what Ctrl-C raises in the middle of a run
            return original(translator, lines, *args, **kwargs)

        monkeypatch.setattr(Translator, "translate", translate)


def test_the_corpus_holds_the_teachers_translations_and_data_local_reads_it(distill_cfg, toy_run):
    cfg = distill_cfg()
    corpus = distill(cfg, progress=False)
    text = prepare_text(cfg.data, progress=False)
    sources = read_text(text, "train", "src")
    teacher = Translator.from_checkpoint(str(toy_run.checkpoints / "last.pt"), torch.device("cpu"))
    expected = teacher.translate(sources, teacher.cfg.decoding)

    files = read_corpus(corpus.folder)
    names = [f"{split}.{lang}" for split in ("test", "train", "valid") for lang in ("src", "tgt")]
    assert sorted(files) == names
    assert files["train.src"] == sources and files["train.tgt"] == expected
    for split in ("valid", "test"):  # the original references, for choosing and scoring students
        assert files[f"{split}.src"] == read_lines(text / f"{split}.src")
        assert files[f"{split}.tgt"] == read_lines(text / f"{split}.tgt")
    assert (corpus.distilled, corpus.translated_now, corpus.train_pairs) == (TRAIN, TRAIN, TRAIN)

    local = load_source(LocalDataConfig(dir=str(corpus.folder), src_lang="src", tgt_lang="tgt"))
    assert local["train"] == {"src": sources, "tgt": expected}
    assert [len(local[split]["tgt"]) for split in ("valid", "test")] == [10, 10]


def test_an_interrupted_run_resumes_to_the_files_of_an_uninterrupted_run(distill_cfg, monkeypatch, tmp_path):
    whole = distill(distill_cfg(cache=tmp_path / "whole"), progress=False)

    cfg = distill_cfg(cache=tmp_path / "interrupted")
    with pytest.raises(KeyboardInterrupt):
        TranslationCounter(monkeypatch, fail_at=2)
        distill(cfg, progress=False)
    chunks = list((tmp_path / "interrupted" / "distilled").glob("*/translations/*"))
    assert [p.name for p in chunks] == [f"{0:09d}-{CHUNK:09d}.tgt"]  # the first chunk, whole
    monkeypatch.undo()

    counter = TranslationCounter(monkeypatch)
    resumed = distill(cfg, progress=False)
    assert counter.calls == 2 and resumed.translated_now == TRAIN - CHUNK  # the two chunks left
    assert resumed.folder.name == whole.folder.name  # the key is of contents, not of where they are
    assert read_corpus(resumed.folder) == read_corpus(whole.folder)


def test_a_second_run_translates_nothing_and_keep_original_doubles_the_pairs(distill_cfg, monkeypatch):
    first = distill(distill_cfg(), progress=False)
    counter = TranslationCounter(monkeypatch, fail_at=1)  # any translation would fail the test

    again = distill(distill_cfg(), progress=False)
    assert again.folder == first.folder and again.translated_now == 0
    assert read_corpus(again.folder) == read_corpus(first.folder)

    both = distill(distill_cfg("distill.keep_original=true"), progress=False)
    assert counter.calls == 0 and both.folder != first.folder and both.train_pairs == 2 * TRAIN
    distilled, doubled = read_corpus(first.folder), read_corpus(both.folder)
    original = read_text(prepare_text(distill_cfg().data, progress=False), "train", "tgt")
    assert doubled["train.src"] == distilled["train.src"] * 2
    assert doubled["train.tgt"] == distilled["train.tgt"] + original
    assert doubled["valid.tgt"] == distilled["valid.tgt"]


def test_other_decoding_settings_are_another_corpus(distill_cfg):
    beam = distill(distill_cfg(), progress=False)
    greedy = distill(distill_cfg("decoding.beam_size=1"), progress=False)
    assert greedy.folder.parent != beam.folder.parent and greedy.translated_now == TRAIN


def test_the_script_distils_with_an_ensemble_and_prints_the_students_command(toy, toy_run, tmp_path):
    teachers = f"[{toy_run.checkpoints / 'last.pt'},{toy_run.checkpoints / 'best.pt'}]"
    args = [f"teacher={teachers}", "data=toy", f"data.cache_dir={tmp_path}", "data.train_size=20"]
    proc = toy.script("distill.py", *args, "data.valid_size=5", "data.test_size=5", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    folder = next((tmp_path / "distilled").glob("*/distilled-*"))
    assert f"corpus: {folder} (20 training pairs)" in proc.stdout
    assert (
        f"train the student: bash scripts/run.sh experiment=multi30k_distill_cpu data.dir={folder} "
        "data.src_lang=src data.tgt_lang=tgt" in proc.stdout
    )
    assert len(read_lines(folder / "train.tgt")) == 20

    wrong = toy.script("distill.py", *args, "data.src_lang=tgt", "data.tgt_lang=src", cwd=tmp_path)
    assert wrong.returncode == 1
    assert wrong.stderr.strip().splitlines() == [
        "error: data.src_lang=tgt data.tgt_lang=src: the model translates src -> tgt; "
        "set data.src_lang and data.tgt_lang to match"
    ]


def test_the_ct2_backend_distils_into_its_own_corpus(distill_cfg, toy_ct2):
    model = toy_ct2  # the session's toy model (the teacher) exported by scripts/export_ct2.py
    torch_corpus = distill(distill_cfg(), progress=False)
    ct2_corpus = distill(distill_cfg("backend=ct2", f"ct2_model={model}"), progress=False)
    assert ct2_corpus.folder.parent != torch_corpus.folder.parent and ct2_corpus.translated_now == TRAIN
    ct2_lines, torch_lines = (read_lines(c.folder / "train.tgt") for c in (ct2_corpus, torch_corpus))
    # The same model through another search implementation: nearly always the same translation.
    assert sum(a == b for a, b in zip(ct2_lines, torch_lines)) >= 0.9 * TRAIN
