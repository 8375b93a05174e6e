"""Every script writes only where its run's outputs live or where the user said, never where it is run."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_evaluation import EN, save_model, tiny_config

from nmt.config import register_configs
from nmt.data import prepare_corpus

REPO = Path(__file__).resolve().parents[1]
# Scripts whose Hydra run dir is their own output folder (under outputs/, or the run they work on).
OWN_RUN_DIR = {
    "train",
    "pipeline",
    "prepare_data",
    "select_final",
    *(f"benchmark{kind}" for kind in ("", "_ct2", "_decoders", "_server")),
}


def script_configs() -> dict[str, str]:
    """Each script's config name, as its ``@hydra.main`` says."""
    found = {}
    for script in sorted((REPO / "scripts").glob("*.py")):
        match = re.search(r'config_name="(\w+)"', script.read_text())
        if match:
            found[script.stem] = match.group(1)
    return found


@pytest.mark.parametrize(("script", "config"), sorted(script_configs().items()))
def test_no_script_leaves_a_hydra_folder_or_a_log_where_it_is_run(script, config):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        hydra = OmegaConf.to_container(compose(config, return_hydra_config=True).hydra, resolve=False)
    run_dir = hydra["run"]["dir"]
    if script in OWN_RUN_DIR:
        assert run_dir.startswith(("outputs/", "${run_dir}")), run_dir
        return
    files = [h for h in hydra["job_logging"].get("handlers", {}).values() if "filename" in h]
    assert (run_dir, hydra["output_subdir"], files) == (".", None, [])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, compose_train_cfg) -> Path:
    tmp_path = tmp_path_factory.mktemp("scripts")
    cfg = tiny_config(tmp_path, compose_train_cfg)
    data = prepare_corpus(cfg.data, cfg.tokenizer, progress=False)
    return save_model(cfg, data, tmp_path / "run" / "checkpoints" / "model.pt", seed=0)


