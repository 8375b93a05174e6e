"""Config composition: typos and wrong types fail at composition time, naming the key."""

import pickle
import re
import typing
from dataclasses import dataclass, fields, replace
from pathlib import Path

import pytest
from helpers import knob_rules
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from nmt import config
from nmt.config import (
    NON_NEGATIVE,
    DecodingConfig,
    DecodingOverrides,
    check_decoding,
    check_train_config,
    check_values,
    choices_of,
    keyed_by_choices,
    knob,
    overrides_of,
)
from nmt.devices import DTYPES
from nmt.errors import NMTError
from nmt.inference.translator import merge_decoding
from nmt.runs.cli import _missing_keys
from nmt.training.setup import OPTIMIZERS, set_up
from nmt.training.validation import is_better

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_typo_in_override_names_the_key(compose_cfg):
    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg("train", "trainer.max_stepz=5")
    assert "trainer.max_stepz" in str(e.value)
    assert "Key 'max_stepz' not in 'TrainerConfig'" in str(e.value.__cause__)


def test_ill_typed_override_fails(compose_cfg):
    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg("train", "trainer.max_steps=abc")
    assert "trainer.max_steps=abc" in str(e.value)
    assert "'abc'" in str(e.value.__cause__) and "Integer" in str(e.value.__cause__)


def test_local_data_name_is_the_folder_name(compose_cfg):
    cfg = compose_cfg("train", "data=local", "data.dir=../shared/data/multi30k-de-en/")
    assert cfg.data.source == "local" and cfg.data.name == "multi30k-de-en"


def test_toy_experiment_selects_toy_data_and_a_small_vocabulary(compose_cfg):
    cfg = compose_cfg("train", "experiment=toy")
    assert cfg.data.source == "toy" and cfg.data.src_lang == "src"
    assert cfg.tokenizer.vocab_size <= 300


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.valid_every=0", "trainer.valid_every=0: must be > 0"),
        ("trainer.log_every=-5", "trainer.log_every=-5: must be > 0"),
        ("trainer.max_tokens=0", "trainer.max_tokens=0: must be > 0"),
        ("trainer.best_metric=BLEU", "trainer.best_metric=BLEU: must be one of bleu, chrf, loss, ppl"),
        ("trainer.precision=fp64", "trainer.precision=fp64: must be one of auto"),
        ("trainer.average_window=0", "trainer.average_window=0.0: must be in (0, 1]"),
        ("decoding.beam_size=0", "decoding.beam_size=0: must be > 0"),
        ("decoding.nbest=6", "decoding.nbest=6 exceeds decoding.beam_size=5"),
        ("decoding.no_repeat_ngram=-1", "decoding.no_repeat_ngram=-1: must be >= 0"),
        ("decoding.max_len_a=-0.5", "decoding.max_len_a=-0.5: must be >= 0"),
        ("final.alphas=[0.6,-1.0]", "final.alphas=[0.6, -1.0]: must each be >= 0"),
        ("optim.label_smoothing=1.0", "optim.label_smoothing=1.0: must be in [0, 1)"),
        ("model.dropout=-0.1", "model.dropout=-0.1: must be in [0, 1)"),
        ("model.heads=0", "model.heads=0: must be > 0"),
        ("optim.betas=[0.9]", "optim.betas=[0.9]: must be two numbers in [0, 1)"),
        ("optim.eps=-1", "optim.eps=-1.0: must be >= 0"),
        ("optim.rdrop_alpha=-1", "optim.rdrop_alpha=-1.0: must be >= 0"),
        ("optim.rdrop_alpha=1 model.dropout=0", "optim.rdrop_alpha=1 compares two dropout passes, but"),
        ("model.kv_heads=3", "model.heads=4 must be a multiple of model.kv_heads=3"),
        ("model.d_model=98", "model.d_model=98 is not divisible by model.heads=4"),
        ("model.positional=rotary", "model.positional=rotary: must be one of sinusoidal, learned, rope"),
        ("model.cross_attention=luong", "model.cross_attention=luong: must be one of dot_product, additive"),
        ("model.positional=rope model.d_model=36", "model.positional=rope needs model.rope_base > 0"),
        ("model.positional=rope model.self_attention=additive", "model.positional=rope rotates"),
        # SentencePiece's own refusals, which would come only after the corpus is prepared
        ("tokenizer.character_coverage=1.5", "tokenizer.character_coverage=1.5: must be in (0, 1]"),
        ("data.clean.max_words=0", "data.clean.max_words=0: must be > 0"),
        ("data.vocab_words=0", "data.vocab_words=0: must be > 0"),
        ("trainer.device=gpu", "trainer.device=gpu: must be auto, cpu, cuda, cuda:N"),
    ],
)
def test_values_that_cannot_work_are_refused_naming_the_key(override, message, compose_cfg):
    cfg = OmegaConf.to_object(compose_cfg("train", "experiment=toy", "model.heads=4", *override.split()))
    with pytest.raises(NMTError) as e:
        check_train_config(cfg)
    assert str(e.value).startswith(message)


