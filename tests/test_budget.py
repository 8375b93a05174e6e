"""Every run has a budget; step checkpoints for averaging are spread over the end of it."""

from __future__ import annotations

import pytest
import torch
import tqdm.std

from nmt.config import DefaultBudgetConfig, TrainerConfig
from nmt.training.budget import Budget, BudgetBar, averaging_marks


def test_a_run_without_stopping_rule_gets_the_default_budget_of_its_device():
    cfg = TrainerConfig(default_budget=DefaultBudgetConfig(cpu_minutes=60, gpu_steps=50_000))
    cpu = Budget.from_config(cfg, torch.device("cpu"))
    assert (cpu.max_minutes, cpu.max_steps, cpu.max_epochs) == (60, 0, 0)
    assert "60 minutes" in cpu.describe() and "default_budget.cpu_minutes" in cpu.describe()
    gpu = Budget.from_config(cfg, torch.device("cuda"))
    assert (gpu.max_minutes, gpu.max_steps) == (0, 50_000)


@pytest.mark.parametrize("rule", ["max_steps", "max_epochs", "max_minutes"])
def test_any_stopping_rule_replaces_the_default(rule):
    budget = Budget.from_config(TrainerConfig(**{rule: 7}), torch.device("cpu"))
    assert getattr(budget, rule) == 7 and budget.source.startswith("trainer.max_steps")
    assert sum(bool(getattr(budget, r)) for r in ("max_steps", "max_epochs", "max_minutes")) == 1


def test_fraction_is_the_most_advanced_limit():
    budget = Budget(max_steps=1000, max_minutes=10)
    assert budget.fraction(step=100, epochs=0.3, minutes=5) == 0.5
    assert budget.fraction(step=900, epochs=0.3, minutes=5) == 0.9
    assert Budget(max_epochs=4).fraction(step=0, epochs=1.0, minutes=99) == 0.25


def test_averaging_marks_spread_over_the_window_and_end_the_run():
    assert averaging_marks(0.2, 5) == pytest.approx([0.84, 0.88, 0.92, 0.96, 1.0])
    assert averaging_marks(1.0, 2) == pytest.approx([0.5, 1.0])
    assert averaging_marks(0.2, 0) == []


@pytest.mark.parametrize(
    "budget",
    [Budget(max_steps=10), Budget(max_minutes=1.5), Budget(max_epochs=2)],
    ids=["steps", "minutes", "epochs"],
)
def test_the_progress_bar_follows_any_budget(budget, capsys):
    bar = BudgetBar(budget, step=0, minutes=0.0, enabled=True)
    for step in range(1, 4):
        bar.update(step, minutes=step / 60)
        bar.set_postfix({"loss": "1.0"}, step)
    bar.close()
    shown = capsys.readouterr().err
    assert "train" in shown and ("left" in shown) == (budget.max_minutes > 0 and not budget.max_steps)


def test_the_time_bar_survives_the_last_step_running_past_the_budget(capsys):
    """The step that crosses max_minutes ends after it: the bar must still draw and close."""
    bar = BudgetBar(Budget(max_minutes=1.0), step=0, minutes=0.0, enabled=True)
    bar.update(100, minutes=0.5)
    bar.update(201, minutes=1.02)
    bar.set_postfix({"loss": "1.0"}, 201)
    bar.close()
    assert "60/60 s" in capsys.readouterr().err


def test_a_redirected_bar_stays_terse(monkeypatch, capsys):
    """stderr a file (nohup, a log): 1,000 updates of a second each redraw the bar about once a minute,
    not at each update."""
    now = [0.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: now[0])
    bar = BudgetBar(Budget(max_steps=1000), step=0, minutes=0.0, enabled=True)
    for step in range(1, 1001):
        now[0] += 1.0
        bar.update(step, minutes=now[0] / 60)
        bar.set_postfix({"loss": "1.0"}, step)
    bar.close()
    shown = capsys.readouterr().err
    assert "1000/1000" in shown
    assert shown.count("\r") < 30, f"{shown.count(chr(13))} redraws"
