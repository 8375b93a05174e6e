"""The training loop's own decisions: how batches are cut, and when an update counts as skipped."""

from __future__ import annotations

import itertools
import math
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

import nmt.checkpoint as ckpt_io
import nmt.training.loop as loop
import nmt.training.setup as setup
import nmt.training.validation as validation
from nmt.checkpoint import atomic_save, load_checkpoint
from nmt.config import TrainConfig
from nmt.data import collate, prepare_corpus
from nmt.errors import NMTError
from nmt.training.lock import LOCK_NAME
from nmt.training.loop import train_step
from nmt.training.setup import Run, set_up
from nmt.training.validation import validate

MAX_TOKENS = 512


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("toy-data")


@pytest.fixture
def config(compose_train_cfg, cache_dir: Path):
    """Toy sentences of 20-30 words (one subword each) for a model of 8 positions: every pair is truncated."""

    def make(*overrides: str) -> TrainConfig:
        return compose_train_cfg(
            "experiment=toy",
            f"data.cache_dir={cache_dir}",
            "data.train_size=400",
            "data.valid_size=100",
            "data.test_size=10",
            "data.min_len=20",
            "data.max_len=30",
            "model.d_model=32",
            "model.ff_dim=64",
            "model.heads=2",
            "model.max_positions=8",
            "trainer.device=cpu",
            "trainer.precision=fp32",
            f"trainer.max_tokens={MAX_TOKENS}",
            "trainer.valid_bleu_sentences=2",
            "trainer.progress=false",
            *overrides,
        )

    return make


@pytest.fixture
def run(config, tmp_path: Path):
    run = set_up(config(), tmp_path)
    yield run
    run.monitor.close({})


def padded_size(batch) -> int:
    """What the sampler budgets: the padded source plus decoder input."""
    return batch.src.numel() + batch.tgt_in.numel()


def test_training_batches_of_truncated_sentences_fill_the_budget(run: Run):
    split = run.data.splits["train"]
    assert split.src_lengths.min() > 2 * run.cfg.model.max_positions  # the corpus is over-long
    sizes = [padded_size(collate(split, idx, run.cfg.model.max_positions)) for idx in run.sampler]
    assert max(sizes) <= MAX_TOKENS
    assert np.mean(sizes) > 0.8 * MAX_TOKENS


def test_validation_batches_of_truncated_sentences_fill_the_budget(run: Run, monkeypatch):
    sizes = []

    def recording_collate(*args, **kwargs):
        batch = collate(*args, **kwargs)
        sizes.append(padded_size(batch))
        return batch

    monkeypatch.setattr(validation, "collate", recording_collate)
    result = validate(run.model, run.data, run.cfg, run.device, run.precision)
    assert math.isfinite(result.metrics["loss"])
    assert len(sizes) > 2 and max(sizes) <= MAX_TOKENS
    assert sum(size > 0.8 * MAX_TOKENS for size in sizes) >= len(sizes) - 1  # all full but the last


def overflowing(monkeypatch) -> None:
    """Losses become inf, as fp16 overflows do: every gradient is non-finite."""
    real = loop.batch_loss

    def inf_loss(*args, **kwargs):
        loss, nll = real(*args, **kwargs)
        return loss * math.inf, nll

    monkeypatch.setattr(loop, "batch_loss", inf_loss)


def test_fp16_overflow_counts_as_a_skipped_update(config, tmp_path: Path, monkeypatch):
    """The GradScaler skips the step itself; the loop must still count it and give up eventually.

    fp16 needs CUDA, so this runs fp32 on the CPU with a CPU GradScaler, which skips the same way.
    """
    run = set_up(config("trainer.max_bad_steps=2"), tmp_path)
    run.scaler = torch.amp.GradScaler("cpu", enabled=True)
    batches = [
        [collate(run.data.splits["train"], idx, run.cfg.model.max_positions)]
        for idx in itertools.islice(run.sampler, 4)
    ]
    before = [p.detach().clone() for p in run.model.parameters()]
    train_step(run, batches[0])  # a good step: nothing skipped
    assert run.progress.skipped_steps == 0 and run.scaler.get_scale() == 2.0**16
    trained = [p.detach().clone() for p in run.model.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, trained))

    overflowing(monkeypatch)
    for i in (1, 2):
        train_step(run, batches[i])
        assert run.progress.skipped_steps == run.progress.bad_steps == i
    assert run.scaler.get_scale() == 2.0**14  # the scaler backed off twice
    assert all(torch.equal(a, b) for a, b in zip(trained, run.model.parameters()))  # no update
    with pytest.raises(NMTError, match="trainer.max_bad_steps=2"):
        train_step(run, batches[3])
    run.monitor.close({})


