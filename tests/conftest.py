"""Fixtures shared by the unit and system tests."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from nmt.config import TrainConfig, register_configs

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def compose_train(*overrides: str) -> TrainConfig:
    """The typed training config that ``scripts/train.py <overrides>`` would get."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return OmegaConf.to_object(compose("train", overrides=list(overrides)))


@pytest.fixture
def compose_train_cfg():
    return compose_train
