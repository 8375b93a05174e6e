"""Everything a training run is made of, and how it is made: device, process group, seeds, data,
model, optimizer, sampler, restored from a checkpoint when resuming (:func:`set_up`)."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from nmt import checkpoint as ckpt_io
from nmt.config import OptimConfig, TrainConfig, check_train_config, keyed_by_choices, with_absolute_folders
from nmt.data import PreparedData, TokenBatchSampler, clipped_lengths, pin_source, prepare_corpus
from nmt.data.multilingual import train_sampler
from nmt.devices import keep_freed_memory, resolve_precision, select_device
from nmt.errors import NMTError
from nmt.models import Seq2Seq, build_model, count_parameters
from nmt.training.budget import Budget, BudgetClock
from nmt.training.distributed import Dist, broadcast_object, init_distributed
from nmt.training.init_from import (
    FineTune,
    check_same_model,
    fine_tune,
    resumed_fine_tune,
    start,
    warn_unknown,
)
from nmt.training.monitor import Monitor
from nmt.training.precision import bf16_probe
from nmt.training.schedule import learning_rate

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """Everything besides tensors that a resumed run needs to continue exactly."""

    step: int = 0
    epoch: int = 0
    best: float | None = None
    bad_validations: int = 0
    bad_steps: int = 0
    skipped_steps: int = 0
    elapsed_s: float = 0.0  # training time so far, over all sessions of a resumed run (the time budget)
    pending_validation: bool = False  # stopped after an update due for validation: a resume validates it
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass
class Run:
    """The objects of one training run, passed around together."""

    cfg: TrainConfig
    data: PreparedData
    model: Seq2Seq  # the bare model: checkpoints, validation, decoding
    step_model: torch.nn.Module  # what the training step calls: DDP- and/or compile-wrapped model
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    sampler: TokenBatchSampler
    monitor: Monitor
    dist: Dist  # this process's rank among the ranks of the run
    device: torch.device
    precision: str
    ckpt_dir: Path
    progress: Progress
    clock: BudgetClock  # the budget, and how much of it is spent
    end_reason: Ending | None  # why a resumed run has nothing left to train (None: it has); see end_reason()
    parent: dict | None = None  # a fine-tune's parent checkpoint (trainer.init_from): path, digest, step


@dataclass
class Resumed:
    """The checkpoint a resumed run continues, read once."""

    path: Path
    where: str  # as refusals name it: see resume_where()
    state: dict[str, Any]


# ------------------------------------------------------------------------------------------- set-up
def set_up(cfg: TrainConfig, run_dir: Path) -> Run:
    """Device, process group, seeds, data, model, optimizer, sampler; restored from a checkpoint
    when ``trainer.resume`` says so."""
    check_train_config(cfg)
    # as the checkpoints store it: folders absolute, a hub branch as the commit read
    cfg = replace(cfg, data=pin_source(with_absolute_folders(cfg.data)))
    ckpt_dir = run_dir / "checkpoints"
    resumed = read_resumed(cfg, ckpt_dir)  # before any data or model work
    device, dist = start_process(cfg)
    seed_everything(cfg.seed)
    # refuses a parent that does not fit before any data is prepared
    parent = resumed_fine_tune(cfg, resumed.state, resumed.path) if resumed else fine_tune(cfg)
    data = prepare_on_main_first(cfg, dist, parent)
    model, optimizer, sampler = build(cfg, data, device, dist, parent)
    probe, min_speedup = bf16_probe(cfg, model, data, sampler, device, dist), cfg.trainer.cpu_bf16_min_speedup
    precision, why = resolve_precision(cfg.trainer.precision, device, probe, min_speedup)
    budget = Budget.from_config(cfg.trainer, device)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    progress = Progress()
    if resumed is not None:
        progress = restore(resumed, cfg, data, model, optimizer, scaler, sampler, dist.rank)
    if dist.is_main:
        log_run(cfg, model, device, dist, f"{precision} ({why})", budget)
    clock = BudgetClock(
        budget,
        progress.elapsed_s,
        progress.step,
        epochs=lambda: progress.epoch + sampler.position / max(len(sampler), 1),
        window=cfg.trainer.average_window,
        count=cfg.trainer.keep_checkpoints,
    )
    reason = end_reason(cfg, progress, clock)
    record = parent.record if parent else None
    return Run(
        cfg=cfg,
        data=data,
        model=model,
        step_model=wrap_model(model, cfg, dist),
        optimizer=optimizer,
        scaler=scaler,
        sampler=sampler,
        monitor=open_monitor(run_dir, cfg, dist, progress, reason, record),
        dist=dist,
        device=device,
        precision=precision,
        ckpt_dir=ckpt_dir,
        progress=progress,
        clock=clock,
        end_reason=reason,
        parent=record,
    )


def read_resumed(cfg: TrainConfig, ckpt_dir: Path) -> Resumed | None:
    """The checkpoint ``trainer.resume`` continues (None: a new run), refused unless it holds the training
    state and the architecture of ``cfg``."""
    path = resume_path(cfg.trainer.resume, ckpt_dir)
    if path is None:
        return None
    resumed = Resumed(path, resume_where(cfg, path), resumable(path))
    check_same_model(cfg, resumed.state, resumed.where)
    return resumed


def start_process(cfg: TrainConfig) -> tuple[torch.device, Dist]:
    """The device and the process group; under torchrun each rank on its own GPU. On the CPU, freed
    memory is kept for the next step (:func:`~nmt.devices.keep_freed_memory`)."""
    device = select_device(cfg.trainer.device)
    if device.type == "cpu":
        keep_freed_memory()
    dist = init_distributed(device)
    if dist.enabled and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
        torch.cuda.set_device(device)
    return device, dist


def build(
    cfg: TrainConfig, data: PreparedData, device: torch.device, dist: Dist, parent: FineTune | None
) -> tuple[Seq2Seq, torch.optim.Optimizer, TokenBatchSampler]:
    """The model (a fine-tune's: with its parent's weights), its optimizer and the batch sampler."""
    tok = data.tokenizer
    model = build_model(cfg.model, tok.src_vocab_size, tok.tgt_vocab_size, tok.joint).to(device)
    if parent is not None and parent.weights is not None:
        start(parent, model)
    seed_everything(rank_seed(cfg.seed, dist.rank))  # same initial weights, different dropout per rank
    optimizer = make_optimizer(model, cfg)
    lengths = [clipped_lengths(split, cfg.model.max_positions) for split in data.train_segmentations]
    sampler = train_sampler(  # several corpora: drawn by temperature (nmt.data.multilingual)
        data,
        getattr(cfg.data, "temperature", 1.0),
        np.stack([src for src, _ in lengths]),
        np.stack([tgt for _, tgt in lengths]),
        cfg.trainer.max_tokens,
        shuffle=True,
        seed=cfg.seed,
        rank=dist.rank,
        world_size=dist.world_size,
    )
    return model, optimizer, sampler


def log_run(
    cfg: TrainConfig, model: Seq2Seq, device: torch.device, dist: Dist, precision: str, budget: Budget
):
    """The run's size, hardware, precision, budget and effective batch, in the log."""
    log.info(
        "model: %s parameters on %s, %d rank(s); precision %s",
        f"{count_parameters(model):,}",
        device,
        dist.world_size,
        precision,
    )
    log.info("budget: %s", budget.describe())
    log.info(
        "effective batch: up to %d tokens per update (max_tokens %d x accumulate %d x %d ranks)",
        cfg.trainer.max_tokens * cfg.trainer.accumulate * dist.world_size,
        cfg.trainer.max_tokens,
        cfg.trainer.accumulate,
        dist.world_size,
    )


