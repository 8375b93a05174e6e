"""What a command line starts besides one run: a sweep (``-m``, a sweeper), jobs on a launcher, ranks
under torchrun. Checked before Hydra starts (one line each), and set up for the jobs: their names
and the id of the launch they belong to."""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from nmt.errors import NMTError

LAUNCH_ID = "NMT_LAUNCH_ID"


def launch_id() -> str:
    """The id of the command that started this job: the jobs of one sweep launch share it."""
    return os.environ.get(LAUNCH_ID, "none")


def start_launch(args: Any, compose: Callable[[list[str]], DictConfig]) -> None:
    """What a command line that Hydra is about to run sets first: the job-name override of a sweep
    (among the overrides on ``sys.argv``: argparse takes them as one block, wherever the flags are) and
    the launch id that the jobs it starts inherit, whatever the launcher."""
    extra = job_name_overrides(args, compose)
    if extra:
        at = sys.argv.index(args.overrides[0])
        sys.argv[at:at] = extra
    os.environ[LAUNCH_ID] = uuid.uuid4().hex[:12]


def job_name_overrides(args: Any, compose: Callable[[list[str]], DictConfig]) -> list[str]:
    """Under a sweep, a job's folder is named by its overrides (``hydra.job.override_dirname``): by those
    the sweep varies only, not by those every job shares (the command's fixed ``key=value``), which would
    make long names alike but for one key. Returns the Hydra override that leaves the fixed ones out."""
    setting = "hydra.job.config.override_dirname.exclude_keys"
    if any(o.split("=", 1)[0] == setting for o in args.overrides):
        return []  # the user's own choice
    parsed = OverridesParser.create().parse_overrides(args.overrides)
    searching = any(o.key_or_group == "hparams_search" for o in parsed)
    if not (args.multirun or searching):
        return []
    fixed = [o.key_or_group for o in parsed if not o.is_sweep_override() and not o.is_hydra_override()]
    try:
        cfg = compose([o.input_line for o in parsed if not o.is_sweep_override()])
        excluded = list(cfg.hydra.job.config.override_dirname.exclude_keys)
    except Exception:  # Hydra says what is wrong when it composes
        return []
    keys = list(dict.fromkeys(excluded + fixed))
    return [f"{setting}=[{','.join(keys)}]"] if keys != excluded else []


def check_torchrun(overrides: list[str], multirun: bool) -> None:
    """Under torchrun every rank runs the script: each would run a sweep of its own, or resolve the
    default run dir's ``${now}`` itself (ranks a second apart would train into two folders)."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return
    if multirun:
        raise NMTError(
            "-m under torchrun: every rank would run the whole sweep; sweep with a launcher whose jobs "
            "have several tasks (hydra/launcher=submitit_slurm hydra.launcher.tasks_per_node=N)"
        )
    if not any(o.split("=", 1)[0] == "hydra.run.dir" for o in overrides):
        raise NMTError(
            "torchrun without hydra.run.dir: each rank would name its own run dir by the time it started; "
            "give hydra.run.dir=outputs/NAME"
        )


# Hydra plugins that are optional extras: (group, option) -> (their module, their package).
SUBMITIT = ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher")
PLUGINS = {
    ("hydra/launcher", "submitit_slurm"): SUBMITIT,
    ("hydra/launcher", "submitit_local"): SUBMITIT,
    ("hydra/sweeper", "optuna"): ("hydra_plugins.hydra_optuna_sweeper", "hydra-optuna-sweeper"),
}
EXTRAS = {"hydra-submitit-launcher": "cluster", "hydra-optuna-sweeper": "sweep"}


def check_sweep(overrides: list[str], multirun: bool, config_dir: Path) -> None:
    """Refuse, before Hydra starts, ``-m`` with ``hydra.run.dir`` (a sweep ignores it) and a launcher
    or sweeper whose package is not installed, naming it (Hydra would only say it finds no such config)."""
    keys = {o.split("=", 1)[0].lstrip("+~"): o.split("=", 1)[-1] for o in overrides if "=" in o}
    if (multirun or "hparams_search" in keys) and "hydra.run.dir" in keys:
        raise NMTError(
            f"hydra.run.dir={keys['hydra.run.dir']}: a sweep (-m, hparams_search) ignores it (each job goes "
            "to hydra.sweep.dir/hydra.sweep.subdir); give hydra.sweep.dir=... instead"
        )
    wanted = [(g, keys[g], f"{g}={keys[g]}") for g in ("hydra/launcher", "hydra/sweeper") if g in keys]
    search = keys.get("hparams_search")
    if search and (config_dir / "hparams_search" / f"{search}.yaml").is_file():
        defaults = OmegaConf.load(config_dir / "hparams_search" / f"{search}.yaml").get("defaults", [])
        for entry in defaults:
            for key, option in entry.items() if isinstance(entry, DictConfig) else []:
                wanted.append((key.removeprefix("override /"), option, f"hparams_search={search}"))
    for group, option, given in wanted:
        module, package = PLUGINS.get((group, option), (None, None))
        if module and importlib.util.find_spec(module) is None:
            raise NMTError(
                f"{given}: needs {package}, which is not installed: pip install -e '.[{EXTRAS[package]}]' "
                f"(or pip install {package})"
            )
