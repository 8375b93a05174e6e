"""Learning-rate schedules, as plain functions of the update number and the share of the training budget
spent (nothing to save or restore)."""

from __future__ import annotations

import math

from nmt.config import OptimConfig
from nmt.errors import NMTError

SCHEDULES = ("inverse_sqrt", "constant", "linear")


def learning_rate(step: int, cfg: OptimConfig, spent: float = 0.0) -> float:
    """LR for update ``step`` (1-based): linear warmup to ``cfg.lr``, then ``cfg.schedule``.

    ``inverse_sqrt`` decays as lr * sqrt(warmup / step), the paper's d^-0.5 * min(step^-0.5,
    step * warmup^-1.5) rescaled so that its peak is ``optim.lr``. ``linear`` is the warmup ramp times
    ``1 - spent``, where ``spent`` is the share of the training budget (steps, epochs or minutes) used
    before this update: the rate reaches zero exactly when the budget ends, however many updates the
    machine makes, which suits a run that is stopped by its budget rather than by convergence.
    """
    if cfg.schedule not in SCHEDULES:  # checked first: a typo must not wait for the end of warmup
        raise NMTError(f"unknown optim.schedule {cfg.schedule!r}; choose one of {', '.join(SCHEDULES)}")
    warmup = max(cfg.warmup_steps, 0)
    if cfg.schedule == "linear":
        ramp = min(step / warmup, 1.0) if warmup else 1.0
        return cfg.lr * ramp * max(1.0 - spent, 0.0)
    if warmup and step < warmup:
        return cfg.lr * step / warmup
    if cfg.schedule == "constant":
        return cfg.lr
    return cfg.lr * math.sqrt(max(warmup, 1) / max(step, 1))  # inverse_sqrt
