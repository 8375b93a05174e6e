"""Learning-rate schedules, as plain functions of the update number (nothing to save or restore)."""

from __future__ import annotations

import math

from nmt.config import OptimConfig
from nmt.errors import NMTError

SCHEDULES = ("inverse_sqrt", "constant")


def learning_rate(step: int, cfg: OptimConfig) -> float:
    """LR for update ``step`` (1-based): linear warmup to ``cfg.lr``, then ``cfg.schedule``.

    ``inverse_sqrt`` decays as lr * sqrt(warmup / step), the paper's d^-0.5 * min(step^-0.5,
    step * warmup^-1.5) rescaled so that its peak is ``optim.lr``.
    """
    if cfg.schedule not in SCHEDULES:  # checked first: a typo must not wait for the end of warmup
        raise NMTError(f"unknown optim.schedule {cfg.schedule!r}; choose one of {', '.join(SCHEDULES)}")
    warmup = max(cfg.warmup_steps, 0)
    if warmup and step < warmup:
        return cfg.lr * step / warmup
    if cfg.schedule == "constant":
        return cfg.lr
    return cfg.lr * math.sqrt(max(warmup, 1) / max(step, 1))  # inverse_sqrt
