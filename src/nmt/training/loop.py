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
from contextlib import nullcontext
from dataclasses import asdict
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
from nmt.training.setup import Progress, Run, early_stopping, set_up
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
    clock, progress = run.clock, run.progress
    end_reason = run.end_reason
    if progress.pending_validation:  # stopped right after an update due for validation: validate it now
        if run.dist.is_main:
            log.info("step %d: validating, as the stopped run did not", progress.step)
        if not validate_and_save(run):
            end_reason = end_reason or early_stopping(cfg.trainer.patience)
        if end_reason is not None:
            if run.dist.is_main:
                log.info("stopped after %d steps: %s", progress.step, end_reason)
            return finish(run, progress.history[-1])
    # a finished run, re-run (trainer.resume=auto): nothing to train, validate or write
    if end_reason is not None:
        if run.dist.is_main:
            log.info("nothing to do: the run already ended at step %d (%s)", progress.step, end_reason)
        return finish(run, {})
    stop = GracefulStop()
    index_lists = endless_batches(run.sampler, progress, clock.budget)
    segmentations = run.data.train_segmentations
    word_dropout = (cfg.optim.src_word_dropout, cfg.optim.tgt_word_dropout)

    def batch(epoch: int, indices: list[int]) -> Batch:
        split = segmentations[epoch % len(segmentations)]  # the sampler batched by the same lengths
        return drop_words(collate(split, indices, cfg.model.max_positions).to(run.device), *word_dropout)

    window, reason = Window(), ""
    validated_at = progress.history[-1]["step"] if progress.history else -1
    bar = BudgetBar(clock.budget, progress.step, clock.minutes(), run.dist.is_main and cfg.trainer.progress)
    console = contextlib.ExitStack()
    if run.dist.is_main and cfg.trainer.progress:  # log lines above the bar, not through it
        console.enter_context(logging_redirect_tqdm())
    try:
        while not reason:
            spent = clock.fraction(progress.step)  # before this update's batches are drawn
            micro = [next(index_lists) for _ in range(cfg.trainer.accumulate)]  # (epoch, indices) each
            if None in micro:
                reason = f"max_epochs={clock.budget.max_epochs} reached"
                break
            flags = {
                "stop": stop.requested,
                "out_of_time": clock.out_of_time(),
                # the budget once this step is done: the checkpoint is written after it
                "checkpoint": clock.checkpoint_due(progress.step + 1),
            }
            batches = [batch(epoch, indices) for epoch, indices in micro]
            stats = train_step(run, batches, flags, spent)
            progress.step += 1
            bar.update(progress.step, clock.minutes())
            window.add(stats)
            if progress.step % cfg.trainer.log_every == 0:
                log_train(run, window.flush(), bar)
            reason = stop_reason(run, stats)
            if reason == "interrupted":  # saved below, at once: what is due at this step is left to a resume
                save_interrupted(run, step_file_due=stats["flags"]["checkpoint"])
            elif progress.step % cfg.trainer.valid_every == 0 or reason:
                validated_at = progress.step
                if not validate_and_save(run):
                    reason = reason or early_stopping(cfg.trainer.patience)
            elif stats["flags"]["checkpoint"]:
                save_checkpoints(run, improved=False, step_file=True)
            if stats["flags"]["checkpoint"]:
                clock.pass_marks(progress.step)
    finally:
        console.close()
        bar.close()
        stop.restore()
    if reason != "interrupted" and validated_at != progress.step and progress.step > 0:
        validate_and_save(run)  # out of epochs between validations
    if run.dist.is_main:
        log.info("stopped after %d steps: %s", progress.step, reason)
        if reason == "interrupted":
            pending = f" (it validates step {progress.step} first)" if progress.pending_validation else ""
            log.info(
                "saved %s; resume with%s:\n  %s",
                run.ckpt_dir / "last.pt",
                pending,
                resume_hint or f"trainer.resume={run.ckpt_dir / 'last.pt'}",
            )
    # The final metrics go to TensorBoard once, when the run ends: not at each interruption.
    ended = reason != "interrupted" and progress.history
    final = finish(run, progress.history[-1] if ended else {})
    stop.pass_on()  # last.pt is saved: a launcher's requeue signal now does what it was sent for
    return final


def finish(run: Run, final: dict[str, float]) -> dict[str, float]:
    """Close TensorBoard (with the final metrics as hyperparameter results) and the process group."""
    run.monitor.close(final)
    cleanup(run.dist)
    return final


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