def run_script(script: str, *args: str, cwd: Path, stdin: str = "") -> subprocess.CompletedProcess:
    device = [] if script in ("build_shortlist.py", "average_checkpoints.py") else ["device=cpu"]
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), *args, *device],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("script", ["evaluate.py", "plot_attention.py", "translate.py", "score.py"])
def test_a_script_run_elsewhere_leaves_nothing_where_it_is_run(checkpoint, tmp_path, script):
    (tmp_path / "text.en").write_text(EN[0] + "\n", encoding="utf-8")
    (tmp_path / "text.de").write_text("ein mann\n", encoding="utf-8")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    args = {
        "evaluate.py": [],
        "plot_attention.py": [f"text={EN[0]}"],
        "translate.py": [f"input={tmp_path / 'text.en'}"],
        "score.py": [f"eval.src={tmp_path / 'text.en'}", f"eval.ref={tmp_path / 'text.de'}"],
    }[script]
    before = set((checkpoint.parents[1]).rglob("*"))
    proc = run_script(script, f"checkpoint={checkpoint}", *args, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert list(cwd.iterdir()) == []
    made = {
        p.relative_to(checkpoint.parents[1]).as_posix()
        for p in set(checkpoint.parents[1].rglob("*")) - before
    }
    if script == "plot_attention.py":  # beside the checkpoint's run's evaluations, named after its settings
        assert any(re.fullmatch(r"eval/model\.attention-[0-9a-f]{8}\.png", name) for name in made), made
        assert f"attention map: {checkpoint.parents[1] / 'eval'}" in proc.stdout


def test_an_output_that_is_an_input_is_refused_before_it_is_emptied(checkpoint, tmp_path):
    """``output=`` naming the input (also through a link), the prefix file, the checkpoint or, for
    score.py, the text it scores: one line, status 1, and the file as it was."""
    doc, prefixes = tmp_path / "doc.en", tmp_path / "prefixes.de"
    doc.write_text(EN[0] + "\n", encoding="utf-8")
    prefixes.write_text("ein\n", encoding="utf-8")
    (tmp_path / "link.en").symlink_to(doc)
    cases = [
        ("translate.py", [f"input={doc}", f"output={doc}"], f"is input={doc}"),
        ("translate.py", [f"input={doc}", f"output={tmp_path / 'link.en'}"], f"is input={doc}"),
        (
            "translate.py",
            [f"input={doc}", f"prefix_file={prefixes}", f"output={prefixes}"],
            "is prefix_file=",
        ),
        ("translate.py", [f"output={checkpoint}"], f"is checkpoint={checkpoint}"),
        ("score.py", [f"eval.src={doc}", f"eval.ref={prefixes}", f"output={prefixes}"], "is eval.ref="),
    ]
    for script, args, message in cases:
        proc = run_script(script, f"checkpoint={checkpoint}", *args, cwd=tmp_path, stdin=EN[0] + "\n")
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    with open(doc) as stdin:  # translate.py output=doc.en < doc.en
        script = [
            sys.executable,
            str(REPO / "scripts" / "translate.py"),
            f"checkpoint={checkpoint}",
            f"output={doc}",
        ]
        proc = subprocess.run(script, stdin=stdin, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 1 and f"output={doc} is stdin" in proc.stderr, proc.stderr
    assert doc.read_text(encoding="utf-8") == EN[0] + "\n" and prefixes.read_text(encoding="utf-8") == "ein\n"
    assert checkpoint.stat().st_size > 1000


def test_no_script_writes_its_result_over_one_of_its_inputs(checkpoint, tmp_path):
    """build_shortlist.py, average_checkpoints.py, select_final.py and evaluate.py refuse an output that
    is a file they read (by any name: relative, from another directory, through a link) or a checkpoint
    training resumes from, in one line before any work, and leave it as it was."""
    src, ref = tmp_path / "text.en", tmp_path / "text.de"
    src.write_text(EN[0] + "\n", encoding="utf-8")
    ref.write_text("ein mann\n", encoding="utf-8")
    (tmp_path / "link.pt").symlink_to(checkpoint)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("best.pt", "last.pt", "step_10.pt"):
        shutil.copy(checkpoint, run / "checkpoints" / name)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    pair = [f"eval.src={src}", "eval.ref=../text.de"]
    cases = [
        ("build_shortlist.py", [f"checkpoint={checkpoint}", "output=../link.pt"], "is checkpoint="),
        (
            "average_checkpoints.py",
            [f"inputs=[{checkpoint},{run}/checkpoints/best.pt]", f"output={tmp_path}/link.pt"],
            "is inputs=",
        ),
        (
            "average_checkpoints.py",
            [f"run_dir={run}", "last=1", f"output={run}/checkpoints/last.pt"],
            "last.pt",
        ),
        ("select_final.py", [f"run_dir={run}", "output=best.pt"], "is candidates="),
        ("select_final.py", [f"run_dir={run}", "output=step_10.pt"], "is a checkpoint of the training run"),
        ("evaluate.py", [f"checkpoint={checkpoint}", *pair, f"eval.out={ref}"], "is eval.ref=../text.de"),
        ("evaluate.py", [f"checkpoint={checkpoint}", *pair, "eval.out=../link.pt"], "is checkpoint="),
    ]
    before = {p: p.read_bytes() for p in (src, ref, checkpoint, *sorted((run / "checkpoints").iterdir()))}
    for script, args, message in cases:
        proc = run_script(script, *args, cwd=cwd)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and message in proc.stderr, (
            script,
            proc.stderr,
        )
    assert {p: p.read_bytes() for p in before} == before


def test_an_output_that_cannot_be_written_is_refused_before_the_work(checkpoint, tmp_path):
    """A directory, or a file in a folder that is not there: one line at start, not a traceback after
    translating or scoring everything."""
    src, ref = tmp_path / "text.en", tmp_path / "text.de"
    src.write_text(EN[0] + "\n", encoding="utf-8")
    ref.write_text("ein mann\n", encoding="utf-8")
    pair = [f"eval.src={src}", f"eval.ref={ref}"]
    cases = [
        ("translate.py", [f"input={src}", f"output={tmp_path}/missing/out.de"], "does not exist"),
        ("translate.py", [f"input={src}", f"output={tmp_path}"], "is a directory"),
        ("score.py", [*pair, f"output={tmp_path}/missing/out.tsv"], "does not exist"),
        ("evaluate.py", [*pair, f"eval.out={tmp_path}"], "is a directory"),
    ]
    for script, args, message in cases:
        proc = run_script(script, f"checkpoint={checkpoint}", *args, cwd=tmp_path)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and message in proc.stderr, (
            script,
            proc.stderr,
        )


@pytest.mark.parametrize("help_flag", [False, True])
def test_a_reader_that_stops_reading_ends_the_script_quietly(checkpoint, tmp_path, help_flag):
    """``translate.py ... | head -1`` and ``--help | head``: the reader goes, the script ends as a Unix
    tool does (status 141, as SIGPIPE's), without a traceback."""
    doc = tmp_path / "doc.en"
    doc.write_text((EN[0] + "\n") * 50, encoding="utf-8")
    args = ["--help"] if help_flag else [f"checkpoint={checkpoint}", f"input={doc}", "device=cpu"]
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "translate.py"), *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # the reader has gone before the first line
    stderr = proc.stderr.read()
    assert proc.wait(timeout=300) == 141 and stderr == "", stderr
