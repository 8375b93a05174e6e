"""Distillation's parts that need no model: the student preset, the cache key, chunked translation with
resuming, the checks. End to end with the toy teacher: tests/system/test_distillation.py."""

from __future__ import annotations

import shutil
from dataclasses import asdict

import pytest
from omegaconf import OmegaConf

from nmt.cache import hash_key
from nmt.config import DecodingConfig, DistillConfig, DistillCorpusConfig, ToyDataConfig, data_or_model_data
from nmt.data import read_lines, text_path
from nmt.errors import NMTError
from nmt.tooling.distill import cache_settings, corpus_name, distill, translate_in_chunks


class FakeTranslator:
    """Upper-cases each line; raises KeyboardInterrupt at call ``fail_at`` (1-based) if given."""

    def __init__(self, fail_at: int | None = None):
        self.calls: list[tuple[int, int]] = []  # (first line, lines) of each call
        self.fail_at = fail_at

    def translate(self, lines, decoding, progress=False, first_line=1):
        self.calls.append((first_line, len(lines)))
        if len(self.calls) == self.fail_at:
            raise KeyboardInterrupt
        return [line.upper() for line in lines]


SOURCES = [f"sentence {i}" for i in range(10)]


def test_chunks_are_written_one_by_one_and_a_resumed_run_translates_only_the_missing(tmp_path):
    folder = tmp_path / "translations"
    interrupted = FakeTranslator(fail_at=3)
    with pytest.raises(KeyboardInterrupt):
        translate_in_chunks(interrupted, SOURCES, DecodingConfig(), folder, "de", 4, progress=False)
    assert sorted(p.name for p in folder.iterdir()) == ["000000000-000000004.de", "000000004-000000008.de"]

    resumed = FakeTranslator()
    lines, now = translate_in_chunks(resumed, SOURCES, DecodingConfig(), folder, "de", 4, progress=False)
    assert lines == [s.upper() for s in SOURCES] and now == 2
    assert resumed.calls == [(9, 2)]  # the last chunk, its first line numbered as in the corpus
    assert read_lines(folder / "000000008-000000010.de") == ["SENTENCE 8", "SENTENCE 9"]

    again = FakeTranslator(fail_at=1)
    assert translate_in_chunks(again, SOURCES, DecodingConfig(), folder, "de", 4, progress=False) == (
        lines,
        0,
    )

    (folder / "000000004-000000008.de").write_text("one line\n")
    with pytest.raises(NMTError, match=r"000000004-000000008.de: 1 lines, expected 4; delete the file"):
        translate_in_chunks(again, SOURCES, DecodingConfig(), folder, "de", 4, progress=False)


def test_the_key_is_of_contents_settings_and_backend(tmp_path):
    (tmp_path / "a.pt").write_bytes(b"weights")
    (tmp_path / "train.en").write_text("a\nb\n")
    shutil.copy(tmp_path / "a.pt", tmp_path / "copy.pt")
    (tmp_path / "ct2").mkdir()
    (tmp_path / "ct2" / "model.bin").write_bytes(b"exported")

    def settings(teacher, decoding=None, **cfg):
        return cache_settings(
            DistillConfig(teacher=teacher, **cfg),
            decoding or DecodingConfig(),
            tmp_path / "train.en",
            "en",
            "de",
        )

    base = settings(str(tmp_path / "a.pt"))
    assert settings(str(tmp_path / "copy.pt")) == base  # the same teacher elsewhere
    assert base["decoding"] == asdict(DecodingConfig()) and base["direction"] == ["en", "de"]
    others = [
        settings([str(tmp_path / "a.pt"), str(tmp_path / "copy.pt")]),  # an ensemble
        settings(str(tmp_path / "a.pt"), DecodingConfig(beam_size=4)),
        settings(str(tmp_path / "a.pt"), backend="ct2", ct2_model=str(tmp_path / "ct2")),
    ]
    assert all(other != base for other in others)
    (tmp_path / "copy.pt").write_bytes(b"retrained")
    assert settings(str(tmp_path / "copy.pt")) != base