def open_monitor(
    run_dir: Path, cfg: TrainConfig, dist: Dist, progress: Progress, reason: str | None, parent: dict | None
) -> Monitor:
    """TensorBoard, written by rank 0. A finished run re-run writes nothing, unless its last validation is
    pending. A resumed one drops the events that came after its checkpoint's step, but not those of that
    step (its validation), hence + 1."""
    writes = reason is None or progress.pending_validation
    purge_step = progress.step + 1 if progress.step else None
    return Monitor(run_dir, cfg, dist.is_main and writes, purge_step=purge_step, parent=parent)


def resume_where(cfg: TrainConfig, resume_from: Path | None) -> str:
    """The checkpoint a resumed run continues, as its refusals name it."""
    auto = f" ({resume_from}, the run of this hydra.run.dir)" if cfg.trainer.resume == "auto" else ""
    return f"trainer.resume={cfg.trainer.resume}{auto}"


class End(Enum):
    """Why training stops, or why a resumed run has nothing left to train."""

    INTERRUPTED = "interrupted"  # a signal: saved at once, for trainer.resume to go on
    BUDGET = "budget"  # trainer.max_steps, max_epochs or max_minutes reached
    EARLY_STOPPING = "early stopping"  # trainer.patience validations without improvement


@dataclass(frozen=True)
class Ending:
    """An :class:`End` and its account for the log (``max_steps=200 reached``)."""

    why: End
    text: str

    def __str__(self) -> str:
        return self.text


