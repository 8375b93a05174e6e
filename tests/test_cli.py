"""The scripts' shared front end: unknown keys refused at start, per-script ``--help``, entry points."""

import subprocess
import sys
from pathlib import Path

import pytest

from nmt import commands
from nmt.config import DecodingOverrides, ModelConfig, TrainerConfig, TranslateConfig, field_help
from nmt.errors import NMTError
from nmt.runs import cli
from nmt.runs.cli import _leaves, check_overrides, script_help

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.stem for p in (REPO / "scripts").glob("*.py"))
CONFIGS = {"prepare_data": "train"}  # the scripts whose config is not configs/<script>.yaml


@pytest.mark.parametrize("plus", ["", "+", "++"])
def test_an_unknown_key_is_refused_with_or_without_plus_naming_the_closest(plus):
    message = r"^trainer\.max_stepz: no such setting; did you mean trainer\.max_steps\?"
    with pytest.raises(NMTError, match=message):
        check_overrides("train", ["experiment=toy", f"{plus}trainer.max_stepz=5"])


@pytest.mark.parametrize("plus", ["", "+", "++"])
def test_a_key_of_an_unknown_section_is_refused_with_or_without_plus(plus):
    message = r"^trainr\.max_steps: no such setting; did you mean trainer\.max_steps\?"
    with pytest.raises(NMTError, match=message):
        check_overrides("train", ["experiment=toy", f"{plus}trainr.max_steps=5"])
    with pytest.raises(
        NMTError, match=r"^decoding\.beam\.size: no such setting; did you mean decoding\.beam_size\?"
    ):
        check_overrides("translate", ["checkpoint=a.pt", f"{plus}decoding.beam.size=1"])


@pytest.mark.parametrize(
    "config, override, closest",
    [
        ("translate", "+decoding.beam=3", "decoding.beam_size"),
        ("translate", "beam_size=3", "decoding.beam_size"),  # the right name in the wrong place
        ("evaluate", "+eval.bylength=true", "eval.by_length"),
        ("serve", "serve.max_tokenz=10", "serve.max_tokens"),
        ("score", "+formt=json", "format"),
        ("benchmark", "+bench.stepz=3", "bench.steps"),
        ("train", "data=local +data.dirr=x", "data.dir"),  # a key of the group option chosen
    ],
)
def test_every_script_refuses_unknown_keys(config, override, closest):
    *groups, key = override.split()
    with pytest.raises(NMTError, match=f"did you mean {closest}\\?"):
        check_overrides(config, [*groups, key])


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_scripts_known_keys_pass(script, compose_cfg):
    config = CONFIGS.get(script, script)
    keys = [key for key, _ in _leaves(compose_cfg(config))]
    check_overrides(config, [f"{key}=null" for key in keys[:3]] + ["hydra.run.dir=x"])


def test_a_key_of_another_group_option_names_the_options_that_have_it():
    with pytest.raises(
        NMTError, match=r"^data\.dir: not a setting of data=wmt14_de_en; data=local and data=multi30k have it"
    ):
        check_overrides("train", ["data.dir=x"])
    with pytest.raises(NMTError, match=r"^data\.vocab_words: not a setting of data=local; data=toy has it"):
        check_overrides("train", ["experiment=toy", "data=local", "+data.vocab_words=3"])


def test_an_unknown_group_option_names_the_closest_and_the_options():
    with pytest.raises(
        NMTError,
        match=r"^data=lcoal: no such option; did you mean data=local\? \(data: hf, iwslt2017, local,",
    ):
        check_overrides("train", ["data=lcoal"])
    check_overrides("train", ["experiment=null", "data=local"])


def test_a_sweep_over_group_options_leaves_the_keys_to_each_job():
    check_overrides("train", ["data=toy,local", "data.vocab_words=3"])  # -m: the toy jobs have it
    with pytest.raises(NMTError, match=r"^trainer\.max_stepz: no such setting"):
        check_overrides("train", ["trainer.max_steps=1,2", "trainer.max_stepz=1,2"])


