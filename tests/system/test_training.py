"""Training end to end on the toy task: it learns, it is deterministic, it resumes exactly (also in a
new process and after Ctrl-C), a checkpoint alone translates, bad losses and bad configs stop it."""

from __future__ import annotations

import math
import shlex
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import nmt.training.loop as loop
from nmt.checkpoint import load_checkpoint
from nmt.data import prepare_text
from nmt.errors import NMTError
from nmt.inference.translator import Translator

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# Resume/determinism runs: N steps, validation every N/2, dropout on so the RNG state matters too.
STEPS = 40
RESUMABLE = ("trainer.valid_every=20", "model.dropout=0.1")


def weights_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def nested_equal(a, b) -> bool:
    """Equality of nests of dicts/lists/tensors/numbers, tensors compared bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(nested_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(nested_equal(x, y) for x, y in zip(a, b))
    return a == b


def all_finite(state: dict) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())


# ---------------------------------------------------------------------------------------- learning


def test_the_toy_task_is_learned(toy_run):
    """The session's shared model: experiment=toy as it comes.

    Greedy validation BLEU must exceed 90 after the preset's 1000 steps; an untrained model scores ~0.
    """
    history = load_checkpoint(toy_run.checkpoints / "last.pt")["progress"]["history"]
    assert [h["step"] for h in history] == [500, 1000]
    assert toy_run.final == history[-1]
    assert toy_run.final["bleu"] > 90 and toy_run.final["chrf"] > 90, history
    assert history[1]["loss"] < history[0]["loss"] and history[1]["bleu"] > history[0]["bleu"]
    names = sorted(p.name for p in toy_run.checkpoints.iterdir())
    # keep_checkpoints=5 step checkpoints, spread over the last average_window=0.2 of the 1000 steps
    assert names == ["best.pt", "last.pt", *(f"step_{s}.pt" for s in (1000, 840, 880, 920, 960))]
    assert list((toy_run.run_dir / "tb").glob("events.out.tfevents.*"))


# ------------------------------------------------------------------------- determinism and resuming


@pytest.fixture(scope="module")
def straight(toy, tmp_path_factory):
    """STEPS steps in one go."""
    return toy.train(
        tmp_path_factory.mktemp("straight"), *toy.short, *toy.tiny, *RESUMABLE, f"trainer.max_steps={STEPS}"
    )


def test_same_config_same_run(toy, straight, tmp_path):
    again = toy.train(tmp_path, *toy.short, *toy.tiny, *RESUMABLE, f"trainer.max_steps={STEPS}")
    first, second = (load_checkpoint(r.checkpoints / "last.pt") for r in (straight, again))
    assert first["progress"]["history"] == second["progress"]["history"]
    assert len(first["progress"]["history"]) == 2 and first["progress"]["step"] == STEPS
    assert weights_equal(first["model"], second["model"])
    assert nested_equal(first["optimizer"], second["optimizer"])


def test_resuming_in_a_new_process_continues_exactly(toy, straight, tmp_path):
    run_dir = tmp_path / "resumed"
    half = toy.train(run_dir, *toy.short, *toy.tiny, *RESUMABLE, f"trainer.max_steps={STEPS // 2}")
    assert half.final["step"] == STEPS // 2
    saved = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert saved["progress"]["step"] == STEPS // 2
    assert saved["progress"]["epoch"] == saved["sampler"]["epoch"] == 0  # stopped mid-epoch
    assert saved["sampler"]["position"] == STEPS // 2

    args = [*toy.short, *toy.tiny, *RESUMABLE, f"hydra.run.dir={run_dir}", "trainer.resume=auto"]
    proc = toy.script("train.py", *toy.overrides(*args, f"trainer.max_steps={STEPS}"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"at step {STEPS // 2}" in proc.stdout + proc.stderr  # "resumed from ... at step 20"

    expected = load_checkpoint(straight.checkpoints / "last.pt")
    resumed = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert_continues_exactly(resumed, expected)
    assert expected["progress"]["epoch"] >= 1  # the resumed part crossed into the next epoch


def without_time(progress: dict) -> dict:
    return {k: v for k, v in progress.items() if k != "elapsed_s"}


def assert_continues_exactly(resumed: dict, expected: dict) -> None:
    """A resumed run's checkpoint equals the uninterrupted run's bit for bit: step, epoch, validation
    history, best, ... (all but the wall-clock time), sampler, weights, optimizer and RNG states."""
    assert without_time(resumed["progress"]) == without_time(expected["progress"])
    assert resumed["sampler"] == expected["sampler"]
    assert weights_equal(resumed["model"], expected["model"])
    assert nested_equal(resumed["optimizer"], expected["optimizer"])
    assert nested_equal(resumed["rng"], expected["rng"])


class FakeClock:
    """time.monotonic for the loop: each update takes ``update_s``, each validation ``validation_s``."""

    def __init__(self, monkeypatch, update_s: float, validation_s: float = 0.0):
        self.now = 0.0
        real_step, real_validate = loop.train_step, loop.validate

        def step(*args, **kwargs):
            self.now += update_s
            return real_step(*args, **kwargs)

        def validate(*args, **kwargs):
            self.now += validation_s
            return real_validate(*args, **kwargs)

        monkeypatch.setattr(loop.time, "monotonic", lambda: self.now)
        monkeypatch.setattr(loop, "train_step", step)
        monkeypatch.setattr(loop, "validate", validate)


@pytest.mark.parametrize("bar", ["bar", "no bar"])
@pytest.mark.parametrize("limit", ["max_steps", "max_epochs", "max_minutes"])
def test_rerunning_a_finished_run_does_nothing_and_says_so(
    toy, straight, tmp_path, monkeypatch, caplog, limit, bar
):
    """Re-running the command of a finished run (trainer.resume=auto) must not train, validate or write."""
    if limit == "max_steps":
        shutil.copytree(straight.run_dir, tmp_path, dirs_exist_ok=True)
        overrides = [*toy.short, *toy.tiny, *RESUMABLE, f"trainer.max_steps={STEPS}"]
    elif limit == "max_epochs":  # one epoch, ~30 steps, validated at its end
        overrides = [*toy.short, *toy.tiny, "trainer.max_epochs=1", "trainer.valid_every=1000"]
        toy.train(tmp_path, *overrides)
    else:  # a fake minute per update: 3 updates, and the one that carries the decision to stop
        FakeClock(monkeypatch, update_s=60.0)
        overrides = [*toy.short, *toy.tiny, "trainer.max_minutes=3", "trainer.valid_every=1000"]
        toy.train(tmp_path, *overrides)
    before = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    expected = {"max_steps": ("step", STEPS), "max_epochs": ("epoch", 1), "max_minutes": ("step", 4)}[limit]
    assert before["progress"][expected[0]] == expected[1]
    files = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "checkpoints").iterdir()}

    progress = "trainer.progress=true" if bar == "bar" else "trainer.progress=false"
    with caplog.at_level("INFO", logger="nmt.training.loop"):
        toy.train(tmp_path, *overrides, progress, "trainer.resume=auto")
    assert "nothing to do: the run already ended" in caplog.text
    after = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert after["progress"] == before["progress"]  # same step and epoch, no extra validation
    assert weights_equal(after["model"], before["model"])
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "checkpoints").iterdir()} == files


def test_a_resumed_timed_run_stops_where_the_uninterrupted_one_does(toy, tmp_path, monkeypatch):
    """30 s per update, 120 s per validation, validation every 2 updates, 5 minutes: the validations
    count against the budget in a resumed run too (its checkpoint holds the time after validating)."""
    FakeClock(monkeypatch, update_s=30.0, validation_s=120.0)
    overrides = [*toy.short, *toy.tiny, "trainer.max_minutes=5", "trainer.valid_every=2"]
    straight = toy.train(tmp_path / "straight", *overrides)
    expected = load_checkpoint(straight.checkpoints / "last.pt")["progress"]
    # 0-60 s: updates 1-2, validation to 180 s; updates 3-4 to 240 s, validation to 360 s; update 5 carries
    # the decision to stop (5 min passed), validation: 510 s.
    assert expected["step"] == 5 and expected["elapsed_s"] == 510.0
    at_2 = load_checkpoint(straight.checkpoints / "step_2.pt")["progress"]
    assert at_2["elapsed_s"] == 180.0

    resumed = toy.train(
        tmp_path / "resumed", *overrides, f"trainer.resume={straight.checkpoints / 'step_2.pt'}"
    )
    got = load_checkpoint(resumed.checkpoints / "last.pt")["progress"]
    assert got["step"] == 5 and got["elapsed_s"] == expected["elapsed_s"]
    assert [h["step"] for h in got["history"]] == [h["step"] for h in expected["history"]] == [2, 4, 5]


def test_ctrl_c_saves_and_the_printed_command_resumes(toy, tmp_path):
    run_dir = tmp_path / "run dir"  # the printed command must quote what needs quoting
    args = toy.overrides(
        *toy.short,
        *toy.tiny,
        "trainer.max_steps=100000",
        "trainer.valid_every=5",
        "optim.betas=[0.9,0.98]",
        f"hydra.run.dir={run_dir}",
    )
    proc = subprocess.Popen(
        [sys.executable, "scripts/train.py", *args],
        cwd=REPO,  # the printed command says scripts/train.py
        env=toy.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first_validation = run_dir / "checkpoints" / "step_5.pt"
        deadline = time.monotonic() + 240
        while not first_validation.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert first_validation.exists(), "training did not reach step 5"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # a failed assertion must not leave a 100000-step run behind
            proc.kill()
            proc.communicate()
    output = stdout + stderr
    assert proc.returncode == 0, output
    assert "SIGINT received" in output
    hint = [
        line.strip() for line in output.splitlines() if line.strip().startswith("python scripts/train.py")
    ]
    assert len(hint) == 1 and "trainer.resume=auto" in hint[0], output

    ckpt = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    stopped_at = ckpt["progress"]["step"]
    assert stopped_at >= 5 and all_finite(ckpt["model"])

    command = shlex.split(hint[0])
    assert command == ["python", "scripts/train.py", *args, "trainer.resume=auto"]
    resume = subprocess.run(
        [sys.executable, *command[1:], f"trainer.max_steps={stopped_at + 3}"],
        cwd=REPO,
        env=toy.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resume.returncode == 0, resume.stderr
    assert f"at step {stopped_at}" in resume.stdout + resume.stderr
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["progress"]["step"] == stopped_at + 3


def test_resuming_as_another_architecture_is_refused_naming_the_keys(toy, tmp_path):
    """model.heads=4 and rope over a 2-head run of learned positions: the shapes fit, the weights do not
    mean the same. The dropout keys may change."""
    overrides = (*toy.short, *toy.tiny, "trainer.max_steps=2", "trainer.valid_every=2")
    run = toy.train(tmp_path, *overrides)
    last = run.checkpoints / "last.pt"
    before = last.read_bytes()
    with pytest.raises(NMTError) as e:
        toy.train(tmp_path, *overrides, "model.heads=4", "model.positional=rope", "trainer.max_steps=4")
    assert str(e.value) == (
        f"model.heads=4 model.positional=rope: trainer.resume=auto ({last}, the run of this "
        "hydra.run.dir) was trained with model.heads=2 model.positional=learned; a resumed run keeps "
        "its architecture (drop the override, or train a new run in another hydra.run.dir)"
    )
    with pytest.raises(NMTError, match=r"^model\.heads=4: trainer\.resume=auto .* model\.heads=2; a resumed"):
        toy.train(tmp_path, *overrides, "model.heads=4", "trainer.max_steps=4")  # the same shapes
    assert last.read_bytes() == before
    toy.train(tmp_path, *overrides, "model.dropout=0.2", "model.attention_dropout=0.1", "trainer.max_steps=4")
    assert load_checkpoint(last)["progress"]["step"] == 4


def test_a_second_training_process_in_a_run_dir_is_refused_and_a_dead_ones_lock_taken_over(toy, tmp_path):
    """A process holds the run dir as train.py does; a training run there is refused naming its PID and
    writes nothing. Killed, it leaves its PID in the lock file, and the next run takes the lock over."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_RUN_DIR, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=toy.env()
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(NMTError) as e:
            toy.train(tmp_path, *toy.short, *toy.tiny, "trainer.max_steps=2")
        assert str(e.value).startswith(f"{tmp_path}: another training process (PID {holder.pid}) is running")
        assert not (tmp_path / "checkpoints").exists()
    finally:
        holder.kill()
        holder.communicate()
    assert (tmp_path / "train.lock").read_text().strip() == str(holder.pid)  # a dead holder's
    run = toy.train(tmp_path, *toy.short, *toy.tiny, "trainer.max_steps=2", "trainer.valid_every=2")
    assert load_checkpoint(run.checkpoints / "last.pt")["progress"]["step"] == 2
    assert (tmp_path / "train.lock").read_text() == ""  # released


