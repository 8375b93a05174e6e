"""Scoring given translations on the session's toy model: a search's best hypothesis scored again gets the
log-probability the search gave it (PyTorch, CTranslate2, an ensemble), and scripts/score.py writes a
line per pair (TSV or JSON, per subword on request), the corpus means, and one-line errors."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from nmt.analysis.word_alignment import parse_pharaoh
from nmt.config import DecodingOverrides
from nmt.data import read_lines
from nmt.errors import NMTError
from nmt.inference.translator import Translator

pytestmark = pytest.mark.slow
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def text(toy_text) -> Path:
    return toy_text


@pytest.fixture(scope="module")
def exported(toy_ct2) -> Path:
    return toy_ct2


def translator_for(kind: str, toy_run, exported_dir: Path | None) -> Translator:
    last = str(toy_run.checkpoints / "last.pt")
    if kind == "ensemble":
        first_step = sorted(toy_run.checkpoints.glob("step_*.pt"), key=lambda p: int(p.stem[5:]))[0]
        return Translator.from_checkpoint([last, str(first_step)], CPU)
    if kind == "ct2":
        return Translator.from_checkpoint(last, CPU, backend="ct2", ct2_model=str(exported_dir))
    return Translator.from_checkpoint(last, CPU)


@pytest.mark.parametrize("kind", ["torch", "ct2", "ensemble"])
@pytest.mark.parametrize("beam_size", [1, 5])
def test_a_search_hypothesis_scored_again_gets_its_log_probability(kind, beam_size, toy_run, text, request):
    exported_dir = request.getfixturevalue("exported") if kind == "ct2" else None
    translator = translator_for(kind, toy_run, exported_dir)
    decoding = translator.decoding_with(DecodingOverrides(beam_size=beam_size))
    ids = translator.encode(read_lines(text / "test.src")[:60])
    best = [hyps[0] for hyps in translator.search(ids, decoding)]
    scored = translator.score_ids(ids, [h.tokens for h in best], decoding)
    for h, s in zip(best, scored):  # 1e-5, relative below -1: fp32 sums over the tokens
        assert s.log_prob == pytest.approx(h.log_prob, rel=1e-5, abs=1e-5)
        assert s.score == pytest.approx(h.score, rel=1e-5, abs=1e-5)
        assert s.tokens == len(h.tokens) + 1 == len(s.token_log_probs) and s.pieces[-1] == "</s>"
        assert math.fsum(s.token_log_probs) == s.log_prob
    # the same tokens in another order: a translation the model finds far less likely
    changed = [(i, h) for i, h in enumerate(best) if h.tokens[::-1] != h.tokens][:10]
    worse = translator.score_ids([ids[i] for i, _ in changed], [h.tokens[::-1] for _, h in changed], decoding)
    assert len(changed) == 10 and all(w.log_prob < h.log_prob - 1 for w, (_, h) in zip(worse, changed))


def test_scoring_refuses_what_it_cannot_score(toy_run):
    translator = Translator.from_checkpoint(str(toy_run.checkpoints / "last.pt"), CPU)
    decoding = translator.decoding_with(DecodingOverrides())
    with pytest.raises(NMTError, match="2 translations for 1 sources"):
        translator.score(["ka lo"], ["a", "b"], decoding)
    too_long = " ".join(["lo"] * translator.max_source)
    with pytest.raises(NMTError, match=r"^line 2: the translation has \d+ subwords; the model emits at most"):
        translator.score(["ka", "ka"], ["lo", too_long + " lo"], decoding)


# ------------------------------------------------------------------------------------ the script
def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_score_script_writes_a_line_per_pair_and_the_means(toy, toy_run, text, tmp_path):
    translator = Translator.from_checkpoint(str(toy_run.checkpoints / "last.pt"), CPU)
    decoding = translator.decoding_with(DecodingOverrides())
    sources, refs = read_lines(text / "test.src")[:30], read_lines(text / "test.tgt")[:30]
    src, ref = write(tmp_path / "s.src", sources), write(tmp_path / "s.tgt", refs)
    checkpoint = f"checkpoint={toy_run.checkpoints / 'last.pt'}"
    expected = translator.score(sources, refs, decoding)

    proc = toy.script("score.py", checkpoint, f"eval.src={src}", f"eval.ref={ref}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    assert len(rows) == 30 and all(len(row) == 3 for row in rows)
    for row, s in zip(rows, expected):
        assert float(row[0]) == pytest.approx(s.log_prob, abs=1e-5)
        assert float(row[1]) == pytest.approx(s.score, abs=1e-5) and int(row[2]) == s.tokens
    mean = sum(s.log_prob for s in expected) / 30
    assert f"30 sentences, mean log P {mean:.4f}" in proc.stderr

    proc = toy.script(
        "score.py", checkpoint, f"eval.src={src}", f"eval.ref={ref}", "format=json", "per_token=true",
        "alignments=true", f"output={tmp_path / 'scores.jsonl'}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    records = [json.loads(line) for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
    aligned = translator.align(
        translator.encode(sources), translator.encode_targets(refs), None, decoding.max_tokens
    )
    assert len(records) == len(expected) == len(aligned)
    for record, s, a, r in zip(records, expected, aligned, refs):
        assert a.target_words == r.split()
        assert record["pieces"] == s.pieces and record["tokens"] == s.tokens
        assert record["token_log_probs"] == pytest.approx(s.token_log_probs, abs=1e-5)
        assert parse_pharaoh(record["alignment"]) == set(a.links) and len(a.links) == len(a.target_words)

    split = toy.script("score.py", checkpoint, "data.split=test", "per_token=true", cwd=tmp_path)
    assert split.returncode == 0 and len(split.stdout.splitlines()) == 200, split.stderr
    assert re.fullmatch(r"(\S+=-?\d+\.\d{6} )+</s>=-?\d+\.\d{6}", split.stdout.splitlines()[0].split("\t")[3])


@pytest.mark.parametrize(
    ("files", "args", "message"),
    [
        ({"a.src": b"ka lo\nmi\n", "a.tgt": b"x\n"}, (), "error: line counts differ:"),
        ({"a.src": b"ka lo\nmi\n", "a.tgt": b"x\ny\xff\n"}, (), "a.tgt:2: invalid UTF-8"),
        (
            {"a.src": b"ka\n", "a.tgt": b"x\n"},
            ("format=xml",),
            "error: format=xml: must be one of tsv, json",
        ),
    ],
)
def test_score_script_errors_are_one_line(toy, toy_run, tmp_path, files, args, message):
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    proc = toy.script(
        "score.py",
        f"checkpoint={toy_run.checkpoints / 'last.pt'}",
        f"eval.src={tmp_path / 'a.src'}",
        f"eval.ref={tmp_path / 'a.tgt'}",
        *args,
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr
