"""The training loop, readable top to bottom: :func:`train_in` is the whole story.

One update = ``trainer.accumulate`` micro-batches whose summed loss is divided by their total number
of target tokens (over all ranks), so accumulation and DDP give the same gradient as one big batch.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import asdict, astuple, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from nmt import checkpoint as ckpt_io
from nmt.config import TrainConfig, to_container
from nmt.data import Batch, TokenBatchSampler, collate, drop_words
from nmt.devices import autocast
from nmt.errors import NMTError
from nmt.training.budget import Budget, BudgetBar
from nmt.training.distributed import all_gather_object, all_reduce_sum, broadcast_object, cleanup
from nmt.training.lock import hold_run_dir
from nmt.training.loss import batch_loss
from nmt.training.schedule import learning_rate
from nmt.training.setup import End, Ending, Progress, Run, early_stopping, set_up
from nmt.training.validation import direction_table, is_better, validate

log = logging.getLogger(__name__)


def train(cfg: TrainConfig, run_dir: Path, resume_hint: str = "") -> dict[str, float]:
    """Train ``cfg.model`` on ``cfg.data``; checkpoints and TensorBoard logs go to ``run_dir``, which no
    other training process may use meanwhile."""
    with hold_run_dir(run_dir):
        return train_in(cfg, run_dir, resume_hint)


def train_in(cfg: TrainConfig, run_dir: Path, resume_hint: str) -> dict[str, float]:
    """:func:`train`, ``run_dir`` held."""
    run = set_up(cfg, run_dir)
    progress, clock = run.progress, run.clock
    ended, worked = run.end_reason, progress.pending_validation
    if progress.pending_validation:  # stopped right after an update due for validation: validate it now
        if run.dist.is_main:
            log.info("step %d: validating, as the stopped run did not", progress.step)
        written = ckpt_io.step_checkpoint(run.ckpt_dir, progress.step).is_file()  # by the stopped run
        if not validate_and_save(run, step_file=written):
            ended = ended or early_stopping(cfg.trainer.patience)
    if ended is not None:  # a finished run, re-run (trainer.resume=auto): nothing to train
        return end(run, ended, worked, resume_hint)
    stop, window = GracefulStop(), Window()
    index_lists = endless_batches(run.sampler, progress, clock.budget)
    validated_at = progress.history[-1]["step"] if progress.history else -1
    try:
        with display(run) as bar:
            while ended is None:
                spent = clock.fraction(progress.step)  # before this update's batches are drawn
                micro = [next(index_lists) for _ in range(cfg.trainer.accumulate)]  # (epoch, indices) each
                if None in micro:
                    ended = Ending(End.BUDGET, f"max_epochs={clock.budget.max_epochs} reached")
                    break
                # the budget once this step is done decides the checkpoint: it is written after the step
                flags = Agreed(stop.requested, clock.out_of_time(), clock.checkpoint_due(progress.step + 1))
                stats = train_step(run, [batch(run, *indices) for indices in micro], flags, spent)
                progress.step += 1
                bar.update(progress.step, clock.minutes())
                window.add(stats)
                if progress.step % cfg.trainer.log_every == 0:
                    log_train(run, window.flush(), bar)
                ended, agreed = stop_reason(run, stats["flags"]), stats["flags"]
                if ended is not None and ended.why is End.INTERRUPTED:  # what is due is left to a resume
                    progress.pending_validation = due_for_validation(run)
                    keep = progress.pending_validation and clock.keeps_validation(progress.step)
                    save(run, step_file=agreed.checkpoint or keep)
                elif progress.step % cfg.trainer.valid_every == 0 or ended is not None:
                    validated_at = progress.step
                    if not validate_and_save(run, agreed.checkpoint or clock.keeps_validation(progress.step)):
                        ended = ended or early_stopping(cfg.trainer.patience)
                elif agreed.checkpoint:
                    save(run, step_file=True)
                if agreed.checkpoint:
                    clock.pass_marks(progress.step)
    finally:
        stop.restore()
    if ended.why is not End.INTERRUPTED and validated_at != progress.step and progress.step > 0:
        validate_and_save(run, clock.keeps_validation(progress.step))  # out of epochs between validations
    final = end(run, ended, True, resume_hint)
    stop.pass_on()  # last.pt is saved: a launcher's requeue signal now does what it was sent for
    return final


def end(run: Run, ended: Ending, worked: bool, resume_hint: str) -> dict[str, float]:
    """Say why the run stopped, close TensorBoard and the process group; the final metrics. Those go to
    TensorBoard (as hyperparameter results) once, when the run ends after training or validating: not at
    an interruption, nor when a finished run is re-run."""
    progress, interrupted = run.progress, ended.why is End.INTERRUPTED
    if run.dist.is_main and not worked:
        log.info("nothing to do: the run already ended at step %d (%s)", progress.step, ended)
    elif run.dist.is_main:
        log.info("stopped after %d steps: %s", progress.step, ended)
    if run.dist.is_main and interrupted:
        pending = f" (it validates step {progress.step} first)" if progress.pending_validation else ""
        hint = resume_hint or f"trainer.resume={run.ckpt_dir / 'last.pt'}"
        log.info("saved %s; resume with%s:\n  %s", run.ckpt_dir / "last.pt", pending, hint)
    final = progress.history[-1] if worked and not interrupted and progress.history else {}
    run.monitor.close(final)
    cleanup(run.dist)
    return final


@contextlib.contextmanager
def display(run: Run) -> Iterator[BudgetBar]:
    """The progress bar (rank 0, ``trainer.progress``), with the log lines above it, not through it."""
    shown = run.dist.is_main and run.cfg.trainer.progress
    bar = BudgetBar(run.clock.budget, run.progress.step, run.clock.minutes(), shown)
    try:
        with logging_redirect_tqdm() if shown else nullcontext():
            yield bar
    finally:
        bar.close()


def batch(run: Run, epoch: int, indices: list[int]) -> Batch:
    """The micro-batch of ``indices``, cut from the epoch's segmentation, with words dropped."""
    splits = run.data.train_segmentations
    split = splits[epoch % len(splits)]  # the sampler batched by the same lengths
    optim = run.cfg.optim
    return drop_words(
        collate(split, indices, run.cfg.model.max_positions).to(run.device),
        optim.src_word_dropout,
        optim.tgt_word_dropout,
    )


