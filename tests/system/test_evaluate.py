"""Evaluation, translation and averaging scripts on the session's trained toy model."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest
import torch

from nmt.config import EvalFilesConfig, EvaluateConfig
from nmt.data import prepare_text
from nmt.errors import NMTError
from nmt.evaluation import corpus_scores, evaluate_checkpoint
from nmt.training.checkpoint import load_checkpoint
from nmt.translator import Translator

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def text(toy_run) -> Path:
    """The folder of the toy corpus' raw text: {train,valid,test}.{src,tgt}."""
    return prepare_text(toy_run.cfg.data, progress=False)


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def sacrebleu_cli(ref: Path, hyp: Path) -> dict[str, dict]:
    proc = subprocess.run(
        ["sacrebleu", str(ref), "-i", str(hyp), "-m", "bleu", "chrf", "-w", "4", "-f", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {s["name"]: s for s in json.loads(proc.stdout)}


# ---------------------------------------------------------------------------------------- evaluate


def test_evaluate_script_scores_like_the_sacrebleu_cli(toy, toy_run, text, tmp_path):
    checkpoint = toy_run.checkpoints / "last.pt"
    hyp_path = tmp_path / "test.hyp"
    proc = toy.script(
        "evaluate.py", f"checkpoint={checkpoint}", "data.split=test", f"eval.out={hyp_path}", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "BLEU = " in proc.stdout and "chrF2 = " in proc.stdout and "signature: nrefs:1" in proc.stdout

    report = json.loads(hyp_path.with_suffix(".json").read_text())
    assert report["test_set"] == "test" and report["sentences"] == 200 == len(lines(hyp_path))
    assert report["checkpoint"] == str(checkpoint.resolve()) and report["step"] == 1000
    assert report["decoding"]["beam_size"] == toy_run.cfg.decoding.beam_size == 5
    assert {"alpha", "max_len_a", "max_len_b", "no_unk"} <= report["decoding"].keys()
    bleu, chrf = report["scores"]["bleu"], report["scores"]["chrf"]
    assert bleu["score"] > 90

    cli = sacrebleu_cli(text / "test.tgt", hyp_path)
    assert bleu["score"] == cli["BLEU"]["score"] and bleu["signature"] == cli["BLEU"]["signature"]
    assert chrf["score"] == cli["chrF2"]["score"] and chrf["signature"] == cli["chrF2"]["signature"]
    assert f"BLEU = {cli['BLEU']['score']:.2f}" in proc.stdout


def test_evaluate_on_local_files(toy_run, text, tmp_path):
    sources, refs = lines(text / "test.src")[:30], lines(text / "test.tgt")[:30]
    (tmp_path / "mini.src").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "mini.ref").write_text("\n".join(refs) + "\n", encoding="utf-8")
    cfg = EvaluateConfig(
        checkpoint=str(toy_run.checkpoints / "last.pt"),
        eval=EvalFilesConfig(src=str(tmp_path / "mini.src"), ref=str(tmp_path / "mini.ref")),
        device="cpu",
    )
    report = evaluate_checkpoint(cfg, tmp_path / "eval")
    hyps = lines(Path(report["hypotheses"]))
    assert Path(report["hypotheses"]).parent == tmp_path / "eval"
    assert report["test_set"] == "mini" and report["sentences"] == len(hyps) == 30
    assert report["scores"]["bleu"]["score"] == corpus_scores(hyps, refs)["bleu"].score > 80
    assert json.loads(Path(report["report"]).read_text())["scores"] == report["scores"]

    (tmp_path / "short.ref").write_text("\n".join(refs[:-1]) + "\n", encoding="utf-8")
    cfg.eval.ref = str(tmp_path / "short.ref")
    with pytest.raises(NMTError, match="line counts differ"):
        evaluate_checkpoint(cfg, tmp_path / "eval")


# --------------------------------------------------------------------------------------- translate


@pytest.fixture(scope="module")
def translate_run(toy, toy_run, text, tmp_path_factory):
    """translate.py on ordinary lines, empty lines and a 10,000-character line."""
    sources = lines(text / "test.src")[:12]
    words = " ".join(sources).split()
    rng = random.Random(0)
    long_line = ""
    while len(long_line) < 10_000:
        long_line += rng.choice(words) + " "
    long_line = long_line[:10_000].strip()
    inputs = [sources[0], "", sources[1], "", "", long_line, *sources[2:], ""]
    proc = toy.script(
        "translate.py",
        f"checkpoint={toy_run.checkpoints / 'last.pt'}",
        "batch_sentences=4",  # the long line is in the second batch: warnings must count input lines
        cwd=tmp_path_factory.mktemp("translate"),
        stdin="".join(line + "\n" for line in inputs),
    )
    return inputs, proc


def test_translate_preserves_lines_and_writes_only_translations(toy_run, translate_run):
    inputs, proc = translate_run
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.split("\n")
    assert out[-1] == "" and len(out[:-1]) == len(inputs)  # one line out per line in
    translator = Translator.from_checkpoint(str(toy_run.checkpoints / "last.pt"), torch.device("cpu"))
    assert out[:-1] == translator.translate(inputs, translator.cfg.decoding)  # nothing else on stdout
    for source, translation in zip(inputs, out):
        assert (translation == "") == (source == "")


def test_translate_truncates_a_very_long_line_with_a_warning(translate_run):
    inputs, proc = translate_run
    index = inputs.index(max(inputs, key=len))
    assert len(inputs[index]) == 10_000
    translation = proc.stdout.split("\n")[index]
    assert 0 < len(translation.split()) <= 63
    assert index >= 4 and f"line {index + 1}: " in proc.stderr and "truncated" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_translate_empty_input(toy, toy_run, tmp_path):
    proc = toy.script("translate.py", f"checkpoint={toy_run.checkpoints / 'last.pt'}", cwd=tmp_path, stdin="")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""


# ----------------------------------------------------------------------------------------- average


def test_average_checkpoints_script_writes_a_checkpoint_that_evaluates(toy, toy_run, text, tmp_path):
    output = toy_run.checkpoints / "averaged.pt"
    try:
        proc = toy.script("average_checkpoints.py", f"run_dir={toy_run.run_dir}", "last=2", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "step_500.pt, step_1000.pt" in proc.stdout and output.is_file()

        averaged = load_checkpoint(output)
        first, last = (load_checkpoint(toy_run.checkpoints / f"step_{s}.pt")["model"] for s in (500, 1000))
        for name, value in averaged["model"].items():
            torch.testing.assert_close(value, (first[name] + last[name]) / 2, rtol=0, atol=1e-6)

        cfg = EvaluateConfig(checkpoint=str(output), device="cpu")
        cfg.data.split = "valid"
        report = evaluate_checkpoint(cfg, tmp_path)
        assert report["sentences"] == 200 and report["scores"]["bleu"]["score"] > 85
    finally:
        output.unlink(missing_ok=True)  # leave the shared run as the other tests expect it