def test_an_update_with_rdrop_adds_the_consistency_term(config, tmp_path: Path, monkeypatch):
    """optim.rdrop_alpha reaches each update's loss (tests/test_loss.py checks the term itself), and the
    update trains."""
    run = set_up(config("optim.rdrop_alpha=2", "model.dropout=0.3"), tmp_path)
    alphas = []
    real = loop.batch_loss

    def recorded(*args):
        alphas.append(args[3])
        return real(*args)

    monkeypatch.setattr(loop, "batch_loss", recorded)
    batch = collate(run.data.splits["train"], next(iter(run.sampler)), run.cfg.model.max_positions)
    before = [p.detach().clone() for p in run.model.parameters()]
    stats = train_step(run, [batch])
    assert alphas == [2.0] and math.isfinite(float(stats["loss_sum"]))
    assert any(not torch.equal(a, b) for a, b in zip(before, run.model.parameters()))
    run.monitor.close({})


def test_each_epoch_trains_on_its_own_sampled_segmentation(config, tmp_path: Path, monkeypatch):
    """tokenizer.sampling_alpha: epoch e collates from copy e % copies, in batches cut by its lengths."""
    cfg = config(
        "model.max_positions=128",  # no truncation: the copies differ in length
        "tokenizer.sampling_alpha=0.3",
        "tokenizer.sampled_copies=2",
        "trainer.max_epochs=3",
        "trainer.valid_every=1000",
    )
    used = []

    def recording_collate(split, indices, max_positions):
        used.append((split.src_lengths, indices))
        return collate(split, indices, max_positions)

    monkeypatch.setattr(loop, "collate", recording_collate)
    loop.train(cfg, tmp_path)
    copies = set_up(cfg, tmp_path / "again").data.train_segmentations
    assert not np.array_equal(copies[0].src_lengths, copies[1].src_lengths)
    both = [np.stack([c.src_lengths for c in copies]), np.stack([c.tgt_lengths for c in copies])]
    sampler = loop.TokenBatchSampler(*both, MAX_TOKENS, seed=cfg.seed)
    for e in range(3):  # each epoch's batches: the corpus once, from copy e % 2, as cut by its lengths
        expected = list(sampler)
        epoch_used, used = used[: len(expected)], used[len(expected) :]
        assert [indices for _, indices in epoch_used] == expected
        assert all(np.array_equal(lengths, copies[e % 2].src_lengths) for lengths, _ in epoch_used)


def test_linear_schedule_follows_the_budget_of_the_run(config, tmp_path: Path):
    """optim.schedule=linear: the rate of update s is lr * ramp * (1 - spent), spent = (s - 1) / max_steps."""
    run = set_up(config("optim.schedule=linear", "optim.warmup_steps=2", "trainer.max_steps=8"), tmp_path)
    batches = [collate(run.data.splits["train"], idx, run.cfg.model.max_positions) for idx in run.sampler]
    lrs = []
    for batch in batches[:8]:
        lrs.append(train_step(run, [batch], spent=run.clock.fraction(run.progress.step))["lr"])
        run.progress.step += 1
    lr = run.cfg.optim.lr
    assert lrs == pytest.approx([lr * min(s / 2, 1) * (1 - (s - 1) / 8) for s in range(1, 9)])
    run.monitor.close({})