def endless_batches(sampler: TokenBatchSampler, progress: Progress, budget: Budget):
    """(epoch, index list) pairs epoch after epoch (from the sampler's saved position); None after
    ``max_epochs``."""
    while True:
        if budget.max_epochs and progress.epoch >= budget.max_epochs:  # also when resumed
            while True:
                yield None
        for indices in sampler:
            yield sampler.epoch, indices
        progress.epoch += 1
        sampler.set_epoch(progress.epoch)


@dataclass(frozen=True)
class Agreed:
    """What every rank must decide alike after an update: each rank's view, or-ed over the ranks."""

    stop: bool = False  # a signal asked to stop (:class:`GracefulStop`)
    out_of_time: bool = False  # trainer.max_minutes reached
    checkpoint: bool = False  # the budget after this update reaches an averaging mark: write step_N.pt


def train_step(
    run: Run, batches: list[Batch], flags: Agreed | None = None, spent: float = 0.0
) -> dict[str, Any]:
    """One optimizer update over the micro-batches; returns the step's statistics.

    ``flags`` are or-ed over ranks together with the token count, in one collective, so every rank
    takes the same decision at the same step: ``stats["flags"]``. ``spent`` is the share of the budget
    used before this update (``optim.schedule=linear``).
    """
    cfg, dist, progress, optimizer, scaler = run.cfg, run.dist, run.progress, run.optimizer, run.scaler
    tokens = sum(b.tgt_tokens for b in batches)
    # On the model's device: NCCL (GPU) cannot reduce CPU tensors; on CPU this changes nothing.
    # The budget spent so far is averaged too: clocks differ, the learning rate must not.
    counts = torch.tensor([float(tokens), spent, *map(float, astuple(flags or Agreed()))], device=run.device)
    counts = all_reduce_sum(counts, dist).tolist()
    total_tokens, agreed = counts[0], Agreed(*(n > 0 for n in counts[2:]))
    lr = learning_rate(progress.step + 1, cfg.optim, counts[1] / dist.world_size)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=run.device)
    nll_sum = torch.zeros((), device=run.device)
    for i, batch in enumerate(batches):
        sync = i == len(batches) - 1 or not dist.enabled  # DDP: all-reduce gradients once per update
        with nullcontext() if sync else run.step_model.no_sync(), autocast(run.device, run.precision):
            loss, nll = batch_loss(run.step_model, batch, cfg.optim.label_smoothing, cfg.optim.rdrop_alpha)
        # DDP averages gradients over ranks, hence world_size / (tokens of all ranks).
        scaler.scale(loss * dist.world_size / total_tokens).backward()
        loss_sum += loss.detach()
        nll_sum += nll.detach()
    scaler.unscale_(optimizer)
    max_norm = cfg.optim.clip_norm if cfg.optim.clip_norm > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), max_norm).item()
    if apply_update(optimizer, scaler, grad_norm):
        progress.bad_steps = 0
    else:
        skip_update(progress, cfg)
    optimizer.zero_grad(set_to_none=True)
    return {
        "loss_sum": loss_sum,
        "nll_sum": nll_sum,
        "tokens": tokens,  # this rank's: the loss sums above are this rank's too
        "src_tokens": sum(b.src_tokens for b in batches),  # this rank's, for Window's throughput
        "all_tokens": total_tokens,  # all ranks': the effective batch size of the update
        "lr": lr,
        "grad_norm": grad_norm,
        "flags": agreed,
    }


