"""Learning-rate schedules, as plain functions of the update number and the share of the training budget
spent (nothing to save or restore)."""

from __future__ import annotations

import math
from collections.abc import Callable

from nmt.config import OptimConfig, keyed_by_choices


def learning_rate(step: int, cfg: OptimConfig, spent: float = 0.0) -> float:
    """LR for update ``step`` (1-based): linear warmup to ``cfg.lr``, then ``cfg.schedule``.

    ``inverse_sqrt`` decays as lr * sqrt(warmup / step), the paper's d^-0.5 * min(step^-0.5,
    step * warmup^-1.5) rescaled so that its peak is ``optim.lr``. ``linear`` is the warmup ramp times
    ``1 - spent``, where ``spent`` is the share of the training budget (steps, epochs or minutes) used
    before this update: the rate reaches zero exactly when the budget ends, however many updates the
    machine makes, which suits a run that is stopped by its budget rather than by convergence.

    ``cfg.cooldown`` > 0 multiplies any schedule by ``(1 - spent) / cooldown`` over the last ``cooldown``
    share of the budget: the rate lands on zero when the budget ends, after a stable (or inverse square
    root) stretch, as in the warmup-stable-decay schedule (Hagele et al. 2024).
    """
    rate = SCHEDULES[cfg.schedule](step, cfg, spent)
    if cfg.cooldown:
        rate *= min(max(1.0 - spent, 0.0) / cfg.cooldown, 1.0)
    return rate


def _inverse_sqrt(step: int, cfg: OptimConfig, spent: float) -> float:
    warmup = max(cfg.warmup_steps, 0)
    if warmup and step < warmup:
        return cfg.lr * step / warmup
    return cfg.lr * math.sqrt(max(warmup, 1) / max(step, 1))


def _constant(step: int, cfg: OptimConfig, spent: float) -> float:
    warmup = max(cfg.warmup_steps, 0)
    return cfg.lr * step / warmup if warmup and step < warmup else cfg.lr


def _linear(step: int, cfg: OptimConfig, spent: float) -> float:
    warmup = max(cfg.warmup_steps, 0)
    ramp = min(step / warmup, 1.0) if warmup else 1.0
    return cfg.lr * ramp * max(1.0 - spent, 0.0)


# The schedules, by the optim.schedule choices.
SCHEDULES: dict[str, Callable[[int, OptimConfig, float], float]] = keyed_by_choices(
    OptimConfig, "schedule", {"inverse_sqrt": _inverse_sqrt, "constant": _constant, "linear": _linear}
)