def test_linear_schedule_with_an_epochs_budget_counts_the_updates_before_this_one(
    config, tmp_path, monkeypatch
):
    """One epoch of n updates: the first runs at the full rate, the last at 1/n of it (not 1 - 1/n ... 0)."""
    cfg = config("optim.schedule=linear", "optim.warmup_steps=0", "trainer.max_epochs=1")
    lrs = []
    real_step = loop.train_step

    def recording_step(*args, **kwargs):
        stats = real_step(*args, **kwargs)
        lrs.append(stats["lr"])
        return stats

    monkeypatch.setattr(loop, "train_step", recording_step)
    loop.train(cfg, tmp_path)
    n = len(lrs)
    assert n > 4
    assert lrs == pytest.approx([cfg.optim.lr * (1 - s / n) for s in range(n)])


def test_rerunning_a_run_stopped_by_patience_does_nothing_and_says_so(config, tmp_path, monkeypatch, caplog):
    """trainer.resume=auto (scripts/run.sh, the resume hint) on a run that early stopping ended: no update,
    no validation, no checkpoint written or touched."""
    monkeypatch.setattr(loop, "is_better", lambda value, best, metric: best is None)  # a plateau
    stopping = ("trainer.patience=2", "trainer.valid_every=2", "trainer.max_steps=100")
    loop.train(config(*stopping), tmp_path)
    ckpt_dir = tmp_path / "checkpoints"
    before = load_checkpoint(ckpt_dir / "last.pt")["progress"]
    assert before["step"] == 6 and [h["step"] for h in before["history"]] == [2, 4, 6]
    files = written(tmp_path)
    assert sorted(f for f in files if f.startswith("checkpoints/")) == [
        f"checkpoints/{name}.pt" for name in ("best", "last", "step_2", "step_4", "step_6")
    ]

    updates = []
    real_step = loop.train_step
    monkeypatch.setattr(loop, "train_step", lambda *a, **k: updates.append(1) or real_step(*a, **k))
    with caplog.at_level("INFO", logger="nmt.training.loop"):
        loop.train(config(*stopping, "trainer.resume=auto"), tmp_path)
    assert updates == []
    said = [r.getMessage() for r in caplog.records if r.name == "nmt.training.loop"]
    reason = "early stopping: no improvement in 2 validations"
    assert said == [f"nothing to do: the run already ended at step 6 ({reason})"]
    assert written(tmp_path) == files  # checkpoints and TensorBoard


def written(run_dir: Path) -> dict[str, tuple[int, bytes]]:
    """Every file of a run, as (mtime, bytes) by relative path; not the lock that names the process
    training there (nmt.training.lock), which each process holding the run dir writes."""
    return {
        str(p.relative_to(run_dir)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != LOCK_NAME
    }


def test_a_run_stopped_by_patience_continues_when_patience_is_raised(config, tmp_path, monkeypatch):
    """The check reads the current config, as the budget's does: more patience, more training."""
    monkeypatch.setattr(loop, "is_better", lambda value, best, metric: best is None)
    loop.train(config("trainer.patience=2", "trainer.valid_every=2", "trainer.max_steps=100"), tmp_path)
    loop.train(
        config("trainer.patience=3", "trainer.valid_every=2", "trainer.max_steps=100", "trainer.resume=auto"),
        tmp_path,
    )
    assert load_checkpoint(tmp_path / "checkpoints" / "last.pt")["progress"]["step"] == 8
    # TensorBoard keeps the validation of the step the run resumed from
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("valid/loss")] == [2, 4, 6, 8]


def test_resuming_reads_the_checkpoint_once(config, tmp_path, monkeypatch):
    """set_up reads the checkpoint it resumes once, and hands it to the fine-tune check and the restore."""
    loop.train(config("trainer.valid_every=2", "trainer.max_steps=2"), tmp_path)
    reads, real_load = [], ckpt_io.load_checkpoint
    monkeypatch.setattr(
        ckpt_io, "load_checkpoint", lambda path, *a, **k: reads.append(path) or real_load(path, *a, **k)
    )
    run = set_up(config("trainer.valid_every=2", "trainer.max_steps=4", "trainer.resume=auto"), tmp_path)
    run.monitor.close({})
    assert reads == [tmp_path / "checkpoints" / "last.pt"]
    assert run.progress.step == 2 and run.end_reason is None