def end_reason(cfg: TrainConfig, progress: Progress, clock: BudgetClock) -> Ending | None:
    """Why the run has nothing left to train (None: it has): its budget is spent, or early stopping ended
    it. Both are judged by the current config, so raising the budget or ``trainer.patience`` continues
    a resumed run, while re-running the same command does nothing."""
    patience = cfg.trainer.patience
    if patience and progress.bad_validations >= patience:
        return early_stopping(patience)
    spent = clock.finished(progress.step)
    return Ending(End.BUDGET, spent) if spent else None


def early_stopping(patience: int) -> Ending:
    return Ending(End.EARLY_STOPPING, f"early stopping: no improvement in {patience} validations")


# ---------------------------------------------------------------------------------- set-up helpers
def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rank_seed(seed: int, rank: int) -> int:
    """A well-mixed seed per (seed, rank), so that no two ranks share a dropout stream."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def prepare_on_main_first(cfg: TrainConfig, dist: Dist, parent: FineTune | None = None) -> PreparedData:
    """Rank 0 prepares (and caches) the corpus; the other ranks then read the cache. A fine-tune's
    corpus is encoded with its parent's tokenizer."""
    tokenizer = parent.tokenizer if parent else None
    if dist.is_main:
        data = prepare_corpus(cfg.data, cfg.tokenizer, progress=True, tokenizer=tokenizer)
        if parent is not None:
            warn_unknown(data, cfg.trainer.init_unk_warning, parent.record["path"])
    broadcast_object(None, dist)  # a barrier that works on every backend
    if not dist.is_main:
        data = prepare_corpus(cfg.data, cfg.tokenizer, progress=False, tokenizer=tokenizer)
    return data


# The optimizers, by the optim.name choices (nmt.config.OptimConfig; checked at start).
OPTIMIZERS = keyed_by_choices(OptimConfig, "name", {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW})


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    o = cfg.optim
    return OPTIMIZERS[o.name](
        model.parameters(),
        lr=learning_rate(1, o),
        betas=tuple(o.betas),
        eps=o.eps,
        weight_decay=o.weight_decay,
        # One fused kernel per parameter instead of ~10 elementwise ops per update.
        fused=model_device(model).type in ("cpu", "cuda"),
    )