def test_a_shortlist_is_keyed_by_its_content_not_its_path(tmp_path):
    """A shortlist built again at the same path is another input: the cache must not answer with the
    translations made over the old one; the same shortlist elsewhere is the same input."""
    (tmp_path / "a.pt").write_bytes(b"weights")
    (tmp_path / "train.en").write_text("a\nb\n")
    shortlist, elsewhere = tmp_path / "shortlist.json", tmp_path / "copy" / "shortlist.json"
    shortlist.write_text('{"candidates": "old"}')
    elsewhere.parent.mkdir()
    shutil.copy(shortlist, elsewhere)

    def key(path):
        decoding = DecodingConfig(shortlist=str(path))
        return hash_key(
            cache_settings(
                DistillConfig(teacher=str(tmp_path / "a.pt")), decoding, tmp_path / "train.en", "en", "de"
            )
        )

    old = key(shortlist)
    assert key(elsewhere) == old
    shortlist.write_text('{"candidates": "rebuilt"}')
    assert key(shortlist) != old


def test_the_corpus_folder_is_named_by_the_content_of_what_is_copied_into_it(tmp_path):
    """Valid, test and (with keep_original) the training references are copied beside the translations:
    edited references get another folder, never the old copies."""
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            text_path(tmp_path, split, lang).write_text(f"{split} {lang}\n")
    plain, kept = corpus_name("k", tmp_path, "en", "de", False), corpus_name("k", tmp_path, "en", "de", True)
    assert kept.endswith("-with-original") and plain != kept.removesuffix("-with-original")
    assert corpus_name("other", tmp_path, "en", "de", False) != plain
    text_path(tmp_path, "train", "de").write_text("edited\n")
    assert corpus_name("k", tmp_path, "en", "de", False) == plain  # not copied without keep_original
    assert corpus_name("k", tmp_path, "en", "de", True) != kept
    (tmp_path / "valid.de").write_text("edited\n")
    assert corpus_name("k", tmp_path, "en", "de", False) != plain


def test_the_student_preset_is_the_main_job_on_the_distilled_folder(compose_cfg):
    main = OmegaConf.to_container(compose_cfg("train", "experiment=multi30k_cpu"), resolve=True)
    student = OmegaConf.to_container(
        compose_cfg("train", "experiment=multi30k_distill_cpu", "data.dir=data/distilled/k/distilled-k"),
        resolve=True,
    )
    assert student["data"].pop("dir") == "data/distilled/k/distilled-k"
    assert student["data"].pop("name") == "distilled-k"
    assert student["data"].pop("source") == "local" and "scripts/distill.py" in student["data"].pop("origin")
    del student["data"]["extra_train"], student["data"]["hub_fallback_pairs"]
    del main["data"]["dir"], main["data"]["name"], main["data"]["source"], main["data"]["url"]
    assert student == main  # the same recipe, languages and cleaning
    # Without data.dir the run fails on a folder named for what is missing, not on Multi30k.
    unset = compose_cfg("train", "experiment=multi30k_distill_cpu")
    assert unset.data.dir == "DISTILLED_CORPUS"


def test_data_must_be_in_the_teachers_direction_and_chunks_positive():
    teacher = ToyDataConfig()
    assert data_or_model_data(None, teacher) is teacher
    mine = ToyDataConfig(train_size=5)
    assert data_or_model_data(mine, teacher) is mine
    with pytest.raises(NMTError, match="the model translates src -> tgt"):
        data_or_model_data(ToyDataConfig(src_lang="tgt", tgt_lang="src"), teacher)
    with pytest.raises(NMTError, match=r"^distill.chunk_sentences=0: must be > 0$"):
        distill(DistillConfig(teacher="none.pt", distill=DistillCorpusConfig(chunk_sentences=0)))
