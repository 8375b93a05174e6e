"""Evaluation, translation and averaging scripts on the session's trained toy model."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.checkpoint import atomic_save, load_checkpoint
from nmt.config import DecodingOverrides, EvalDataConfig, EvalFilesConfig, EvaluateConfig
from nmt.data import prepare_text
from nmt.errors import NMTError
from nmt.evaluation.evaluate import evaluate_checkpoint, report_dir
from nmt.inference.translator import Translator
from nmt.metrics import corpus_scores
from nmt.training.loop import train

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def text(toy_run) -> Path:
    """The folder of the toy corpus' raw text: {train,valid,test}.{src,tgt}."""
    return prepare_text(toy_run.cfg.data, progress=False)


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def sacrebleu_cli(ref: Path, hyp: Path, *options: str) -> str:
    """What ``sacrebleu REF -i HYP -m bleu chrf OPTIONS`` prints."""
    command = [sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp), "-m", "bleu", "chrf", *options]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def sacrebleu_json(ref: Path, hyp: Path) -> dict[str, dict]:
    """The CLI's scores to 4 decimals, by metric name."""
    return {s["name"]: s for s in json.loads(sacrebleu_cli(ref, hyp, "-w", "4", "-f", "json"))}


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
    assert report["corpus"] == "the toy task (seed 1234, swap_pairs=True)"  # the data the split came from
    assert report["checkpoint"] == str(checkpoint.resolve()) and report["step"] == 1000
    assert report["decoding"]["beam_size"] == toy_run.cfg.decoding.beam_size == 5
    assert {"alpha", "max_len_a", "max_len_b", "no_unk"} <= report["decoding"].keys()
    bleu, chrf = report["scores"]["bleu"], report["scores"]["chrf"]
    assert bleu["score"] > 90

    cli = sacrebleu_json(text / "test.tgt", hyp_path)
    assert bleu["score"] == cli["BLEU"]["score"] and bleu["signature"] == cli["BLEU"]["signature"]
    assert chrf["score"] == cli["chrF2"]["score"] and chrf["signature"] == cli["chrF2"]["signature"]
    # the line the CLI prints at 2 decimals, "BLEU|nrefs:1|...|version:2.6.0 = 96.10 99.7/97.0/...", from the
    # score on (the 4-decimal score above, 96.095, rounded again would say 96.09)
    cli_bleu_line = sacrebleu_cli(text / "test.tgt", hyp_path, "-w", "2", "-f", "text").splitlines()[0]
    assert "BLEU = " + cli_bleu_line.split(" = ", 1)[1] in proc.stdout


def on_files(toy_run, stem: Path, sources: list[str], refs: list[str]) -> EvaluateConfig:
    """An evaluation of the toy model on these lines, written to ``stem.src`` and ``stem.ref``."""
    for suffix, text in ((".src", sources), (".ref", refs)):
        stem.with_suffix(suffix).write_text("\n".join(text) + "\n", encoding="utf-8")
    files = EvalFilesConfig(src=str(stem.with_suffix(".src")), ref=str(stem.with_suffix(".ref")))
    return EvaluateConfig(checkpoint=str(toy_run.checkpoints / "last.pt"), eval=files, device="cpu")


def test_evaluate_on_local_files(toy_run, text, tmp_path):
    sources, refs = lines(text / "test.src")[:30], lines(text / "test.tgt")[:30]
    cfg = on_files(toy_run, tmp_path / "mini", sources, refs)
    report = evaluate_checkpoint(cfg, tmp_path / "eval")
    hyps = lines(Path(report.hypotheses))
    assert Path(report.hypotheses).parent == tmp_path / "eval"
    assert report.test_set == "mini" and report.sentences == len(hyps) == 30 and report.corpus is None
    assert report.scores["bleu"].score == corpus_scores(hyps, refs)["bleu"].score > 80
    assert json.loads(Path(report.report).read_text())["scores"] == report.as_dict()["scores"]

    (tmp_path / "short.ref").write_text("\n".join(refs[:-1]) + "\n", encoding="utf-8")
    cfg.eval.ref = str(tmp_path / "short.ref")
    with pytest.raises(NMTError, match="line counts differ"):
        evaluate_checkpoint(cfg, tmp_path / "eval")


