"""What every command-line script shares: user errors as one line on stderr, exit status 1.

A script looks like this (``register_configs`` must run before Hydra composes the config)::

    register_configs()

    @hydra.main(version_base="1.3", config_path="../configs", config_name="train")
    @run_cli
    def main(cfg: DictConfig) -> None: ...

``run_cli`` sits inside ``hydra.main``: Hydra would otherwise catch the error first and print it
with a traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from nmt.errors import NMTError

T = TypeVar("T")


def run_cli(fn: Callable[..., T]) -> Callable[..., T]:
    """Run ``fn(cfg, ...)``; on NMTError print ``error: <message>`` to stderr and exit with status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            for arg in args:
                if isinstance(arg, DictConfig):
                    check_required(arg)
            return fn(*args, **kwargs)
        except NMTError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(1)

    return wrapper


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
