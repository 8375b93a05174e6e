"""The knob: a setting that declares everything about itself in one place: its default, its description
(``help``), the rule its values follow or its choices; the checks of those rules, and the ``--help`` line
made from them.

The bottom of nmt.config: it knows no schema. A schema whose settings must also fit together declares
that check with ``@fits_together(Schema)``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, TypeVar

from omegaconf import MISSING

from nmt.errors import NMTError

# --------------------------------------------------------------------------------------- value rules
# Values the type system lets through but that cannot work, checked before any data or model is made
# (check_values): a test of the value and what it must be, for the error message.
Rule = tuple[Callable[[Any], bool], str]
POSITIVE: Rule = (lambda v: v > 0, "must be > 0")
NON_NEGATIVE: Rule = (lambda v: v >= 0, "must be >= 0")
PROBABILITY: Rule = (lambda v: 0 <= v < 1, "must be in [0, 1)")
SHARE: Rule = (lambda v: 0 < v <= 1, "must be in (0, 1]")
# What nmt.devices.select_device takes: torch's device names for the hardware the toolkit runs on.
DEVICE: Rule = (
    lambda v: re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", v) is not None,
    "must be auto, cpu, cuda, cuda:N (the GPU of index N) or mps",
)
EACH_POSITIVE: Rule = (lambda v: all(x > 0 for x in v), "must each be > 0")
EACH_NON_NEGATIVE: Rule = (lambda v: all(x >= 0 for x in v), "must each be >= 0")


def one_of(choices: tuple[str, ...]) -> str:
    """What a setting with these choices must be, in the refusal's words."""
    return f"must be one of {', '.join(choices)}"


def knob(
    default: Any = MISSING,
    rule: Rule | None = None,
    *,
    help: str = "",
    choices: tuple[str, ...] | None = None,
    speed_only: bool = False,
) -> Any:
    """A setting that declares what it accepts: its default (a list or dict is copied for each config), what
    it does (``help``, shown by every script's ``--help``), the rule its values follow or the choices it
    takes (the names its implementation's registry is keyed by; a list's items each), checked at start by
    check_values; and, for a decoding option, whether it changes only the speed, never the translation
    (the service keeps such options to itself)."""
    if choices is not None and isinstance(default, list):
        rule = (lambda v: all(x in choices for x in v), f"must each be one of {', '.join(choices)}")
    elif choices is not None:
        rule = (lambda v: v in choices, one_of(choices))
    metadata = {"rule": rule, "choices": choices, "speed_only": speed_only, "help": help}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def section(schema: type, help: str = "") -> Any:
    """A nested section of settings (a dataclass, made anew for each config), with what it holds."""
    return field(default_factory=schema, metadata={"help": help})


# --------------------------------------------------------------------------------- value checks
@functools.cache
def knobs_of(config: type) -> dict[str, dict[str, Any]]:
    """Each field of the dataclass ``config`` that has a rule, with its knob's metadata; a subclass that
    only changes a default (``arch: str = "transformer"``) keeps the rule its base declares."""
    found: dict[str, dict[str, Any]] = {}
    for cls in reversed(config.__mro__):
        if dataclasses.is_dataclass(cls):
            found |= {f.name: dict(f.metadata) for f in dataclasses.fields(cls) if f.metadata.get("rule")}
    return found


@functools.cache
def required_fields(config: type) -> tuple[str, ...]:
    """The fields of the dataclass ``config`` that have no default (``???``): null does not give them."""
    fields = dataclasses.fields(config)
    return tuple(f.name for f in fields if f.default == MISSING and f.default_factory is dataclasses.MISSING)


def choices_of(schema: type, name: str) -> tuple[str, ...]:
    """The choices the setting ``name`` of ``schema`` declares: what its implementations are keyed by."""
    return knobs_of(schema)[name]["choices"]


M = TypeVar("M", bound=Mapping)


def keyed_by_choices(schema: type, name: str, entries: M, besides: tuple[str, ...] = ()) -> M:
    """``entries`` (a kind's name -> its implementation), checked where it is defined against the choices
    of the setting that names them (but ``besides``, choices handled before the registry is read), so
    that a kind added to one and not the other fails at import."""
    choices = choices_of(schema, name)
    if set(entries) != set(choices) - set(besides):
        raise TypeError(
            f"{schema.__name__}.{name} offers {', '.join(choices)}, its registry holds {', '.join(entries)}"
        )
    return entries