@pytest.mark.parametrize("override", ["model.heads=0", "model.kv_heads=3", "optim.betas=[0.9]"])
def test_model_and_optimizer_values_are_refused_before_any_data_is_read(
    override, compose_train_cfg, tmp_path
):
    """The data source does not exist: the settings' error comes first, before any data or model."""
    cfg = compose_train_cfg(
        "data=local", f"data.dir={tmp_path / 'missing'}", "model.heads=4", override, "trainer.device=cpu"
    )
    with pytest.raises(NMTError, match=override.split("=")[0].replace(".", r"\.")):
        set_up(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_registry_that_differs_from_its_settings_choices_fails_where_it_is_defined():
    """A kind added to an implementation registry without its choice beside the setting, or a choice
    without its implementation, fails at import of the registry's module, naming both lists."""
    with pytest.raises(TypeError, match="OptimConfig.schedule offers inverse_sqrt, constant, linear, its"):
        keyed_by_choices(config.OptimConfig, "schedule", {"inverse_sqrt": 0, "constant": 0})
    with pytest.raises(TypeError, match="holds fp32, bf16, fp16, fp8"):
        keyed_by_choices(config.TrainerConfig, "precision", {**DTYPES, "fp8": 0}, besides=("auto",))
    assert keyed_by_choices(config.OptimConfig, "name", OPTIMIZERS) is OPTIMIZERS


@pytest.mark.parametrize(
    "override",
    [
        "data.source=locl",
        "optim.schedule=inverse_sqr",
        "optim.name=adamm",
        "model.arch=transfomer",
        "model.positional=learnd",
        "model.self_attention=addittive",
        "trainer.precision=bf61",
        "trainer.best_metric=chrF",
        "tokenizer.model_type=unigramm",
    ],
)
def test_a_bad_choice_fails_before_any_data_in_the_one_format(override, compose_train_cfg, tmp_path):
    """The data source does not exist: the setting's error comes first, naming it, its choices and the
    closest one."""
    cfg = compose_train_cfg("data=local", f"data.dir={tmp_path / 'missing'}", override, "trainer.device=cpu")
    key, value = override.split("=")
    with pytest.raises(NMTError) as e:
        set_up(cfg, tmp_path / "run")
    section, name = key.split(".")
    schema = {"data": config.DataConfig, "model": config.TransformerConfig, "optim": config.OptimConfig}
    schema |= {"trainer": config.TrainerConfig, "tokenizer": config.TokenizerConfig}
    choices = choices_of(schema[section], name)
    assert str(e.value).startswith(f"{key}={value}: must be one of {', '.join(choices)}")
    assert re.search(r"; did you mean \w+\?$", str(e.value))
    assert not (tmp_path / "run").exists()


def test_an_architecture_other_than_the_models_is_refused():
    with pytest.raises(NMTError, match=r"^model\.arch=rnnsearch: must be transformer here"):
        check_values(config.TransformerConfig(arch="rnnsearch"), "model.")


def test_every_scripts_defaults_pass_the_checks(compose_cfg):
    """What every script checks at start (nmt.runs.cli.run_cli) holds for its defaults, required keys
    given."""
    for name in sorted(p.stem for p in CONFIGS.glob("*.yaml")):
        extra = ["experiment=toy"] if name in ("train", "benchmark") else []
        missing = list(_missing_keys(OmegaConf.to_container(compose_cfg(name, *extra), resolve=False)))
        check_values(OmegaConf.to_object(compose_cfg(name, *extra, *[f"{key}=x" for key in missing])))


def test_every_preset_passes_the_checks(compose_cfg):
    for preset in sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml")):
        check_train_config(OmegaConf.to_object(compose_cfg("train", f"experiment={preset}")))


@pytest.mark.parametrize(
    ("metric", "better", "worse"), [("bleu", 30, 20), ("chrf", 60, 50), ("loss", 2.0, 3.0), ("ppl", 8, 20)]
)
def test_best_checkpoint_follows_the_metric_direction(metric, better, worse):
    assert is_better(better, worse, metric) and not is_better(worse, better, metric)
    assert is_better(worse, None, metric)


def test_decoding_overrides_mirror_the_decoding_config():
    """evaluate/translate/plot_attention can override every decoding setting, and only those."""
    assert [f.name for f in fields(DecodingOverrides)] == [f.name for f in fields(DecodingConfig)]
    assert all(getattr(DecodingOverrides(), f.name) is None for f in fields(DecodingOverrides))


def test_decoding_overrides_are_the_decoding_options_made_optional():
    options, overrides = typing.get_type_hints(DecodingConfig), typing.get_type_hints(DecodingOverrides)
    assert overrides == {name: kind | None for name, kind in options.items()}


def test_decoding_overrides_pickle_as_the_decoding_workers_get_them():
    """The class is made by overrides_of: pickle must find it under the module that binds its name."""
    overrides = DecodingOverrides(alpha=0.5, nbest=2)
    assert pickle.loads(pickle.dumps(overrides)) == overrides


def test_a_new_decoding_option_is_one_field_with_its_rule():
    """Declared once, an option is overridable with the scripts' ``decoding.*`` and checked by its rule."""

    @dataclass
    class WithTopK(DecodingConfig):
        top_k: int = knob(0, NON_NEGATIVE)

    assert typing.get_type_hints(overrides_of(WithTopK, "O", ""))["top_k"] == int | None
    assert knob_rules(WithTopK) == {**knob_rules(DecodingConfig), "top_k": NON_NEGATIVE}


@pytest.mark.parametrize("name", sorted(knob_rules(DecodingConfig)))
def test_every_decoding_rule_refuses_a_value_naming_the_key(name):
    ok, what = knob_rules(DecodingConfig)[name]
    bad = next(v for v in (-1, 0) if not ok(v))
    with pytest.raises(NMTError, match=rf"^decoding\.{name}={bad}: {re.escape(what)}$"):
        check_decoding(replace(DecodingConfig(), **{name: bad}))


def test_only_the_given_decoding_overrides_replace_the_checkpoints_settings():
    tuned = DecodingConfig(beam_size=5, alpha=2.0, max_len_b=7)
    merged = merge_decoding(tuned, DecodingOverrides(alpha=0.6, no_unk=False))
    assert merged == DecodingConfig(beam_size=5, alpha=0.6, max_len_b=7, no_unk=False)
    assert merge_decoding(tuned, DecodingOverrides()) == tuned


def test_evaluate_config_types_its_decoding_overrides(compose_cfg):
    overrides = [
        "checkpoint=x.pt",
        "decoding.alpha=1.5",
        "decoding.no_repeat_ngram=3",
        "decoding.word_reward=-0.5",
    ]
    cfg = OmegaConf.to_object(compose_cfg("evaluate", *overrides))
    assert cfg.decoding == DecodingOverrides(alpha=1.5, no_repeat_ngram=3, word_reward=-0.5)
    with pytest.raises(ConfigCompositionException):
        compose_cfg("evaluate", "checkpoint=x.pt", "decoding.beam_sise=3")


EVALUATE_ONLY = ["workers=2", "prefix_file=p.txt", "alignments=true", "eval.metrics=[ter]"]


@pytest.mark.parametrize(
    ("script", "key"),
    [
        (script, key)
        for script in ("benchmark_decoders", "benchmark_ct2", "benchmark_server", "score")
        for key in EVALUATE_ONLY
        if (script, key) != ("score", "alignments=true")  # score.py's own: each pair's alignment
    ],
)
def test_scripts_that_decode_a_split_refuse_what_only_evaluate_does(compose_cfg, script, key):
    """The benchmarks and score.py read a split (or eval.src/eval.ref) but do not decode it as
    evaluate.py does: its decoding processes, prefixes, alignment files and metrics are refused at start
    rather than ignored."""
    compose_cfg(script, "checkpoint=x.pt", "data.split=valid", "eval.src=a.en", "eval.ref=a.de")
    with pytest.raises(ConfigCompositionException, match=key.split("=")[0]):
        compose_cfg(script, "checkpoint=x.pt", key)


def test_the_hosts_the_service_answers(compose_cfg):
    """serve.allowed_hosts as Starlette's TrustedHostMiddleware matches them (a port never matches), and
    its default: the bound address and the names of localhost."""
    cfg = OmegaConf.to_object(compose_cfg("serve", "checkpoint=x.pt", "serve.allowed_hosts=[mt.example.com]"))
    check_values(cfg)
    for bad in ("mt.example.com:8000", "*example.com", "a.*.com", "", " x"):
        cfg.serve.allowed_hosts = ["localhost", bad]
        with pytest.raises(NMTError, match=r"^serve.allowed_hosts=.*: must be host names without ports"):
            check_values(cfg)
    for good in (["*"], ["*.example.com", "[::1]", "10.0.0.5"]):
        cfg.serve.allowed_hosts = good
        check_values(cfg)
    pytest.importorskip("fastapi")
    from nmt.serve import trusted_hosts

    assert trusted_hosts([], "127.0.0.1") == ["127.0.0.1", "localhost", "[::1]"]
    assert trusted_hosts([], "10.0.0.5") == ["10.0.0.5", "localhost", "127.0.0.1", "[::1]"]
    assert trusted_hosts([], "::1") == ["[::1]", "localhost", "127.0.0.1"]
    assert trusted_hosts(["*"], "0.0.0.0") == ["*"]
    assert trusted_hosts([], "0.0.0.0")[:3] == ["localhost", "127.0.0.1", "[::1]"]
