"""What every command-line script shares: its config (``configs/<name>.yaml``) composed by Hydra, checked
before Hydra runs (unknown keys, with or without ``+``), a ``--help`` of its own keys, and user errors as
one line on stderr with exit status 1. A script looks like this::

    @script_main("train")
    def main(cfg: DictConfig) -> None: ...
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import hydra
from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from nmt.config import check_values, field_help, register_configs
from nmt.errors import NMTError, hide_credentials
from nmt.runs.launching import check_sweep, check_torchrun, start_launch

# The configs live beside src/ in the source tree (an editable install, as scripts/setup.sh makes, or
# PYTHONPATH=src); a wheel installed without the source tree has no configs.
CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs"

T = TypeVar("T")


def script_main(config_name: str) -> Callable[[Callable[[DictConfig], None]], Callable[[], None]]:
    """``hydra.main`` of ``configs/<config_name>.yaml`` for a script's ``main(cfg)``: ``--help`` lists the
    script's own keys with their descriptions; an unknown key fails in one line naming the closest real
    one before Hydra starts; ``main`` runs inside ``run_cli``."""

    def decorate(fn: Callable[[DictConfig], None]) -> Callable[[], None]:
        task = hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name=config_name)(
            run_cli(fn)
        )

        @functools.wraps(fn)
        def main() -> None:
            args = get_args_parser().parse_args()  # Hydra's own command line, so its flags all work
            name = args.config_name or config_name
            try:
                refuse_credentials(args.overrides)
                check_sweep(args.overrides, args.multirun, CONFIG_DIR)
                if name in ("train", "pipeline"):
                    check_torchrun(args.overrides, args.multirun)
                if args.help:
                    check_overrides(name, args.overrides)
                    with quiet_broken_pipe():
                        print(script_help(name, args.overrides, sys.modules[fn.__module__].__doc__))
                    sys.exit(0)
                if not (args.config_path or args.config_dir):  # configs of the user's: Hydra checks them
                    check_overrides(name, args.overrides)
            except NMTError as e:
                print(f"error: {hide_credentials(str(e))}", file=sys.stderr)
                sys.exit(1)
            start_launch(args, lambda groups: _compose(name, [g for g in groups if _is_group_line(g)]))
            task()

        return main

    return decorate


# The exit status of a process that SIGPIPE ended, as a shell reports it (`yes | head -1`).
BROKEN_PIPE_STATUS = 128 + signal.SIGPIPE


@contextlib.contextmanager
def quiet_broken_pipe() -> Iterator[None]:
    """End quietly, as Unix tools do, when the reader of stdout has gone (``translate.py | head -1``):
    no traceback, the rest of stdout (Python flushes it at exit) thrown away, status 141."""
    try:
        yield
        sys.stdout.flush()  # here, not at exit, where Python would report the broken pipe itself
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the flush at exit must not fail again
        sys.exit(BROKEN_PIPE_STATUS)


def refuse_credentials(overrides: list[str]) -> None:
    """Refuse an override holding a URL with credentials (``data.url=https://user:token@host/``) before
    Hydra starts: the run would show them in its log and keep them in ``.hydra/`` and every checkpoint.
    The message shows the URL masked."""
    for override in overrides:
        if hide_credentials(override) != override:
            raise NMTError(
                f"{hide_credentials(override)}: a URL with credentials, refused before anything is written "
                "(they would be kept in the run's log, .hydra/ and checkpoints); use a mirror that needs "
                "none, or fetch the files yourself into a folder and give its path (data.url=/that/folder)"
            )


def _is_group_line(override: str) -> bool:
    return _is_group(OverridesParser.create().parse_override(override))


def _is_group(override: Override) -> bool:
    return (
        override.package is not None or "/" in override.key_or_group or _options(override.key_or_group) != []
    )


def _options(group: str) -> list[str]:
    """The options of a config group: its YAML files (the schemas stored in code are not offered)."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def require_configs() -> None:
    """Refuse, in one line, to run without ``configs/``: the commands read it from the source tree."""
    if not CONFIG_DIR.is_dir():
        raise NMTError(f"no configs at {CONFIG_DIR}: the commands need the source tree (pip install -e .)")


def _compose(config_name: str, groups: list[str]) -> DictConfig:
    """The script's config with the group choices ``groups`` (overrides) only, Hydra's part included."""
    register_configs()
    require_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name, overrides=groups, return_hydra_config=True)