Fits = Callable[[Any, str], None]
F = TypeVar("F", bound=Fits)

# Checks of settings that must fit together, run on each section of these types after its values'.
FITS: dict[type, Fits] = {}


def fits_together(section: type) -> Callable[[F], F]:
    """Declare ``check(cfg, prefix)``, raising NMTError, as what check_values runs on each ``section`` (and
    subclass) once its values follow their rules: settings that are fine one by one but not together."""

    def declare(check: F) -> F:
        FITS[section] = check
        return check

    return declare


def check_values(cfg: object, prefix: str = "") -> None:
    """Raise NMTError naming the first setting of ``cfg`` (nested sections included) whose value breaks its
    knob's rule, as ``KEY=VALUE: must be ...`` with the closest choice; None (not set) is never checked,
    but for a required setting (no default), which null does not give.
    Then the settings of a section that must fit together (``FITS``)."""
    knobs = knobs_of(type(cfg))
    for name in required_fields(type(cfg)):
        if getattr(cfg, name, MISSING) is None:
            raise NMTError(f"{prefix}{name}=null: a required setting; give a value ({prefix}{name}=...)")
    for name, value in vars(cfg).items():
        if dataclasses.is_dataclass(value):
            check_values(value, f"{prefix}{name}.")
        elif value is not None and name in knobs:
            (ok, what), choices = knobs[name]["rule"], knobs[name]["choices"]
            if not ok(value):
                raise NMTError(f"{prefix}{name}={value}: {what}{closest_choice(value, choices)}")
    for section, fits in FITS.items():
        if isinstance(cfg, section):
            fits(cfg, prefix)


def check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    """A choice given to a function rather than in a config, refused as check_values refuses a setting."""
    if value not in choices:
        raise NMTError(f"{key}={value}: {one_of(choices)}{closest_choice(value, choices)}")


def closest_choice(value: Any, choices: tuple[str, ...] | None) -> str:
    """``; did you mean X?`` for the choice closest to a refused value (a list's first refused item),
    case aside, else nothing."""
    if isinstance(value, list):
        value = next((x for x in value if x not in (choices or ())), "")
    lowered = {c.lower(): c for c in choices or ()}
    close = difflib.get_close_matches(str(value).lower(), list(lowered), n=1, cutoff=0.6)
    return f"; did you mean {lowered[close[0]]}?" if close else ""


# ------------------------------------------------------------------------ overrides and --help text
def overrides_of(config: type, name: str, doc: str, module: str | None = None) -> type:
    """A dataclass with ``config``'s fields, each optional with default None and the same rule (a real
    dataclass type: Hydra's ConfigStore types the ``decoding.*`` of the scripts with it). ``module`` is the
    one that binds it to ``name`` (default: ``config``'s), where pickle looks for it."""
    hints = typing.get_type_hints(config)
    fields = [
        (f.name, hints[f.name] | None, field(default=None, metadata=f.metadata))
        for f in dataclasses.fields(config)
    ]
    overrides = dataclasses.make_dataclass(name, fields)
    overrides.__module__, overrides.__doc__ = module or config.__module__, doc
    overrides.__overrides_of__ = config  # where field_help finds the fields' descriptions
    return overrides


@functools.cache
def field_help(config: type) -> dict[str, str]:
    """Each setting's ``--help`` line: its knob's help, then its choices or rule. A subclass that only
    changes a default keeps what its base declares; ``overrides_of`` copies keep their field's."""
    helps: dict[str, str] = {}
    rules: dict[str, str] = {}
    for cls in reversed(getattr(config, "__overrides_of__", config).__mro__):
        if not dataclasses.is_dataclass(cls):
            continue
        for f in dataclasses.fields(cls):
            rule, choices = f.metadata.get("rule"), f.metadata.get("choices")
            if f.metadata.get("help"):
                helps[f.name] = f.metadata["help"]
            if choices or rule:
                rules[f.name] = f"one of: {', '.join(choices)}" if choices else rule[1]
    return {
        name: "; ".join(filter(None, [helps.get(name, "").rstrip("."), rules.get(name, "")]))
        for name in helps.keys() | rules.keys()
    }
