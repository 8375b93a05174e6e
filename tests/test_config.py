"""Config composition: typos and wrong types fail at composition time, naming the key."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from nmt.config import register_configs

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def compose_train(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def test_typo_in_override_names_the_key():
    with pytest.raises(ConfigCompositionException) as e:
        compose_train("trainer.max_stepz=5")
    assert "trainer.max_stepz" in str(e.value)
    assert "Key 'max_stepz' not in 'TrainerConfig'" in str(e.value.__cause__)


def test_ill_typed_override_fails():
    with pytest.raises(ConfigCompositionException) as e:
        compose_train("trainer.max_steps=abc")
    assert "trainer.max_steps=abc" in str(e.value)
    assert "'abc'" in str(e.value.__cause__) and "Integer" in str(e.value.__cause__)


def test_local_data_name_is_the_folder_name():
    cfg = compose_train("data=local", "data.dir=../shared/data/multi30k-de-en/")
    assert cfg.data.source == "local" and cfg.data.name == "multi30k-de-en"


def test_toy_experiment_selects_toy_data_and_a_small_vocabulary():
    cfg = compose_train("experiment=toy")
    assert cfg.data.source == "toy" and cfg.data.src_lang == "src"
    assert cfg.tokenizer.vocab_size <= 300