# -------------------------------------------------------------------------------------------- a step
def train_step(
    run: Run, batches: list[Batch], flags: dict[str, bool] | None = None, spent: float = 0.0
) -> dict[str, Any]:
    """One optimizer update over the micro-batches; returns the step's statistics.

    ``flags`` (e.g. stop requested, out of time) are or-ed over ranks together with the token count,
    in one collective, so every rank takes the same decision at the same step: ``stats["flags"]``.
    ``spent`` is the share of the budget used before this update (``optim.schedule=linear``).
    """
    cfg, dist, progress, optimizer, scaler = run.cfg, run.dist, run.progress, run.optimizer, run.scaler
    flags = flags or {}
    tokens = sum(b.tgt_tokens for b in batches)
    # On the model's device: NCCL (GPU) cannot reduce CPU tensors; on CPU this changes nothing.
    # The budget spent so far is averaged too: clocks differ, the learning rate must not.
    counts = torch.tensor([float(tokens), spent, *map(float, flags.values())], device=run.device)
    counts = all_reduce_sum(counts, dist).tolist()
    total_tokens, agreed = counts[0], {name: n > 0 for name, n in zip(flags, counts[2:])}
    lr = learning_rate(progress.step + 1, cfg.optim, counts[1] / dist.world_size)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=run.device)
    nll_sum = torch.zeros((), device=run.device)
    for i, batch in enumerate(batches):
        sync = i == len(batches) - 1 or not dist.enabled  # DDP: all-reduce gradients once per update
        with nullcontext() if sync else run.step_model.no_sync(), autocast(run.device, run.precision):
            loss, nll = batch_loss(run.step_model, batch, cfg.optim.label_smoothing)
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


def stop_reason(run: Run, stats: dict[str, Any]) -> str:
    """Why training stops after this step ("" = go on)."""
    flags, budget = stats["flags"], run.clock.budget
    if flags.get("stop"):
        return "interrupted"
    if flags.get("out_of_time"):
        return f"time budget of {budget.max_minutes:g} minutes reached"
    if budget.max_steps and run.progress.step >= budget.max_steps:
        return f"max_steps={budget.max_steps} reached"
    return ""


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


def validate_and_save(run: Run) -> bool:
    """Validate, log and checkpoint on rank 0; False when early stopping says stop (all ranks agree)."""
    keep_going = True
    cfg, progress = run.cfg, run.progress
    rng = all_gather_object(ckpt_io.rng_state(), run.dist)
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
        write_checkpoints(run, improved, step_file=True, rng=rng)
        keep_going = not (cfg.trainer.patience and progress.bad_validations >= cfg.trainer.patience)
    return bool(broadcast_object(keep_going, run.dist))


def save_interrupted(run: Run, step_file_due: bool) -> None:
    """Save a stopped run at once, without validating. When this update was due for validation (every
    ``valid_every``, or the budget's last), ``last.pt`` says so and ``trainer.resume`` validates it
    first, so that ``best.pt``, the history and the step checkpoints miss no validation. The step
    checkpoint is written now either way: averaging gets it even if the run is never resumed."""
    progress = run.progress
    due = progress.step % run.cfg.trainer.valid_every == 0 or bool(run.clock.finished(progress.step))
    progress.pending_validation = due
    save_checkpoints(run, improved=False, step_file=step_file_due or due)


def save_checkpoints(run: Run, improved: bool, step_file: bool) -> None:
    """Called on every rank (it gathers each rank's random state); rank 0 writes."""
    rng = all_gather_object(ckpt_io.rng_state(), run.dist)
    if run.dist.is_main:
        write_checkpoints(run, improved, step_file, rng)


def write_checkpoints(run: Run, improved: bool, step_file: bool, rng: list[dict]) -> None:
    """``last.pt`` always, ``best.pt`` when improved, ``step_N.pt`` (last K kept) for averaging."""
    if not ckpt_io.all_finite(run.model):
        raise NMTError(
            f"step {run.progress.step}: model weights are not finite; refusing to write a checkpoint"
        )
    run.progress.elapsed_s = (
        run.clock.elapsed_s()
    )  # validation included: a resumed run stops where this one would
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
        ckpt_io.atomic_save(state, run.ckpt_dir / f"step_{run.progress.step}.pt")
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