def test_evaluate_keeps_empty_lines_and_warns_on_truncation(toy_run, text, tmp_path, caplog):
    """Evaluation goes through the Translator: an empty source gets an empty hypothesis (the line is
    scored, as by the sacrebleu CLI), and an over-long source is truncated with a warning."""
    sources, refs = lines(text / "test.src")[:6], lines(text / "test.tgt")[:6]
    sources[2], refs[2] = "", ""
    sources[4] = " ".join([sources[4]] * 40)  # far beyond the toy model's 64 positions
    cfg = on_files(toy_run, tmp_path / "e", sources, refs)
    report = evaluate_checkpoint(cfg, tmp_path / "eval")
    hyps = Path(report.hypotheses).read_text(encoding="utf-8").split("\n")
    assert report.sentences == 6 and len(hyps) == 7 and hyps[-1] == ""
    assert hyps[2] == "" and all(hyps[i] for i in (0, 1, 3, 4, 5))
    assert any("line 5:" in r.getMessage() and "truncated" in r.getMessage() for r in caplog.records)


def test_evaluating_from_another_working_directory_reads_the_runs_data(toy, toy_run, tmp_path, monkeypatch):
    """A run made with a relative data.cache_dir (the default ``data``) and evaluated from elsewhere (the
    home folder) reads the corpus the run used: nothing is prepared or written where it is evaluated."""
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    (project / "data").symlink_to(toy.data_cache)  # the corpus the session's toy run prepared
    monkeypatch.chdir(project)
    overrides = [*toy.short, "trainer.max_steps=2", "trainer.valid_every=2", "trainer.keep_checkpoints=0"]
    cfg = toy.compose_train(
        *[o for o in toy.overrides(*overrides) if "cache_dir" not in o], "data.cache_dir=data"
    )
    train(cfg, Path("outputs/run"))
    cache = sorted(p.relative_to(toy.data_cache) for p in toy.data_cache.rglob("*"))

    monkeypatch.chdir(home)
    checkpoint = project / "outputs" / "run" / "checkpoints" / "last.pt"
    decoding = DecodingOverrides(beam_size=1)
    split = EvalDataConfig(split="valid")
    cfg = EvaluateConfig(checkpoint=str(checkpoint), data=split, decoding=decoding, device="cpu")
    report = evaluate_checkpoint(cfg, report_dir(checkpoint))
    assert report.sentences == toy_run.cfg.data.valid_size
    assert list(home.iterdir()) == []
    assert sorted(p.relative_to(toy.data_cache) for p in toy.data_cache.rglob("*")) == cache
    assert Path(report.report).parent == project / "outputs" / "run" / "eval"


def test_evaluate_refuses_unknown_metrics_before_decoding(toy_run, monkeypatch):
    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded before checking eval.metrics")

    monkeypatch.setattr(Translator, "translations", no_decoding)
    cfg = EvaluateConfig(
        checkpoint=str(toy_run.checkpoints / "last.pt"), eval=EvalFilesConfig(metrics=["bleu", "BLEU"])
    )
    refused = r"^eval\.metrics=\['bleu', 'BLEU'\]: must each be one of bleu, chrf, ter; did you mean bleu\?$"
    with pytest.raises(NMTError, match=refused):
        evaluate_checkpoint(cfg, Path("unused"))


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
        assert "step_960.pt, step_1000.pt" in proc.stdout and output.is_file()

        averaged = load_checkpoint(output)
        first, last = (load_checkpoint(toy_run.checkpoints / f"step_{s}.pt")["model"] for s in (960, 1000))
        for name, value in averaged["model"].items():
            torch.testing.assert_close(value, (first[name] + last[name]) / 2, rtol=0, atol=1e-6)

        cfg = EvaluateConfig(checkpoint=str(output), device="cpu")
        cfg.data.split = "valid"
        report = evaluate_checkpoint(cfg, tmp_path)
        assert report.sentences == 200 and report.scores["bleu"].score > 85
    finally:
        output.unlink(missing_ok=True)  # leave the shared run as the other tests expect it