def test_a_key_under_a_null_section_asks_for_the_section():
    with pytest.raises(NMTError, match=r"data\.src_lang: data is null here; choose one first \(data=hf\|"):
        check_overrides("distill", ["teacher=a.pt", "data.src_lang=de"])
    check_overrides("distill", ["teacher=a.pt", "data=local", "data.src_lang=de"])


def run_script(cwd: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    """``python scripts/<script>.py <args>`` run from ``cwd``, with a line on its standard input."""
    return subprocess.run(
        [sys.executable, str(REPO / f"scripts/{script}.py"), *args],
        cwd=cwd,
        input="a b c\n",
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_translate_refuses_a_typo_before_the_model_loads(tmp_path):
    """The checkpoint does not exist: an error about it would mean the typo got past the start."""
    result = run_script(tmp_path, "translate", "checkpoint=missing.pt", "+decoding.beam=3")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: decoding.beam: no such setting; did you mean decoding.beam_size? (--help lists them)"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("script", "args", "message"),
    [
        (
            "translate",
            ["checkpoint=missing.pt", "backend=ct"],
            "backend=ct: must be one of torch, ct2; did you mean ct2?",
        ),
        ("translate", ["checkpoint=missing.pt", "decoding.beam_size=0"], "decoding.beam_size=0: must be > 0"),
        (
            "translate",
            ["checkpoint=missing.pt", "device=gpu"],
            "device=gpu: must be auto, cpu, cuda, cuda:N (the GPU of index N) or mps",
        ),
        (
            "train",
            ["experiment=toy", "trainer.device=gpu"],
            "trainer.device=gpu: must be auto, cpu, cuda, cuda:N (the GPU of index N) or mps",
        ),
        (
            "translate",
            ["checkpoint=null"],
            "checkpoint=null: a required setting; give a value (checkpoint=...)",
        ),
        (
            "evaluate",
            ["checkpoint=null"],
            "checkpoint=null: a required setting; give a value (checkpoint=...)",
        ),
        ("score", ["checkpoint=null"], "checkpoint=null: a required setting; give a value (checkpoint=...)"),
        ("serve", ["checkpoint=null"], "checkpoint=null: a required setting; give a value (checkpoint=...)"),
        ("distill", ["teacher=null"], "teacher=null: a required setting; give a value (teacher=...)"),
        (
            "translate",
            ["checkpoint=missing.pt", "input=${oc.env:NMT_TEST_UNSET}/x"],
            "input: cannot resolve its interpolation (KeyError raised while resolving interpolation: "
            "\"Environment variable 'NMT_TEST_UNSET' not found\")",
        ),
        (
            "translate",
            ["checkpoint=${nokey}"],
            "checkpoint: cannot resolve its interpolation (Interpolation key 'nokey' not found)",
        ),
        ("average_checkpoints", ["run_dir=missing", "last=0"], "last=0: must be > 0"),
        ("average_checkpoints", ["run_dir=missing", "last=-1"], "last=-1: must be > 0"),
        (
            "serve",
            ["checkpoint=missing.pt", "host="],
            "host=: must name an address: 127.0.0.1 (this machine) or 0.0.0.0 (every one)",
        ),
        (
            "benchmark",
            ["experiment=toy", "bench.precisions=[fp32,bf61]"],
            "bench.precisions=['fp32', 'bf61']: must each be one of auto, fp32, bf16, fp16; "
            "did you mean bf16?",
        ),
    ],
)
def test_every_script_refuses_a_bad_value_before_any_work_in_one_line(tmp_path, script, args, message):
    """The checkpoint does not exist, the toy corpus is not prepared: the setting's error comes first."""
    result = run_script(tmp_path, script, *args, f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [f"error: {message}"]
    assert not (tmp_path / "data").exists() and not (tmp_path / "run" / "checkpoints").exists()


def test_a_settings_help_line_is_its_knobs_help_then_its_choices_or_rule():
    trainer = field_help(TrainerConfig)
    assert trainer["max_steps"].startswith("optimizer updates; 0 = no limit")
    assert trainer["precision"].startswith("auto = bf16")
    assert trainer["precision"].endswith("; one of: auto, fp32, bf16, fp16")  # the knob's choices
    assert field_help(ModelConfig)["dropout"] == "must be in [0, 1)"  # a rule and no help
    assert "compile" not in trainer  # no help, no rule: no description
    assert field_help(TranslateConfig)["checkpoint"].startswith("a path, or a list of paths")  # inherited
    assert field_help(DecodingOverrides)["alpha"].startswith("GNMT length penalty")  # DecodingConfig's


def test_help_lists_only_the_scripts_own_keys_with_their_descriptions():
    text = script_help("translate", [], "Translate text.")
    assert text.startswith("Translate text.")
    assert "  decoding.alpha: null  # null = the checkpoint's; GNMT length penalty" in text
    assert "  input: null  # file; default stdin" in text
    assert "  checkpoint: ???  # a path" in text
    keys = [line.split(":")[0].strip() for line in text.splitlines() if line.startswith("  ")]
    assert "decoding.beam_size" in keys and "workers" in keys
    assert not [
        key for key in keys if key.split(".")[0] in ("trainer", "model", "optim", "tokenizer", "hydra")
    ]
    assert "_schema" not in text and "groups" not in text


def test_train_help_lists_the_groups_and_the_chosen_options_keys():
    text = script_help("train", ["experiment=toy", "data=local"], None)
    groups = (
        "hf, iwslt2017, local, multi30k, multi30k_many, multi30k_multi, opus100, toy, toy_multi, wmt14, "
        "wmt14_de_en, wmt16"
    )
    assert f"  data: {groups} (now: local)" in text
    assert "  data.dir: ???" in text
    assert "  trainer.max_steps: 1000  # optimizer updates; 0 = no limit" in text
    assert "data.vocab_words" not in text  # a toy data key: not in data=local


def test_help_flag_prints_the_help_and_exits_0(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts/score.py"), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Score translations with a checkpoint")
    assert "  per_token: false  # also each subword's log-probability (EOS last)" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_an_entry_point_per_script_a_user_runs():
    text = (REPO / "pyproject.toml").read_text()
    for script in SCRIPTS:
        command = f'nmt-{script.replace("_", "-")} = "nmt.commands:{script}"'
        assert command in text
        assert callable(getattr(commands, script))


def test_an_entry_point_runs_its_script(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["nmt-translate", "checkpoint=missing.pt", "+decoding.beam=3"])
    with pytest.raises(SystemExit) as exit_:
        commands.translate()
    assert exit_.value.code == 1
    assert "did you mean decoding.beam_size?" in capsys.readouterr().err


@pytest.mark.parametrize("help_flag", [[], ["--help"]])
def test_an_override_that_does_not_parse_is_one_line_with_or_without_help(
    tmp_path, monkeypatch, capsys, help_flag
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["nmt-train", *help_flag, "data.dir=[a"])
    with pytest.raises(SystemExit) as exit_:
        commands.train()
    assert exit_.value.code == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    why = "no viable alternative at input '[a'"
    assert lines[0].startswith(f"error: data.dir=[a: cannot parse it ({why}); See ")
    assert list(tmp_path.iterdir()) == []


def test_without_configs_the_check_and_the_help_say_so_in_one_line(tmp_path, monkeypatch):
    """Hydra's own errors are set aside by the override check and rewrapped by --help; ours are not."""
    monkeypatch.setattr(cli, "CONFIG_DIR", tmp_path / "configs")
    message = rf"^no configs at {tmp_path / 'configs'}: the commands need the source tree"
    with pytest.raises(NMTError, match=message):
        check_overrides("train", ["trainer.max_steps=5"])
    with pytest.raises(NMTError, match=message):
        script_help("train", [], None)
