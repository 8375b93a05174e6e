"""Fine-tuning on the toy task (``trainer.init_from``): the session's model of task A (pairs swapped)
fine-tuned on task B (``data.swap_pairs=false``, the same lexicon word for word) learns B in updates
that do not teach it from scratch; the parent's tokenizer encodes B; conflicts are refused before any
data is prepared; a resumed fine-tune equals an uninterrupted one; the scripts after training take it."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_training import assert_continues_exactly

from nmt.checkpoint import atomic_save, load_checkpoint, model_from_checkpoint, weights_digest
from nmt.errors import NMTError
from nmt.text.tokenizer import Tokenizer
from nmt.tooling.average import average_checkpoints
from nmt.training.init_from import resumed_fine_tune
from nmt.training.loop import train

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

TASK_B = ("data.swap_pairs=false",)
# Updates of the fine-tune and of the from-scratch run it is compared with, validated on 100 sentences.
UPDATES = ("trainer.max_steps=100", "trainer.valid_every=100", "trainer.valid_bleu_sentences=100")
# The resumed fine-tune: STEPS in one go, or STEPS / 2 and a resume, validated every STEPS / 2.
STEPS = 20


@pytest.fixture(scope="module")
def parent(toy_run) -> Path:
    return toy_run.checkpoints / "last.pt"


def files_of(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_a_fine_tune_learns_a_related_task_that_scratch_does_not_in_as_many_updates(
    toy, toy_run, parent, tmp_path, caplog
):
    before = files_of(toy_run.run_dir)
    with caplog.at_level(logging.INFO):
        fine = toy.train(
            tmp_path / "fine", *TASK_B, *UPDATES, "model.dropout=0.1", f"trainer.init_from={parent}"
        )
    scratch = toy.train(tmp_path / "scratch", *TASK_B, *UPDATES, "model.dropout=0.1")
    assert fine.final["step"] == scratch.final["step"] == 100
    assert fine.final["bleu"] > 60, fine.final
    assert scratch.final["bleu"] < 30, scratch.final
    assert files_of(toy_run.run_dir) == before  # the parent's run dir is only read

    ckpt = load_checkpoint(fine.checkpoints / "last.pt")
    parent_ckpt = load_checkpoint(parent)
    parent_model, parent_tok, _ = model_from_checkpoint(parent_ckpt)
    tokenizer = Tokenizer.from_state_dict(ckpt["tokenizer"])
    assert tokenizer.fingerprint == parent_tok.fingerprint
    assert ckpt["parent"] == {
        "path": str(parent.resolve()),
        "step": 1000,
        "digest": weights_digest(parent_model),
    }
    # a fresh run: its own step count, history and best score
    assert [h["step"] for h in ckpt["progress"]["history"]] == [100]
    assert ckpt["config"]["model"]["dropout"] == 0.1 != parent_ckpt["config"]["model"]["dropout"]
    assert f"fine-tuning {parent.resolve()} (step 1000 of its run" in caplog.text
    events = b"".join(p.read_bytes() for p in (fine.run_dir / "tb").glob("events.*"))  # hparams
    assert b"trainer.init_from" in events and ckpt["parent"]["digest"].encode() in events


def test_preparing_a_fine_tunes_corpus_uses_the_parents_tokenizer(toy, parent, tmp_path):
    """``scripts/prepare_data.py`` (run.sh's first step) with ``trainer.init_from`` trains no
    SentencePiece model: task B's ids are cached under the parent's fingerprint, for every fine-tune."""
    cache = tmp_path / "cache"
    args = toy.overrides(*TASK_B, f"data.cache_dir={cache}", f"trainer.init_from={parent}")
    proc = toy.script("prepare_data.py", *args, f"hydra.run.dir={tmp_path / 'prepare'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (text,) = (cache / "toy").glob("text-*")
    fingerprint = Tokenizer.from_state_dict(load_checkpoint(parent)["tokenizer"]).fingerprint
    assert sorted(p.name for p in text.iterdir() if p.is_dir()) == [f"ids-{fingerprint}"]


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (("model.d_model=64",), "model.d_model=64: trainer.init_from="),
        (("model.encoder_layers=3",), "has model.encoder_layers=2"),
        (("model.positional=rope",), "model.positional=rope: trainer.init_from="),
        (("model.kv_heads=1",), "model.kv_heads=1:"),
        (("model.norm_first=false",), "has model.norm_first=True"),
        (("model.cross_attention=additive",), "model.cross_attention=additive:"),
        (("tokenizer.vocab_size=200",), "tokenizer.vocab_size=200: trainer.init_from="),
        (("tokenizer.joint=false",), "tokenizer.joint=False"),
        (("data.src_lang=tgt", "data.tgt_lang=src"), "translates src -> tgt"),
    ],
)
def test_a_fine_tune_that_does_not_fit_its_parent_is_refused_before_any_data(
    toy, parent, tmp_path, overrides, named
):
    cfg = toy.config(*overrides, f"data.cache_dir={tmp_path / 'cache'}", f"trainer.init_from={parent}")
    with pytest.raises(NMTError) as e:
        train(cfg, tmp_path / "run")
    message = str(e.value)
    assert named in message and "\n" not in message, message
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("bad", ["missing", "torn", "folder", "not a model"])
def test_a_parent_that_is_not_a_whole_checkpoint_is_refused_in_one_line(toy, parent, tmp_path, bad):
    path = tmp_path / "parent.pt"
    if bad == "torn":
        path.write_bytes(parent.read_bytes()[:5000])
    elif bad == "folder":
        path.mkdir()
    elif bad == "not a model":  # a checkpoint without its tokenizer
        ckpt = load_checkpoint(parent)
        ckpt["tokenizer"] = {}
        atomic_save(ckpt, path)
    cfg = toy.config(f"data.cache_dir={tmp_path / 'cache'}", f"trainer.init_from={path}")
    with pytest.raises(NMTError) as e:
        train(cfg, tmp_path / "run")
    assert str(e.value).startswith(f"trainer.init_from={path}: ") and "\n" not in str(e.value)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def test_the_script_refuses_a_conflict_in_one_line(toy, parent, tmp_path):
    args = toy.overrides("model.heads=2", f"trainer.init_from={parent}", f"hydra.run.dir={tmp_path / 'run'}")
    proc = toy.script("train.py", *args, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: model.heads=2: trainer.init_from={parent} has model.heads=4; a fine-tune keeps its parent's "
        "architecture (set model.heads=4 or drop the override)"
    ]


def test_a_corpus_outside_the_parents_alphabet_is_warned_of_once(toy, parent, tmp_path, caplog):
    folder = tmp_path / "greek"
    folder.mkdir()
    for split, n in (("train", 40), ("valid", 4), ("test", 4)):  # valid and test pairs are not trained on
        (folder / f"{split}.src").write_text("αβγ δεζ ηθι\n" * n if split == "train" else "ηθι αβγ\n" * n)
        (folder / f"{split}.tgt").write_text("κλμ νξο\n" * n if split == "train" else "νξο κλμ\n" * n)
    cfg = toy.config(
        "data=local",
        f"data.dir={folder}",
        "data.src_lang=src",
        "data.tgt_lang=tgt",
        "trainer.max_steps=1",
        *toy.short,
        f"trainer.init_from={parent}",
    )
    with caplog.at_level(logging.WARNING):
        train(cfg, tmp_path / "run")
    warnings = [r.getMessage() for r in caplog.records if "outside its alphabet" in r.getMessage()]
    assert len(warnings) == 1, warnings
    # each word is the word-start piece and one <unk> for its letters
    assert "50.0% of the source and 50.0% of the target training subwords are <unk>" in warnings[0]


def test_an_averaged_checkpoint_is_a_parent_too(toy, toy_run, tmp_path):
    averaged = tmp_path / "averaged.pt"
    steps = sorted(toy_run.checkpoints.glob("step_*.pt"))
    atomic_save(average_checkpoints(steps), averaged)
    run = toy.train(
        tmp_path / "run", *TASK_B, *toy.short, "trainer.max_steps=2", f"trainer.init_from={averaged}"
    )
    ckpt = load_checkpoint(run.checkpoints / "last.pt")
    assert ckpt["parent"]["path"] == str(averaged.resolve()) and ckpt["progress"]["step"] == 2


# ---------------------------------------------------------------------------------------- resuming


def test_a_resumed_fine_tune_continues_exactly(toy, parent, tmp_path):
    resumable = ("model.dropout=0.1", f"trainer.valid_every={STEPS // 2}")  # dropout: the RNG state matters
    overrides = (*TASK_B, *toy.short, *resumable, f"trainer.init_from={parent}")
    straight = toy.train(tmp_path / "straight", *overrides, f"trainer.max_steps={STEPS}")
    run_dir = tmp_path / "resumed"
    toy.train(run_dir, *overrides, f"trainer.max_steps={STEPS // 2}")
    args = [*overrides, f"hydra.run.dir={run_dir}", "trainer.resume=auto", f"trainer.max_steps={STEPS}"]
    proc = toy.script("train.py", *toy.overrides(*args), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    output = proc.stdout + proc.stderr
    assert f"trainer.init_from={parent} ignored: the run resumes from its own checkpoint" in output
    assert f"at step {STEPS // 2}" in output

    expected = load_checkpoint(straight.checkpoints / "last.pt")
    resumed = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert_continues_exactly(resumed, expected)
    assert resumed["parent"] == expected["parent"]
    # resumed without init_from (its own checkpoint's tokenizer, not one trained on task B)
    last = run_dir / "checkpoints" / "last.pt"
    found = resumed_fine_tune(toy.config(*TASK_B), load_checkpoint(last), last)
    assert found is not None and found.record == resumed["parent"]
    assert (
        found.tokenizer.fingerprint
        == Tokenizer.from_state_dict(load_checkpoint(parent)["tokenizer"]).fingerprint
    )


def test_a_fine_tune_started_in_a_run_dir_not_its_own_is_refused(toy, tmp_path):
    """trainer.init_from=RUN/checkpoints/last.pt hydra.run.dir=RUN (a RUN_DIR still exported) would
    resume the parent with the fine-tune's settings and write over the file init_from names; so would
    another fine-tune's run dir."""
    two_steps = (*toy.short, *toy.tiny, "trainer.max_steps=2", "trainer.valid_every=2")
    parent = toy.train(tmp_path / "parent", *two_steps).checkpoints / "last.pt"
    other = toy.train(tmp_path / "other", *two_steps).checkpoints / "last.pt"
    toy.train(tmp_path / "child", *TASK_B, *two_steps, f"trainer.init_from={other}")
    for run_dir, what in [("parent", "not a fine-tune"), ("child", f"a fine-tune of {other}")]:
        before = files_of(tmp_path / run_dir / "checkpoints")
        with pytest.raises(NMTError) as e:
            toy.train(tmp_path / run_dir, *TASK_B, *two_steps, f"trainer.init_from={parent}")
        assert str(e.value) == (
            f"trainer.init_from={parent}: this hydra.run.dir already holds a run "
            f"({tmp_path / run_dir / 'checkpoints' / 'last.pt'}, {what}) that the fine-tune would resume "
            "and write over; start the fine-tune in another hydra.run.dir"
        )
        assert files_of(tmp_path / run_dir / "checkpoints") == before


def test_a_fine_tune_resumes_after_its_parent_is_gone(toy, tmp_path):
    """Its own checkpoint holds the tokenizer and the parent's record; run.sh re-run in the same RUN_DIR
    is the pipeline job, whose training resumes from that checkpoint."""
    two_steps = (*toy.short, *toy.tiny, "trainer.valid_every=2")
    parent = toy.train(tmp_path / "parent", *two_steps, "trainer.max_steps=2").checkpoints / "last.pt"
    overrides = (*TASK_B, *two_steps, f"trainer.init_from={parent}")
    run = toy.train(tmp_path / "child", *overrides, "trainer.max_steps=2")
    record = load_checkpoint(run.checkpoints / "last.pt")["parent"]
    parent.unlink()
    toy.train(run.run_dir, *overrides, "trainer.max_steps=4")
    resumed = load_checkpoint(run.checkpoints / "last.pt")
    assert resumed["progress"]["step"] == 4 and resumed["parent"] == record

    calls = run_sh(tmp_path / "repo", run.run_dir, f"trainer.init_from={parent}")
    # one job that trains (preparing through the run's own checkpoint, the parent gone) and goes on
    assert [call.split()[0] for call in calls] == ["scripts/pipeline.py"]
    assert f"hydra.run.dir={run.run_dir}" in calls[0]


def run_sh(repo: Path, run_dir: Path, *args: str) -> list[str]:
    """The commands ``RUN_DIR=run_dir scripts/run.sh args`` runs, each as a line of its arguments: run.sh
    in a copy of the repository whose set-up does nothing and whose python records its arguments."""
    (repo / "scripts").mkdir(parents=True, exist_ok=True)
    (repo / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "scripts" / "run.sh", repo / "scripts" / "run.sh")
    (repo / "scripts" / "setup.sh").write_text("")
    (repo / ".venv" / "bin" / "activate").write_text(f'PATH="{repo / ".venv" / "bin"}:$PATH"\n')
    python = repo / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "$@" >> "{repo / "calls"}"\n')
    python.chmod(0o755)
    (repo / "calls").unlink(missing_ok=True)
    env = {**os.environ, "RUN_DIR": str(run_dir)}
    command = ["bash", str(repo / "scripts" / "run.sh"), *args]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return (repo / "calls").read_text().splitlines()


# ------------------------------------------------------------------------------- after training


def test_the_scripts_after_training_take_a_fine_tune(toy, parent, tmp_path):
    """run.sh's steps after training: average the fine-tune's own checkpoints, choose the final model
    on valid, evaluate it on test, export it to CTranslate2; the final model still names its parent."""
    run = toy.train(
        tmp_path / "run", *TASK_B, *toy.short, "trainer.max_steps=10", f"trainer.init_from={parent}"
    )
    hyp = tmp_path / "test.hyp"
    steps = [
        ("average_checkpoints.py", f"run_dir={run.run_dir}", "last=3"),
        ("select_final.py", f"run_dir={run.run_dir}"),
        ("evaluate.py", f"checkpoint={run.checkpoints / 'final.pt'}", "data.split=test", f"eval.out={hyp}"),
    ]
    if importlib.util.find_spec("ctranslate2"):  # an optional dependency
        steps.append(
            ("export_ct2.py", f"checkpoint={run.checkpoints / 'final.pt'}", f"output={tmp_path / 'ct2'}")
        )
    for script, *args in steps:
        proc = toy.script(script, *args, cwd=tmp_path)
        assert proc.returncode == 0, (script, proc.stderr)
    final = load_checkpoint(run.checkpoints / "final.pt")
    assert final["parent"] == load_checkpoint(run.checkpoints / "last.pt")["parent"]
    report = json.loads(hyp.with_suffix(".json").read_text())
    assert report["sentences"] == 200 and report["checkpoint"] == str(
        (run.checkpoints / "final.pt").resolve()
    )