def apply_update(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, grad_norm: float) -> bool:
    """Step the optimizer and the loss scale; False when the update was skipped (non-finite gradient).

    With fp16 the GradScaler also skips a step on its own when it finds inf/NaN gradients; its only
    trace is the scale going down in ``update``, so that counts as a skip too.
    """
    scale = scaler.get_scale()  # 1.0 when loss scaling is off
    finite = math.isfinite(grad_norm)
    if finite:
        scaler.step(optimizer)
    scaler.update()  # lowers the scale if unscale_ found inf/NaN
    return finite and scaler.get_scale() >= scale


def skip_update(progress: Progress, cfg: TrainConfig) -> None:
    """A non-finite loss/gradient: no update; give up when it keeps happening."""
    progress.bad_steps += 1
    progress.skipped_steps += 1
    log.warning(
        "step %d: non-finite loss or gradient, update skipped (%d in a row)",
        progress.step + 1,
        progress.bad_steps,
    )
    if progress.bad_steps > cfg.trainer.max_bad_steps:
        raise NMTError(
            f"{progress.bad_steps} consecutive non-finite losses/gradients at step {progress.step + 1} "
            f"(trainer.max_bad_steps={cfg.trainer.max_bad_steps}); "
            "lower optim.lr or use trainer.precision=fp32"
        )


def stop_reason(run: Run, flags: Agreed) -> Ending | None:
    """Why training stops after this step (None: go on)."""
    budget = run.clock.budget
    if flags.stop:
        return Ending(End.INTERRUPTED, "interrupted")
    if flags.out_of_time:
        return Ending(End.BUDGET, f"time budget of {budget.max_minutes:g} minutes reached")
    if budget.max_steps and run.progress.step >= budget.max_steps:
        return Ending(End.BUDGET, f"max_steps={budget.max_steps} reached")
    return None


def log_train(run: Run, summary: dict[str, float], bar: BudgetBar) -> None:
    """TensorBoard scalars, the progress bar's figures and a log line (train.log), bar or no bar."""
    run.monitor.train_scalars(summary, run.progress.step)
    text = {
        "loss": f"{summary['loss']:.3f}",
        "ppl": f"{summary['ppl']:.2f}",
        "lr": f"{summary['lr']:.2e}",
        "tok/s": f"{summary['tokens_per_s']:.0f}",
    }
    if run.cfg.trainer.progress:
        bar.set_postfix(text, run.progress.step)
    if run.dist.is_main:
        log.info("step %d: %s", run.progress.step, " ".join(f"{k} {v}" for k, v in text.items()))