def _split(overrides: list[str]) -> tuple[list[Override], list[Override]]:
    """Group choices (``data=local``) and key overrides (``data.dir=...``, ``+key=...``), Hydra's own and
    deletions (``~key``) left out. An override that does not parse is refused in one line."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as e:  # Hydra's lines: what is wrong (or a caret under it), a link
        *lines, link = str(e).splitlines()
        why = [line for line in lines if line.strip(" ^") and not line.startswith("Error parsing override")]
        raise NMTError(f"{e.override}: cannot parse it ({'; '.join(why)}); {link}") from None
    groups = [o for o in parsed if _is_group(o)]
    keys = [o for o in parsed if not _is_group(o) and not o.key_or_group.startswith("hydra.")]
    return groups, [o for o in keys if o.type != OverrideType.DEL]


def check_overrides(config_name: str, overrides: list[str]) -> None:
    """Refuse, in one line naming the closest real one, an option of a config group that does not exist
    and an override of a key the script's config does not have, ``+key=value`` included (Hydra would add
    it, and the run would ignore it or fail late)."""
    groups, keys = _split(overrides)
    for group in groups:
        options, value = _options(group.key_or_group), group.value()
        if options and isinstance(value, str) and value not in options:
            close = difflib.get_close_matches(value, options, n=1, cutoff=0.5)
            hint = f"did you mean {group.key_or_group}={close[0]}? " if close else ""
            raise NMTError(
                f"{group.input_line}: no such option; {hint}({group.key_or_group}: {', '.join(options)})"
            )
    if any(g.is_sweep_override() for g in groups):  # -m data=toy,local: keys depend on the sweep's job
        return
    choices = [g.input_line for g in groups]
    require_configs()  # a refusal of ours, before Hydra's errors are set aside below
    try:
        cfg = _compose(config_name, choices)
    except Exception:  # e.g. a group choice of the wrong kind: Hydra says what is wrong when it composes
        return
    for override in keys:
        key = override.key_or_group
        missing = _missing(cfg, key)
        if missing != NO_SUCH_SETTING:
            if missing:
                raise NMTError(f"{key}: {missing}")
            continue
        group = key.split(".")[0]
        having = _elsewhere(config_name, choices, key)
        if having:
            current = f"{group}={cfg.hydra.runtime.choices[group]}"
            raise NMTError(f"{key}: not a setting of {current}; {having} (--help lists them)")
        known = [k for k, _ in _leaves(cfg)] + [g for g in cfg.hydra.runtime.choices if "/" not in g]
        raise NMTError(f"{key}: {NO_SUCH_SETTING}{_suggestion(key, known)} (--help lists them)")


NO_SUCH_SETTING = "no such setting"


def _missing(cfg: DictConfig, key: str) -> str | None:
    """Why ``key`` is not a setting of ``cfg``, or None if it is (or cannot be told)."""
    *parents, name = key.split(".")
    node: Any = cfg
    for i, part in enumerate(parents):
        if isinstance(node, DictConfig) and not node._is_none() and not _has(node, part):
            return NO_SUCH_SETTING  # a section that does not exist: +trainr.max_steps
        node = node._get_node(part) if isinstance(node, DictConfig) else None
        if isinstance(node, DictConfig) and node._is_none():
            path = ".".join(parents[: i + 1])
            options = _options(path)
            return f"{path} is null here; choose " + (
                f"one first ({path}={'|'.join(options)})" if options else "it"
            )
        if not isinstance(node, DictConfig) or node._is_missing():
            return None  # a list, or a required section not given: Hydra and the value checks judge it
    return None if _has(node, name) else NO_SUCH_SETTING


def _elsewhere(config_name: str, choices: list[str], key: str) -> str:
    """``data=local has it`` when other options of the key's group have the key (``data.dir`` without
    ``data=local``)."""
    group = key.split(".")[0]
    others = [c for c in choices if c.split("=")[0].lstrip("+") != group]
    having = []
    for option in _options(group) if "." in key else []:
        try:
            if _missing(_compose(config_name, [*others, f"{group}={option}"]), key) is None:
                having.append(f"{group}={option}")
        except Exception:  # an option that does not compose with the other choices
            continue
    return f"{' and '.join(having)} {'has' if len(having) == 1 else 'have'} it" if having else ""


def _has(node: DictConfig, key: str) -> bool:
    return key in set(node.keys())  # `key in node` is False for a required key not given yet (???)


def _suggestion(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if not close:  # the right name at the wrong place: beam_size for decoding.beam_size
        last = key.rsplit(".", 1)[-1]
        close = [k for k in known if k.rsplit(".", 1)[-1] == last][:1]
    return f"; did you mean {close[0]}?" if close else ""


def _leaves(node: DictConfig, prefix: str = "") -> Iterator[tuple[str, DictConfig]]:
    """Every key (dotted) and the node holding it, Hydra's own settings left out."""
    for key in node:
        if prefix == "" and key == "hydra":
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            yield from _leaves(child, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", node


def script_help(config_name: str, overrides: list[str], doc: str | None) -> str:
    """The script's usage, its config groups with their options, and each of its keys with its default and
    description, choices or rule (its knob in nmt.config)."""
    groups, _ = _split(overrides)
    require_configs()
    try:
        cfg = _compose(config_name, [g.input_line for g in groups if not g.is_sweep_override()])
    except Exception as e:  # Hydra's message, on one line
        raise NMTError(" ".join(str(e).split())) from None
    lines = [(doc or "").strip(), "", "Arguments are key=value overrides; --cfg job prints the whole config."]
    choices = {k: v for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra/")}
    if choices:
        lines += ["", "groups (group=option):"]
        for group, choice in choices.items():
            lines.append(f"  {group}: {', '.join(_options(group))} (now: {choice})")
    lines += ["", "settings (key: default  # what):"]
    for key, holder in _leaves(cfg):
        name = key.rsplit(".", 1)[-1]
        value = holder._get_node(name)
        shown = "???" if value._is_missing() else OmegaConf.to_yaml({"v": value._value()}).strip()[3:]
        if isinstance(value, ListConfig) and not value._is_none():
            shown = "[" + ", ".join(map(str, OmegaConf.to_container(value, resolve=False))) + "]"
        schema = OmegaConf.get_type(holder)
        comment = field_help(schema).get(name)
        if hasattr(schema, "__overrides_of__"):  # decoding.*: null keeps the checkpoint's (tuned) value
            comment = "; ".join(filter(None, ["null = the checkpoint's", comment]))
        lines.append(f"  {key}: {shown}" + (f"  # {comment}" if comment else ""))
    return "\n".join(lines)


def run_cli(fn: Callable[..., T]) -> Callable[..., T]:
    """Run ``fn(cfg, ...)`` once its settings are given and each follows its rule (nmt.config.knob); on
    NMTError print ``error: <message>`` to stderr and exit with status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            for arg in args:
                if isinstance(arg, DictConfig):
                    check_required(arg)
                    settings = resolved(arg)
                    if dataclasses.is_dataclass(settings):
                        check_values(settings)
            with quiet_broken_pipe():
                return fn(*args, **kwargs)
        except NMTError as e:
            print(f"error: {hide_credentials(str(e))}", file=sys.stderr)
            sys.exit(1)

    return wrapper


def resolved(cfg: DictConfig) -> Any:
    """The config as objects, its interpolations (``${key}``, ``${oc.env:NAME}``) resolved; one that
    cannot be is refused in one line naming its key."""
    try:
        return OmegaConf.to_object(cfg)
    except InterpolationResolutionError as e:
        why = str(e).splitlines()[0]  # omegaconf's next lines repeat the key and name the schema
        raise NMTError(f"{e.full_key}: cannot resolve its interpolation ({why})") from None


def check_required(cfg: DictConfig) -> None:
    """Fail early, naming the keys, when required values (``???``) were not given."""
    missing = list(_missing_keys(OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)))
    if missing:
        example = " ".join(f"{key}=..." for key in missing)
        raise NMTError(
            f"missing required setting(s): {', '.join(missing)}; add them to the command, e.g. {example}"
        )


def _missing_keys(node: Any, prefix: str = ""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _missing_keys(value, f"{prefix}{key}.")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _missing_keys(value, f"{prefix}{i}.")
    elif node == "???":
        yield prefix.rstrip(".")