def wrap_model(model: Seq2Seq, cfg: TrainConfig, dist: Dist) -> torch.nn.Module:
    """DDP under torchrun, then ``torch.compile`` if asked (dynamic shapes: batches vary in length)."""
    wrapped: torch.nn.Module = model
    if dist.enabled:
        wrapped = DistributedDataParallel(
            model, device_ids=[dist.local_rank] if model_device(model).type == "cuda" else None
        )
    if cfg.trainer.compile:
        wrapped = torch.compile(wrapped, dynamic=True)
    return wrapped


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def resume_path(resume: str | None, ckpt_dir: Path) -> Path | None:
    """The checkpoint ``trainer.resume`` continues: "auto" = the run dir's ``last.pt`` if it has one (a
    re-run or a requeued job continues), else a path; None = a new run. A new run, or one continuing a
    checkpoint of another run dir, is refused where it would write over the checkpoints of a run."""
    last = ckpt_dir / "last.pt"
    if resume == "auto" and last.is_file():
        return last
    path = Path(resume) if resume and resume != "auto" else None
    if path is not None and not path.is_file():
        raise NMTError(f"trainer.resume={resume}: no such checkpoint")
    if path is not None and path.resolve().parent == ckpt_dir.resolve():
        return path  # a checkpoint of this run: it goes on from there
    held = training_checkpoints(ckpt_dir)
    if held:
        names = ", ".join(p.name for p in held[:3]) + (", ..." if len(held) > 3 else "")
        if resume == "auto":  # last.pt deleted: which checkpoint to go on from is the user's choice
            raise NMTError(
                f"{ckpt_dir.parent} holds checkpoints ({names}) but no last.pt: continue with "
                f"trainer.resume=PATH of one of them, or train a new run in another hydra.run.dir"
            )
        setting = f"trainer.resume={resume or 'null'}"
        raise NMTError(
            f"{ckpt_dir.parent} holds a run ({names}) that {setting} would write over: continue it"
            " with trainer.resume=auto, or train a new run in another hydra.run.dir"
        )
    if resume == "auto":
        log.info("trainer.resume=auto: no %s, a new run", last)
    return path


def training_checkpoints(ckpt_dir: Path) -> list[Path]:
    """The files of ``ckpt_dir`` that training writes: ``last.pt``, ``best.pt``, ``step_N.pt``."""
    named = [ckpt_dir / name for name in ("last.pt", "best.pt")]
    return [p for p in named if p.is_file()] + ckpt_io.step_checkpoints(ckpt_dir)


TRAINING_STATE = ("optimizer", "scaler", "sampler", "rng")  # what resuming needs besides the weights


def resumable(path: Path) -> dict[str, Any]:
    """The checkpoint at ``path``, refused unless it holds the training state to continue from."""
    state = ckpt_io.load_checkpoint(path)
    missing = [key for key in TRAINING_STATE if key not in state]
    if missing:
        raise NMTError(
            f"trainer.resume={path}: a model without training state (no {', '.join(missing)}; an averaged "
            f"or final checkpoint) cannot be resumed: resume from the run's last.pt or a step_N.pt, or train "
            f"on from these weights with trainer.init_from={path}"
        )
    return state


def restore(
    resumed: Resumed,
    cfg: TrainConfig,
    data: PreparedData,
    model: Seq2Seq,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    sampler: TokenBatchSampler,
    rank: int,
) -> Progress:
    """Put the checkpoint's weights and training state into the run's objects; its progress record."""
    state, where = resumed.state, resumed.where
    ckpt_io.check_same_task(
        where,
        ckpt_io.checkpoint_task(state),
        "this run's data",
        ckpt_io.Task.of(cfg.data.src_lang, cfg.data.tgt_lang, data.tokenizer),
        "a run and the checkpoint it continues",
    )
    ckpt_io.load_model_state(model, state, where=where)
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    sampler.load_state_dict(state["sampler"])
    rng = state["rng"] if isinstance(state["rng"], list) else [state["rng"]]  # one per rank
    if rank < len(rng):
        ckpt_io.set_rng_state(rng[rank])
    else:
        log.warning(
            "rank %d: no saved random state (the run had %d rank(s)); resuming anyway", rank, len(rng)
        )
    progress = Progress(**state["progress"])
    log.info("resumed from %s at step %d (epoch %d)", resumed.path, progress.step, progress.epoch)
    return progress