class Window:
    """Sums between two log lines; the loss tensors are read from the device only when logging."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.losses: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.src_tokens = self.tgt_tokens = 0.0
        self.lr = self.grad_norm = 0.0
        self.start = time.monotonic()

    def add(self, stats: dict[str, Any]) -> None:
        self.losses.append((stats["loss_sum"], stats["nll_sum"]))
        self.src_tokens += stats["src_tokens"]
        self.tgt_tokens += stats["tokens"]
        self.lr, self.grad_norm = stats["lr"], stats["grad_norm"]

    def flush(self) -> dict[str, float]:
        """Per-target-token loss and perplexity; throughput of this rank in real (non-pad) tokens/s."""
        loss = sum(float(a) for a, _ in self.losses) / max(self.tgt_tokens, 1)
        nll = sum(float(b) for _, b in self.losses) / max(self.tgt_tokens, 1)
        elapsed = max(time.monotonic() - self.start, 1e-9)
        out = {
            "loss": loss,
            "ppl": math.exp(min(nll, 50)),
            "lr": self.lr,
            "grad_norm": self.grad_norm,
            "tokens_per_s": (self.src_tokens + self.tgt_tokens) / elapsed,
            "tgt_tokens_per_s": self.tgt_tokens / elapsed,
        }
        self.reset()
        return out


def validate_and_save(run: Run, step_file: bool) -> bool:
    """Validate, log and checkpoint on rank 0 (``step_N.pt`` too when ``step_file``); False when early
    stopping says stop (all ranks agree)."""
    keep_going = True
    cfg, progress = run.cfg, run.progress
    rng = all_gather_object(ckpt_io.rng_state(), run.dist)  # as it was before validating
    if run.dist.is_main:
        result = validate(run.model, run.data, cfg, run.device, run.precision)
        metrics = {**result.metrics, "step": progress.step}
        progress.history.append(metrics)
        value = metrics[cfg.trainer.best_metric]
        improved = is_better(value, progress.best, cfg.trainer.best_metric)
        if improved:
            progress.best, progress.bad_validations = value, 0
        else:
            progress.bad_validations += 1
        run.monitor.validation(
            metrics, result.examples, progress.step, run.model, run.data.tokenizer, result.first
        )
        log.info(
            "step %d: valid loss %.3f ppl %.2f BLEU %.2f chrF %.2f%s",
            progress.step,
            metrics["loss"],
            metrics["ppl"],
            metrics["bleu"],
            metrics["chrf"],
            " (best)" if improved else "",
        )
        for row in direction_table(metrics):  # several directions: BLEU and chrF above are their mean
            log.info("%s", row)
        progress.pending_validation = False
        save(run, improved=improved, step_file=step_file, rng=rng)
        keep_going = not (cfg.trainer.patience and progress.bad_validations >= cfg.trainer.patience)
    return bool(broadcast_object(keep_going, run.dist))


def due_for_validation(run: Run) -> bool:
    """Whether this update is one to validate (every ``valid_every``, or the budget's last). A run
    stopped at once after it says so in ``last.pt``, and ``trainer.resume`` validates it first, so that
    ``best.pt``, the history and the step checkpoints miss no validation."""
    step = run.progress.step
    return step % run.cfg.trainer.valid_every == 0 or bool(run.clock.finished(step))


def save(run: Run, improved: bool = False, step_file: bool = False, rng: list[dict] | None = None) -> None:
    """The one checkpoint writer: ``last.pt`` always, ``best.pt`` when improved, ``step_N.pt`` (last K
    kept) for averaging. Without ``rng`` (each rank's random state) it is called on every rank, as it
    gathers them; rank 0 writes."""
    if rng is None:
        rng = all_gather_object(ckpt_io.rng_state(), run.dist)
    if not run.dist.is_main:
        return
    if not ckpt_io.all_finite(run.model):
        raise NMTError(
            f"step {run.progress.step}: model weights are not finite; refusing to write a checkpoint"
        )
    # validation included: a resumed run stops where this one would
    run.progress.elapsed_s = run.clock.elapsed_s()
    state = ckpt_io.make_checkpoint(
        run.model.state_dict(),
        to_container(run.cfg),
        run.data.tokenizer.state_dict(),
        run.model.vocab_sizes,
        asdict(run.progress),
        optimizer=run.optimizer.state_dict(),
        scaler=run.scaler.state_dict(),
        sampler=run.sampler.state_dict(),
        rng=rng,  # one per rank
        **({"parent": run.parent} if run.parent else {}),
    )
    ckpt_io.atomic_save(state, run.ckpt_dir / "last.pt")
    if improved:
        ckpt_io.atomic_save(state, run.ckpt_dir / "best.pt")
    if step_file and run.cfg.trainer.keep_checkpoints > 0:
        ckpt_io.atomic_save(state, ckpt_io.step_checkpoint(run.ckpt_dir, run.progress.step))
        ckpt_io.prune_step_checkpoints(run.ckpt_dir, run.cfg.trainer.keep_checkpoints)


class GracefulStop:
    """SIGINT/SIGTERM set a flag; the loop finishes its step, saves ``last.pt`` and exits cleanly.

    SIGUSR2, which Slurm sends before a job's time limit (``--signal``) and on which submitit requeues
    the job, is caught the same way, and once ``last.pt`` is saved it is raised again for the handler
    it was meant for (:meth:`pass_on`): the requeued job continues from ``last.pt`` (trainer.resume=auto).
    """

    HANDED_ON = (signal.SIGUSR2,)

    def __init__(self):
        self.requested = False
        self.received: list[int] = []
        self._previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM, *self.HANDED_ON):
            with contextlib.suppress(ValueError):  # not the main thread (e.g. inside some test runners)
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.received.append(signum)
        if self.requested and signum not in self.HANDED_ON:  # a second Ctrl-C means "now"
            raise KeyboardInterrupt
        self.requested = True
        tqdm.write(f"{signal.Signals(signum).name} received: finishing this step and saving last.pt")

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def pass_on(self) -> None:
        """Raise again, for their own handlers (restored), the signals meant for a launcher."""
        self.restore()
        for sig in dict.fromkeys(s for s in self.received if s in self.HANDED_ON):
            signal.raise_signal(sig)