HOLD_RUN_DIR = """
import sys, time
from pathlib import Path
from nmt.training.lock import hold_run_dir
with hold_run_dir(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


# ----------------------------------------------------------------------------- a checkpoint alone


@contextmanager
def hidden(*paths: Path):
    """The paths are gone (moved away) inside the block, back afterwards."""
    moved = [(p, p.with_name(p.name + ".hidden")) for p in paths]
    for src, dst in moved:
        src.rename(dst)
    try:
        yield
    finally:
        for src, dst in moved:
            dst.rename(src)


def test_a_checkpoint_alone_translates(toy, toy_run, tmp_path):
    root = prepare_text(toy_run.cfg.data, progress=False)
    sources = (root / "test.src").read_text().splitlines()[:40]
    refs = (root / "test.tgt").read_text().splitlines()[:40]
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(toy_run.checkpoints / "last.pt", alone / "model.pt")

    with hidden(toy_run.run_dir, toy.data_cache):
        assert not toy.data_cache.exists() and not toy_run.run_dir.exists()
        translator = Translator.from_checkpoint(str(alone / "model.pt"), torch.device("cpu"))
        hyps = translator.translate(sources, translator.cfg.decoding)
        proc = toy.script(
            "translate.py", f"checkpoint={alone / 'model.pt'}", cwd=alone, stdin="\n".join(sources) + "\n"
        )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == hyps
    assert sum(h == r for h, r in zip(hyps, refs)) >= 0.6 * len(refs)
    assert [p.name for p in alone.iterdir()] == ["model.pt"]  # translating wrote nothing


# ------------------------------------------------------------------------------ non-finite losses


def nan_loss_on(monkeypatch, bad_calls) -> None:
    """Training losses (grad enabled) become NaN on the given 1-based calls; validation is untouched."""
    real = loop.batch_loss
    calls = []

    def patched(*args, **kwargs):
        loss, nll = real(*args, **kwargs)
        if torch.is_grad_enabled():
            calls.append(1)
            if bad_calls(len(calls)):
                return loss * math.nan, nll * math.nan
        return loss, nll

    monkeypatch.setattr(loop, "batch_loss", patched)


def test_non_finite_losses_skip_the_update(toy, tmp_path, monkeypatch, caplog):
    nan_loss_on(monkeypatch, lambda call: call in (6, 7))
    run = toy.train(tmp_path, *toy.short, *toy.tiny, "trainer.max_steps=10", "trainer.valid_every=5")
    ckpt = load_checkpoint(run.checkpoints / "last.pt")
    assert ckpt["progress"]["step"] == 10
    assert ckpt["progress"]["skipped_steps"] == 2 and ckpt["progress"]["bad_steps"] == 0
    assert {int(state["step"]) for state in ckpt["optimizer"]["state"].values()} == {8}  # Adam updates
    assert all_finite(ckpt["model"])  # a NaN gradient through Adam would have poisoned every weight
    assert math.isfinite(run.final["loss"])
    assert sum("update skipped" in r.getMessage() for r in caplog.records) == 2


def test_persistent_non_finite_losses_stop_training(toy, tmp_path, monkeypatch):
    nan_loss_on(monkeypatch, lambda call: call > 5)
    with pytest.raises(
        NMTError, match=r"4 consecutive non-finite losses/gradients at step 9 \(trainer.max_bad_steps=3\)"
    ):
        toy.train(
            tmp_path,
            *toy.short,
            *toy.tiny,
            "trainer.max_steps=50",
            "trainer.valid_every=5",
            "trainer.max_bad_steps=3",
        )
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert ckpt["progress"]["step"] == 5 and all_finite(ckpt["model"])
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["best.pt", "last.pt", "step_5.pt"]


def test_non_finite_weights_are_never_checkpointed(toy, tmp_path, monkeypatch):
    """Should a NaN update get through anyway, saving refuses and the last good checkpoint stays."""
    nan_loss_on(monkeypatch, lambda call: call == 7)
    monkeypatch.setattr(loop.torch.nn.utils, "clip_grad_norm_", lambda params, max_norm: torch.tensor(1.0))
    with pytest.raises(  # step 9: the first averaging checkpoint of the last 20 % of 10 steps
        NMTError, match="step 9: model weights are not finite; refusing to write a checkpoint"
    ):
        toy.train(tmp_path, *toy.short, *toy.tiny, "trainer.max_steps=10", "trainer.valid_every=5")
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert ckpt["progress"]["step"] == 5 and all_finite(ckpt["model"])
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["best.pt", "last.pt", "step_5.pt"]


# ------------------------------------------------------------------------------------- bad configs


@pytest.mark.parametrize(
    ("override", "named"),
    [
        (
            "trainer.max_stepz=5",
            ["error: trainer.max_stepz: no such setting; did you mean trainer.max_steps?"],
        ),
        (
            "+trainer.max_stepz=5",
            ["error: trainer.max_stepz: no such setting; did you mean trainer.max_steps?"],
        ),
        ("trainer.max_steps=abc", ["max_steps", "abc"]),
    ],
)
def test_bad_overrides_fail_at_start_naming_the_key(toy, tmp_path, override, named):
    started = time.monotonic()
    proc = toy.script("train.py", *toy.overrides(override, f"hydra.run.dir={tmp_path / 'run'}"), cwd=tmp_path)
    assert proc.returncode != 0
    assert all(word in proc.stderr for word in named), proc.stderr
    assert not (tmp_path / "run").exists()  # nothing started
    assert time.monotonic() - started < 120


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.valid_every=0", "error: trainer.valid_every=0: must be > 0"),
        (
            "trainer.best_metric=BLEU",
            "error: trainer.best_metric=BLEU: must be one of bleu, chrf, loss, ppl; did you mean bleu?",
        ),
    ],
)
def test_values_that_cannot_work_fail_at_start_in_one_line(toy, tmp_path, override, message):
    proc = toy.script("train.py", *toy.overrides(override, f"hydra.run.dir={tmp_path / 'run'}"), cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [message]  # no traceback
    assert not (tmp_path / "run" / "checkpoints").exists()  # before any data or model was made


def test_step_checkpoints_for_averaging_cover_the_end_of_a_short_run(toy, tmp_path):
    """Few validations (one, at the end): the averaging checkpoints still come from the last 20 %."""
    run = toy.train(tmp_path, *toy.short, *toy.tiny, "trainer.max_steps=50", "trainer.valid_every=1000")
    steps = sorted(int(p.stem.split("_")[1]) for p in run.checkpoints.glob("step_*.pt"))
    assert steps == [42, 44, 46, 48, 50]
    assert len(load_checkpoint(run.checkpoints / "last.pt")["progress"]["history"]) == 1


def test_a_time_budget_ends_the_run_and_places_the_averaging_checkpoints(toy, tmp_path, monkeypatch):
    """A fake clock where every update takes a minute: trainer.max_minutes=10 means 10 updates, plus the
    one that carries the decision to stop; the step checkpoints for averaging come from the last 20 %."""
    now = [0.0]
    real_step = loop.train_step

    def minute_long_step(*args, **kwargs):
        now[0] += 60.0
        return real_step(*args, **kwargs)

    monkeypatch.setattr(loop.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(loop, "train_step", minute_long_step)
    run = toy.train(tmp_path, *toy.short, *toy.tiny, "trainer.max_minutes=10", "trainer.valid_every=1000")
    ckpt = load_checkpoint(run.checkpoints / "last.pt")
    assert ckpt["progress"]["step"] == 11 and ckpt["progress"]["elapsed_s"] == 660.0
    steps = sorted(int(p.stem.split("_")[1]) for p in run.checkpoints.glob("step_*.pt"))
    # The clock is read before each update: marks 8.4 and 8.8 min are seen before update 10 (at 9 min),
    # 9.2, 9.6 and 10.0 before update 11 (at 10 min, the end).
    assert steps == [10, 11]
