"""Learning-rate schedules: linear warmup to optim.lr, then inverse square root decay, constant or linear,
with an optional cool-down to zero at the end of the budget."""

import math

import pytest

from nmt.config import OptimConfig, check_values
from nmt.errors import NMTError
from nmt.training.schedule import learning_rate

CFG = OptimConfig(lr=1e-3, warmup_steps=400, schedule="inverse_sqrt")


def test_warmup_is_linear_and_peaks_at_lr_at_warmup_steps():
    lrs = [learning_rate(step, CFG) for step in range(1, 2001)]
    assert max(lrs) == pytest.approx(CFG.lr) and lrs.index(max(lrs)) + 1 == CFG.warmup_steps
    for step in (1, 100, 399):
        assert learning_rate(step, CFG) == pytest.approx(CFG.lr * step / CFG.warmup_steps)
    assert all(a < b for a, b in zip(lrs[:399], lrs[1:400]))  # rising during warmup
    assert all(a > b for a, b in zip(lrs[399:], lrs[400:]))  # falling afterwards


@pytest.mark.parametrize("step", [400, 800, 1600, 10_000, 1_000_000])
def test_inverse_sqrt_decay(step):
    assert learning_rate(step, CFG) == pytest.approx(CFG.lr * math.sqrt(CFG.warmup_steps / step))
    assert learning_rate(4 * step, CFG) == pytest.approx(learning_rate(step, CFG) / 2)


def test_inverse_sqrt_is_the_paper_schedule_rescaled():
    """Vaswani et al.: d^-0.5 * min(step^-0.5, step * warmup^-1.5), here scaled so its peak is optim.lr."""
    d_model, warmup = 512, CFG.warmup_steps

    def paper(step: int) -> float:
        return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)

    scale = CFG.lr / paper(warmup)
    for step in (1, 50, 399, 400, 401, 3000, 50_000):
        assert learning_rate(step, CFG) == pytest.approx(scale * paper(step))


def test_constant_schedule_and_no_warmup():
    constant = OptimConfig(lr=5e-4, warmup_steps=100, schedule="constant")
    assert learning_rate(50, constant) == pytest.approx(2.5e-4)
    assert {learning_rate(step, constant) for step in (100, 101, 10_000)} == {5e-4}
    no_warmup = OptimConfig(lr=5e-4, warmup_steps=0, schedule="inverse_sqrt")
    assert learning_rate(1, no_warmup) == pytest.approx(5e-4)
    assert learning_rate(4, no_warmup) == pytest.approx(2.5e-4)


def test_linear_schedule_ramps_up_then_falls_to_zero_at_the_end_of_the_budget():
    linear = OptimConfig(lr=1e-3, warmup_steps=100, schedule="linear")
    assert learning_rate(50, linear, spent=0.01) == pytest.approx(0.5e-3 * 0.99)
    assert learning_rate(100, linear, spent=0.02) == pytest.approx(1e-3 * 0.98)
    assert learning_rate(5000, linear, spent=0.75) == pytest.approx(0.25e-3)
    assert learning_rate(9999, linear, spent=1.0) == 0.0 == learning_rate(9999, linear, spent=1.2)
    steps = range(1, 1001)  # a 1000-step budget: spent before update s is (s - 1) / 1000
    lrs = [learning_rate(s, linear, spent=(s - 1) / 1000) for s in steps]
    assert max(abs(a - b) for a, b in zip(lrs, lrs[1:])) < 1.1e-5  # continuous: no jump after warmup
    no_warmup = OptimConfig(lr=1e-3, warmup_steps=0, schedule="linear")
    assert learning_rate(1, no_warmup, spent=0.0) == pytest.approx(1e-3)


def test_unknown_schedule_is_refused_with_the_settings_not_at_a_step():
    """Checked with every setting at start (a typo must not wait for the end of warmup)."""
    refused = r"^optim\.schedule=cosine: must be one of inverse_sqrt, constant, linear"
    with pytest.raises(NMTError, match=refused):
        check_values(OptimConfig(schedule="cosine", warmup_steps=4000), "optim.")


@pytest.mark.parametrize("schedule", ["inverse_sqrt", "constant"])
def test_cooldown_leaves_the_schedule_alone_then_falls_linearly_to_zero_at_the_budgets_end(schedule):
    plain = OptimConfig(lr=1e-3, warmup_steps=100, schedule=schedule)
    cooled = OptimConfig(lr=1e-3, warmup_steps=100, schedule=schedule, cooldown=0.2)
    for step, spent in ((50, 0.01), (100, 0.02), (3000, 0.5), (4000, 0.8)):
        assert learning_rate(step, cooled, spent) == pytest.approx(learning_rate(step, plain, spent))
    assert learning_rate(4500, cooled, 0.9) == pytest.approx(learning_rate(4500, plain, 0.9) / 2)
    assert learning_rate(4750, cooled, 0.95) == pytest.approx(learning_rate(4750, plain, 0.95) / 4)
    assert learning_rate(5000, cooled, 1.0) == 0.0 == learning_rate(5100, cooled, 1.02)
    budget = 5000  # continuous where the cool-down starts: no jump
    lrs = [learning_rate(s, cooled, (s - 1) / budget) for s in range(3900, 4100)]
    assert max(abs(a - b) for a, b in zip(lrs, lrs[1:])) < 1e-5


def test_cooldown_outside_zero_to_one_is_refused_at_start():
    with pytest.raises(NMTError, match=r"^optim\.cooldown=1\.0: must be in \[0, 1\)"):
        check_values(OptimConfig(cooldown=1.0), "optim.")
