"""How long a run trains, how far along it is, and when it writes the checkpoints that get averaged.

Every run has a budget: the configured ``max_steps`` / ``max_epochs`` / ``max_minutes``, or, when none
is set, ``trainer.default_budget`` for the device found (minutes on a CPU, updates on a GPU). The
budget also places the step checkpoints for averaging: ``keep_checkpoints`` of them, evenly spaced
over the last ``average_window`` of the run, so that the average covers the end of training on a
fast machine and a slow one alike (a fixed step interval reaches back into early training when the
machine makes few updates). Validations write step checkpoints too, but inside the window only the
last, at the budget's end: the others would crowd out the marks' (the newest K are kept), and the
average would span a few validations at the very end instead of the window.

:class:`BudgetClock` is the one place that knows how far a run is: its training time (validation
included, carried over a resume), the share of the budget spent, whether it is used up, and which
averaging marks are still ahead. The loop asks it; the learning-rate schedule gets its share.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from nmt.config import TrainerConfig
from nmt.progress import refresh_interval


@dataclass(frozen=True)
class Budget:
    max_steps: int = 0  # 0 = no limit of this kind
    max_epochs: int = 0
    max_minutes: float = 0.0
    source: str = "trainer.max_steps/max_epochs/max_minutes"

    @classmethod
    def from_config(cls, cfg: TrainerConfig, device: torch.device) -> Budget:
        if cfg.max_steps or cfg.max_epochs or cfg.max_minutes:
            return cls(cfg.max_steps, cfg.max_epochs, cfg.max_minutes)
        if device.type == "cuda":
            return cls(max_steps=cfg.default_budget.gpu_steps, source="trainer.default_budget.gpu_steps")
        return cls(max_minutes=cfg.default_budget.cpu_minutes, source="trainer.default_budget.cpu_minutes")

    def describe(self) -> str:
        parts = [
            f"{self.max_steps} updates" if self.max_steps else "",
            f"{self.max_epochs} epochs" if self.max_epochs else "",
            f"{self.max_minutes:g} minutes" if self.max_minutes else "",
        ]
        limits = [p for p in parts if p]
        first = ", whichever comes first" if len(limits) > 1 else ""
        return f"{' or '.join(limits)}{first} ({self.source})"

    def fraction(self, step: int, epochs: float, minutes: float) -> float:
        """How much of the budget is spent: the largest share over its limits (1.0 = done)."""
        shares = [
            step / self.max_steps if self.max_steps else 0.0,
            epochs / self.max_epochs if self.max_epochs else 0.0,
            minutes / self.max_minutes if self.max_minutes else 0.0,
        ]
        return max(shares)

    def exhausted(self, step: int, epochs: float, minutes: float) -> str:
        """Why the budget is used up ("" = it is not)."""
        if self.max_steps and step >= self.max_steps:
            return f"max_steps={self.max_steps} reached"
        if self.max_epochs and epochs >= self.max_epochs:
            return f"max_epochs={self.max_epochs} reached"
        if self.max_minutes and minutes >= self.max_minutes:
            return f"time budget of {self.max_minutes:g} minutes reached"
        return ""


class BudgetClock:
    """Where a run stands against its budget, read at any moment.

    ``elapsed_s`` is the training time a resumed run already spent (from its checkpoint); ``epochs`` tells
    the epochs done so far, fractions included (the sampler's position). The time counts everything
    between the start and now, validations too, so a resumed run stops where an uninterrupted one does
    as long as the checkpoint stores :meth:`elapsed_s` read when it is written.
    """

    def __init__(
        self,
        budget: Budget,
        elapsed_s: float,
        step: int,
        epochs: Callable[[], float],
        window: float,
        count: int,
    ):
        self.budget, self.epochs = budget, epochs
        self.started = time.monotonic() - elapsed_s
        self.marks = averaging_marks(window, count)
        self.planned = len(self.marks)
        self.pass_marks(step)

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def minutes(self) -> float:
        return self.elapsed_s() / 60

    def fraction(self, step: int) -> float:
        """The share of the budget spent after ``step`` updates, now."""
        return self.budget.fraction(step, self.epochs(), self.minutes())

    def out_of_time(self) -> bool:
        return 0 < self.budget.max_minutes <= self.minutes()

    def finished(self, step: int) -> str:
        """Why the run has nothing left to train ("" = it has): checked before the first update, so that a
        finished run re-run does nothing."""
        return self.budget.exhausted(step, self.epochs(), self.minutes())

    def checkpoint_due(self, step: int) -> bool:
        """Whether the budget after update ``step`` reaches the next averaging mark."""
        return bool(self.marks) and self.fraction(step) >= self.marks[0]

    def keeps_validation(self, step: int) -> bool:
        """Whether a validation after update ``step`` writes ``step_N.pt``: until the first averaging mark
        is passed (always, without marks), so that a run stopped early (patience) keeps its last
        validations; and at the budget's end, the last mark, which a slow update may have passed
        already with the one before it."""
        return len(self.marks) == self.planned or bool(self.finished(step))

    def pass_marks(self, step: int) -> None:
        """Drop the marks that the budget after update ``step`` has reached."""
        fraction = self.fraction(step)
        self.marks = [m for m in self.marks if m > fraction]


def averaging_marks(window: float, count: int) -> list[float]:
    """Budget fractions at which a step checkpoint is written: ``count`` marks ending at 1.0."""
    if count <= 0 or window <= 0:
        return []
    return [round(1.0 - window + window * (i + 1) / count, 9) for i in range(count)]


TIME_BAR = "{l_bar}{bar}| {n:.0f}/{total:.0f} s [{remaining} left{postfix}]"


class BudgetBar:
    """A progress bar against the budget, with ETA: updates when there is a step limit, else minutes
    when there is a time limit, else (epochs only) a count of updates."""

    def __init__(self, budget: Budget, step: int, minutes: float, enabled: bool):
        self.by_steps = bool(budget.max_steps) or not budget.max_minutes
        if self.by_steps:
            total, unit = budget.max_steps or None, "step"
            initial = min(step, total) if total else step
        else:  # capped as in update(): a finished run's time may be past the total
            total, unit = budget.max_minutes * 60, "s"
            initial = min(minutes * 60, total)
        self.bar = tqdm(
            total=total,
            initial=initial,
            desc="train",
            unit=unit,
            disable=not enabled,
            file=sys.stderr,
            mininterval=refresh_interval(),
            dynamic_ncols=True,
            bar_format=None if self.by_steps else TIME_BAR,
        )

    def update(self, step: int, minutes: float) -> None:
        if self.by_steps:
            self.bar.update(step - self.bar.n)
        else:  # capped: past its total tqdm drops the total, which the time format cannot print
            self.bar.update(min(minutes * 60, self.bar.total) - self.bar.n)

    def set_postfix(self, values: dict[str, str], step: int) -> None:
        # drawn with the next update: a refresh here would redraw at every log line, whatever mininterval
        self.bar.set_postfix(values if self.by_steps else {"step": step, **values}, refresh=False)

    def close(self) -> None:
        self.bar.close()
