"""Fixtures shared by the unit and system tests: composed configs as the scripts get them, one thread."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from nmt.benchmark import split_benchmark_config
from nmt.config import BenchConfig, TrainConfig, register_configs

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def compose_config(name: str, *overrides: str) -> DictConfig:
    """What ``scripts/<name>.py <overrides>`` composes (configs/<name>.yaml), untyped."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(name, overrides=list(overrides))


def compose_train(*overrides: str) -> TrainConfig:
    """The typed training config that ``scripts/train.py <overrides>`` gets."""
    return OmegaConf.to_object(compose_config("train", *overrides))


@pytest.fixture(scope="session")
def compose_cfg() -> Callable[..., DictConfig]:
    return compose_config


@pytest.fixture(scope="session")
def compose_train_cfg() -> Callable[..., TrainConfig]:
    return compose_train


@pytest.fixture(scope="session")
def compose_benchmark_cfg() -> Callable[..., tuple[TrainConfig, BenchConfig]]:
    """What scripts/benchmark.py gets: the training config and the ``bench`` section."""
    return lambda *overrides: split_benchmark_config(compose_config("benchmark", *overrides))


@pytest.fixture(scope="session")
def one_thread():
    """Tiny models: more threads only wait for each other on a busy machine (and runs compared bit for
    bit must use the same number of threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_benchmark_cfg(compose_benchmark_cfg) -> Callable[..., tuple[TrainConfig, BenchConfig]]:
    """scripts/benchmark.py on a toy corpus (data in ``cache_dir``) with a width-32 model: seconds."""
    return lambda cache_dir, *overrides: compose_benchmark_cfg(
        "experiment=toy",
        "data=toy",
        f"data.cache_dir={cache_dir}",
        "data.train_size=300",
        "data.test_size=12",
        "model.d_model=32",
        "model.ff_dim=64",
        "model.heads=2",
        *overrides,
    )