def hparams_records(tb_dir: Path) -> int:
    """How many final hyperparameter records (TensorBoard's hparams sessions) the run's events hold."""
    return sum(
        value.tag == "_hparams_/session_start_info"
        for path in tb_dir.rglob("events.out.tfevents.*")
        for event in EventFileLoader(str(path)).Load()
        for value in event.summary.value
    )


def signalled_during_update(monkeypatch, update: int) -> None:
    """A real SIGTERM to this process while update ``update`` (1-based) is computed: the loop sees it
    when it draws the next update, which is the last one it makes."""
    real_step = loop.train_step

    def step(run, *args, **kwargs):
        if run.progress.step + 1 == update:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(run, *args, **kwargs)

    monkeypatch.setattr(loop, "train_step", step)


@pytest.mark.parametrize("stopped_at", [2, 4], ids=["a validation step", "the last update"])
def test_a_run_stopped_on_an_update_due_for_validation_is_completed_by_resuming(
    config, tmp_path, monkeypatch, stopped_at
):
    """SIGTERM as update 4 of 4 (or 2, validated every 2) is decided: the run saves at once without
    validating; trainer.resume=auto validates that update first, so the history, the step checkpoints
    and best.pt are those of a run never stopped."""
    budget = ("trainer.valid_every=2", "trainer.max_steps=4")
    straight = loop.train(config(*budget), tmp_path / "straight")
    expected = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")["progress"]

    run_dir = tmp_path / "stopped"
    with monkeypatch.context() as patch:
        signalled_during_update(patch, stopped_at - 1)
        loop.train(config(*budget), run_dir)
    saved = load_checkpoint(run_dir / "checkpoints" / "last.pt")["progress"]
    assert saved["step"] == stopped_at
    assert [h["step"] for h in saved["history"]] == list(range(2, stopped_at, 2))  # not validated ...
    assert (run_dir / "checkpoints" / f"step_{stopped_at}.pt").is_file()  # ... but kept for averaging

    final = loop.train(config(*budget, "trainer.resume=auto"), run_dir)
    resumed = load_checkpoint(run_dir / "checkpoints" / "last.pt")["progress"]
    assert [h["step"] for h in resumed["history"]] == [2, 4]
    assert resumed["history"] == expected["history"] and final == straight
    best = load_checkpoint(run_dir / "checkpoints" / "best.pt")["progress"]["step"]
    assert best == load_checkpoint(tmp_path / "straight" / "checkpoints" / "best.pt")["progress"]["step"]
    names = {p.name for p in (run_dir / "checkpoints").glob("step_*.pt")}
    assert names == {p.name for p in (tmp_path / "straight" / "checkpoints").glob("step_*.pt")}
    loop.train(config(*budget, "trainer.resume=auto"), run_dir)  # now ended: nothing to do
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["progress"] == resumed


def test_the_averaged_checkpoints_are_the_windows_marks_not_the_validations_inside_it(
    config, tmp_path, monkeypatch
):
    """20 updates, the last half the averaging window (marks at updates 12, 14, ..., 20), validated every
    3: the validations in the window (15, 18) write no step_N.pt, which would crowd out the marks'; one
    stopped on update 15 and resumed keeps the same ones."""
    budget = ("trainer.max_steps=20", "trainer.valid_every=3", "trainer.average_window=0.5")
    loop.train(config(*budget), tmp_path / "straight")
    steps = [
        h["step"]
        for h in load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")["progress"]["history"]
    ]
    assert steps == [3, 6, 9, 12, 15, 18, 20]
    names = sorted(p.name for p in (tmp_path / "straight" / "checkpoints").glob("step_*.pt"))
    assert names == sorted(f"step_{s}.pt" for s in (12, 14, 16, 18, 20))

    with monkeypatch.context() as patch:
        signalled_during_update(patch, 14)
        loop.train(config(*budget), tmp_path / "stopped")
    loop.train(config(*budget, "trainer.resume=auto"), tmp_path / "stopped")
    assert sorted(p.name for p in (tmp_path / "stopped" / "checkpoints").glob("step_*.pt")) == names


