"""Word alignments from the session's toy model, whose correct alignment is known from the construction
of the toy task (nmt.data.sources.make_toy: word i of a pair is word i + 1 of the other and the other way
round, a last odd word stays): the chosen reading agrees on >= 90 % of the links; translate.py prints
them after each translation, evaluate.py writes them beside the hypotheses, compare_alignments.py
scores every reading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from nmt.analysis.word_alignment import Link, alignment_scores, parse_pharaoh, pharaoh
from nmt.config import DecodingOverrides
from nmt.data import read_lines
from nmt.inference.translator import Translator

pytestmark = pytest.mark.slow


def toy_alignment(words: int) -> set[Link]:
    """The toy task's alignment of a pair of ``words`` words: adjacent pairs swapped."""
    return {(j ^ 1 if j ^ 1 < words else j, j) for j in range(words)}


@pytest.fixture(scope="module")
def translator(toy_run) -> Translator:
    return Translator.from_checkpoint(str(toy_run.checkpoints / "last.pt"), torch.device("cpu"))


@pytest.fixture(scope="module")
def text(toy_text) -> Path:
    return toy_text


def test_the_chosen_layer_finds_the_toy_alignment(translator, text):
    sources, refs = read_lines(text / "test.src"), read_lines(text / "test.tgt")
    aligned = translator.align(translator.encode(sources), translator.encode_targets(refs), None, 4000)
    assert [a.source_words for a in aligned] == [s.split() for s in sources]
    assert [a.target_words for a in aligned] == [r.split() for r in refs]
    scores = alignment_scores(
        [set(a.links) for a in aligned], [toy_alignment(len(s.split())) for s in sources]
    )
    assert scores.f1 >= 0.9, scores


def test_translate_script_prints_each_translation_with_its_alignment(
    toy, toy_run, translator, text, tmp_path
):
    sources = [*read_lines(text / "test.src")[:8], ""]
    stdin = "".join(s + "\n" for s in sources)
    proc = toy.script(
        "translate.py",
        f"checkpoint={toy_run.checkpoints / 'last.pt'}",
        "alignments=true",
        cwd=tmp_path,
        stdin=stdin,
    )
    assert proc.returncode == 0, proc.stderr
    decoding = translator.decoding_with(DecodingOverrides())
    hyps = translator.translations(sources, decoding).nbest
    expected = translator.align(
        translator.encode(sources), [h[0].tokens if h else [] for h in hyps], None, decoding.max_tokens
    )
    lines = proc.stdout.split("\n")[:-1]
    assert len(lines) == 9 and lines[-1] == "\t"  # the empty line: no translation, no links
    for line, text_out, alignment, source in zip(lines, translator.best(hyps), expected, sources):
        translation, links = line.split("\t")
        assert translation == text_out and links == pharaoh(alignment.links)
        assert re.fullmatch(r"(\d+-\d+( \d+-\d+)*)?", links)
        assert {j for _, j in parse_pharaoh(links)} == set(range(len(translation.split())))
        assert all(i < len(source.split()) for i, _ in parse_pharaoh(links))


def test_evaluate_script_writes_the_alignments_beside_the_hypotheses(toy, toy_run, text, tmp_path):
    out = tmp_path / "test.hyp"
    checkpoint = f"checkpoint={toy_run.checkpoints / 'last.pt'}"
    proc = toy.script("evaluate.py", checkpoint, "alignments=true", f"eval.out={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    hyps, sources = out.read_text(encoding="utf-8").splitlines(), read_lines(text / "test.src")
    links = [parse_pharaoh(line) for line in out.with_suffix(".align").read_text().splitlines()]
    assert len(links) == len(hyps) == 200
    right = [toy_alignment(len(s.split())) for s, h in zip(sources, hyps) if len(h.split()) == len(s.split())]
    found = [a for a, s, h in zip(links, sources, hyps) if len(h.split()) == len(s.split())]
    assert len(right) > 150 and alignment_scores(found, right).f1 >= 0.9


def test_alignments_need_the_attention_of_the_torch_backend(toy, toy_run, tmp_path):
    proc = toy.script(
        "translate.py",
        f"checkpoint={toy_run.checkpoints / 'last.pt'}",
        "alignments=true",
        "backend=ct2",
        f"ct2_model={tmp_path}",
        cwd=tmp_path,
        stdin="ka\n",
    )
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("script", ["evaluate.py", "translate.py", "score.py"])
def test_an_alignment_layer_out_of_range_is_refused_before_decoding(toy, toy_run, tmp_path, script):
    """Refused before the text is even read: the text named here does not exist."""
    args = [f"checkpoint={toy_run.checkpoints / 'last.pt'}", "alignments=true", "alignment_layer=7"]
    missing = tmp_path / "missing"
    text = [f"eval.src={missing}", f"eval.ref={missing}"]
    text = [f"input={missing}"] if script == "translate.py" else text
    proc = toy.script(script, *args, *text, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: alignment_layer=7 out of range: the model")
    assert not proc.stdout


def test_compare_alignments_script_scores_every_reading(toy, toy_run, text, tmp_path):
    sources = read_lines(text / "test.src")
    (tmp_path / "gold.align").write_text(
        "".join(pharaoh(sorted(toy_alignment(len(s.split())))) + "\n" for s in sources), encoding="utf-8"
    )
    args = [f"checkpoint={toy_run.checkpoints / 'last.pt'}", "data.split=test"]
    proc = toy.script("compare_alignments.py", *args, f"reference={tmp_path / 'gold.align'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[2:]]
    layers = toy_run.cfg.model.decoder_layers
    assert len(rows) == layers * 2 * 3  # layers x (predicts, reads) x (mean, sum, piece)
    best = max(rows, key=lambda r: float(r[5]))
    assert "<-" in best and float(best[5]) >= 0.9 and best[1] == "predicts"

    (tmp_path / "bad.align").write_text("0-0\n" * 3, encoding="utf-8")
    proc = toy.script("compare_alignments.py", *args, f"reference={tmp_path / 'bad.align'}", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.startswith(
        f"error: {tmp_path / 'bad.align'} has 3 lines for 200"
    )