# ---------------------------------------------------------------------------- the final model


@pytest.mark.parametrize("alphas_from", ["command line", "training config"])
def test_final_model_is_chosen_on_valid_and_beats_or_equals_best(alphas_from, toy, toy_run, tmp_path):
    """The length penalties come from select_final's ``alphas`` or else the run's ``final.alphas``."""
    run = tmp_path / "run"
    shutil.copytree(toy_run.checkpoints, run / "checkpoints")
    proc = toy.script("average_checkpoints.py", f"run_dir={run}", "last=5", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    if alphas_from == "command line":
        args = ["alphas=[0.6,1.0]"]
    else:  # as if trained with final.alphas=[0.6,1.0]
        args = []
        for name in ("best.pt", "averaged.pt"):
            ckpt = load_checkpoint(run / "checkpoints" / name)
            ckpt["config"]["final"] = {"alphas": [0.6, 1.0]}
            atomic_save(ckpt, run / "checkpoints" / name)
    proc = toy.script("select_final.py", f"run_dir={run}", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "final model:" in proc.stdout and "(valid)" in proc.stdout

    report = json.loads((run / "eval" / "final_choice.json").read_text())
    candidates = report["candidates"]
    assert [(Path(c["checkpoint"]).name, c["alpha"]) for c in candidates] == [
        ("best.pt", 0.6),
        ("best.pt", 1.0),
        ("averaged.pt", 0.6),
        ("averaged.pt", 1.0),
    ]
    assert report["chosen"]["bleu"] == max(c["bleu"] for c in candidates)
    assert report["chosen"]["bleu"] >= max(
        c["bleu"] for c in candidates if c["checkpoint"].endswith("best.pt")
    )
    final = load_checkpoint(run / "checkpoints" / "final.pt")
    assert final["config"]["decoding"]["alpha"] == report["chosen"]["alpha"]


def test_select_final_refuses_to_choose_on_the_test_set(toy, toy_run, tmp_path):
    proc = toy.script("select_final.py", f"run_dir={toy_run.run_dir}", "split=test", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: split=test: the final model and its length penalty are chosen on the validation set; "
        "the test set is scored once, afterwards (scripts/evaluate.py)"
    ]
    assert not (toy_run.checkpoints / "final.pt").exists()


# ------------------------------------------------------------------------------ invalid input


def test_translate_refuses_invalid_utf8_naming_the_line(toy, toy_run, tmp_path):
    checkpoint = f"checkpoint={toy_run.checkpoints / 'last.pt'}"
    source = tmp_path / "in.txt"
    source.write_bytes(b"ka lo\n\xff\xfe broken\n")
    proc = toy.script("translate.py", checkpoint, f"input={source}", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith(
        f"error: {source}:2: invalid UTF-8"
    )
    piped = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "translate.py"), checkpoint],
        input=source.read_bytes(),
        capture_output=True,
        cwd=tmp_path,
        env=toy.env(),
        timeout=300,
    )
    assert piped.returncode == 1
    assert piped.stderr.decode().strip().splitlines()[-1].startswith("error: stdin:2: invalid UTF-8")
    assert b"Traceback" not in piped.stderr


def test_evaluate_refuses_invalid_utf8_references_naming_the_line(toy, toy_run, text, tmp_path):
    refs = tmp_path / "refs.tgt"
    refs.write_bytes(b"fine\n\xc3\n")
    srcs = tmp_path / "srcs.src"
    srcs.write_text("a\nb\n")
    proc = toy.script(
        "evaluate.py",
        f"checkpoint={toy_run.checkpoints / 'last.pt'}",
        f"eval.src={srcs}",
        f"eval.ref={refs}",
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and f"error: {refs}:2: invalid UTF-8" in proc.stderr
    assert "Traceback" not in proc.stderr