def test_tensorboard_gets_the_final_metrics_once_per_run(config, tmp_path, monkeypatch):
    """Stopped after update 3 of 4 (validated at 2), resumed, re-run when ended: one hparams record, and
    one event file per session that trained."""
    budget = ("trainer.valid_every=2", "trainer.max_steps=4")
    with monkeypatch.context() as patch:
        signalled_during_update(patch, 2)
        loop.train(config(*budget), tmp_path)
    assert hparams_records(tmp_path / "tb") == 0  # interrupted: not the run's end
    loop.train(config(*budget, "trainer.resume=auto"), tmp_path)
    loop.train(config(*budget, "trainer.resume=auto"), tmp_path)
    assert hparams_records(tmp_path / "tb") == 1
    assert len(list((tmp_path / "tb").rglob("events.out.tfevents.*"))) == 2
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("hparam/bleu")] == [4]


def test_the_log_gets_a_loss_line_every_log_every_updates_with_the_bar_on(config, tmp_path, caplog):
    """train.log (the log's file handler) has the training loss whatever the progress bar does."""
    cfg = config(
        "trainer.progress=true", "trainer.log_every=2", "trainer.max_steps=4", "trainer.valid_every=4"
    )
    with caplog.at_level("INFO", logger="nmt.training.loop"):
        loop.train(cfg, tmp_path)
    lines = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("step") and "lr" in r.getMessage()
    ]
    assert [line.split(":")[0] for line in lines] == ["step 2", "step 4"]
    assert all(" loss " in line and " ppl " in line and " tok/s " in line for line in lines), lines


# ------------------------------------------------------------------------------- what a run continues
def counting_updates(monkeypatch) -> list[int]:
    updates: list[int] = []
    real_step = loop.train_step
    monkeypatch.setattr(loop, "train_step", lambda *a, **k: updates.append(1) or real_step(*a, **k))
    return updates


def test_a_rerun_in_a_run_dir_continues_its_run_and_never_writes_over_it(config, tmp_path, monkeypatch):
    """A fixed hydra.run.dir run again (run.sh's RUN_DIR, a requeued job) continues from last.pt; with
    trainer.resume=null it is refused, in one line, before anything is written."""
    budget = ("trainer.valid_every=2", "trainer.max_steps=2")
    loop.train(config(*budget), tmp_path)
    first = written(tmp_path / "checkpoints")
    updates = counting_updates(monkeypatch)
    loop.train(config("trainer.valid_every=2", "trainer.max_steps=4"), tmp_path)  # the budget raised
    assert len(updates) == 2  # steps 3 and 4, not 1 to 4
    assert load_checkpoint(tmp_path / "checkpoints" / "last.pt")["progress"]["step"] == 4
    assert written(tmp_path / "checkpoints")["step_2.pt"] == first["step_2.pt"]
    before = written(tmp_path)
    with pytest.raises(NMTError) as e:  # another model in the same run dir: the run there is named
        loop.train(config(*budget, "model.d_model=16"), tmp_path)
    last = tmp_path / "checkpoints" / "last.pt"
    assert str(e.value).startswith(
        f"model.d_model=16: trainer.resume=auto ({last}, the run of this hydra.run.dir) was trained with "
        "model.d_model=32; a resumed run keeps its architecture"
    )
    assert "\n" not in str(e.value)
    with pytest.raises(NMTError) as e:
        loop.train(config(*budget, "trainer.resume=null"), tmp_path)
    assert str(e.value) == (
        f"{tmp_path} holds a run (last.pt, best.pt, step_2.pt, ...) that trainer.resume=null would write "
        "over: continue it with trainer.resume=auto, or train a new run in another hydra.run.dir"
    )
    assert written(tmp_path) == before and len(updates) == 2
    (tmp_path / "checkpoints" / "last.pt").unlink()  # which checkpoint to go on from: the user says
    with pytest.raises(NMTError, match=r"holds checkpoints \(best.pt, step_2.pt, step_4.pt\) but no last.pt"):
        loop.train(config(*budget), tmp_path)
    other = tmp_path / "other"
    loop.train(config(*budget), other)
    with pytest.raises(NMTError, match=rf"^{other} holds a run .* that trainer.resume=.*step_2.pt would"):
        loop.train(config(*budget, f"trainer.resume={tmp_path / 'checkpoints' / 'step_2.pt'}"), other)


def test_resuming_a_checkpoint_of_another_direction_or_sentencepiece_model_is_refused(config, tmp_path):
    """A joint vocabulary serves both directions, and another toy corpus gives a SentencePiece model of
    the same size: neither the vocabulary sizes nor the architecture tell them apart."""
    loop.train(config("trainer.valid_every=2", "trainer.max_steps=2"), tmp_path / "a")
    last = tmp_path / "a" / "checkpoints" / "last.pt"
    resume = ("trainer.valid_every=2", "trainer.max_steps=4", f"trainer.resume={last}")
    with pytest.raises(NMTError) as e:
        loop.train(config(*resume, "data.src_lang=tgt", "data.tgt_lang=src"), tmp_path / "b")
    assert str(e.value) == (
        f"trainer.resume={last} translates src->tgt, this run's data tgt->src: a run and the checkpoint it "
        "continues must translate in one direction"
    )
    other = config(*resume, "data.seed=7")
    tokenizer = prepare_corpus(other.data, other.tokenizer, progress=False).tokenizer
    vocab = load_checkpoint(last)["vocab"]
    assert (tokenizer.src_vocab_size, tokenizer.tgt_vocab_size) == (vocab["src"], vocab["tgt"])
    with pytest.raises(NMTError) as e:
        loop.train(other, tmp_path / "c")
    assert str(e.value) == (
        f"trainer.resume={last} has another vocabulary (SentencePiece model) than this run's data: a run "
        "and the checkpoint it continues must share it"
    )


@pytest.mark.parametrize("kind", ["averaged", "final"])
def test_resuming_a_checkpoint_without_training_state_is_refused_before_any_data_work(
    config, tmp_path, monkeypatch, kind
):
    loop.train(config("trainer.valid_every=2", "trainer.max_steps=2"), tmp_path / "a")
    ckpt = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt")
    weights = {k: v for k, v in ckpt.items() if k not in ("optimizer", "scaler", "sampler", "rng")}
    path = tmp_path / "a" / "checkpoints" / f"{kind}.pt"
    atomic_save(weights, path)
    monkeypatch.setattr(setup, "prepare_corpus", lambda *a, **k: pytest.fail("data prepared first"))
    with pytest.raises(NMTError) as e:
        loop.train(config(f"trainer.resume={path}"), tmp_path / "b")
    assert str(e.value).startswith(f"trainer.resume={path}: a model without training state")
    assert "resume from the run's last.pt or a step_N.pt" in str(e.value)
    assert str(e.value).endswith(f"train on from these weights with trainer.init_from={path}")
    assert not (tmp_path / "b").exists()


def test_a_requeue_signal_is_handed_on_once_last_pt_is_saved():
    """SIGUSR2 (Slurm's --signal, submitit's requeue) stops training like Ctrl-C; its own handler (the
    launcher's requeue) runs only when the loop hands it on, after saving."""
    seen = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: seen.append(signum))
    try:
        stop = loop.GracefulStop()
        signal.raise_signal(signal.SIGUSR2)
        assert stop.requested and seen == []  # the loop finishes its step and saves first
        stop.pass_on()
        assert seen == [signal.SIGUSR2]
        assert signal.getsignal(signal.SIGINT) is not stop._handle  # the other handlers are restored too
    finally:
        signal.signal(signal.SIGUSR2, previous)
