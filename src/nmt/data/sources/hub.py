"""Any translation dataset on the Hugging Face hub, at one commit (or parquet/json files, ``data_files``).

The training split is a ``train_size`` draw from all its files (only the parquet row groups drawn are
fetched: :mod:`nmt.data.parquet`), valid and test are read whole. Requests go through
:mod:`nmt.data.hub`, which names the commit in each. The prepared cache is keyed by the commit read,
never by a branch: ``data.revision`` is resolved once (:func:`resolve`) and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import is_dataclass, replace
from typing import Any

from nmt.config import HFDataConfig
from nmt.data.hub import COMMIT, Hub
from nmt.data.parquet import FsspecFile, RangeFile, read_parquet, sample_parquet
from nmt.data.sources.common import Chunk, one_line
from nmt.errors import NMTError

log = logging.getLogger(__name__)

SCHEMA = HFDataConfig


def resolve(cfg: HFDataConfig) -> HFDataConfig:
    """``cfg`` with ``revision`` the commit it names, so the prepared corpus is keyed by what was read."""
    return _pin_revision(cfg)


def cache_key(cfg: HFDataConfig, settings: dict) -> dict:
    """How long to wait for the hub changes nothing; the commit read is the key (none for local files)."""
    settings.pop("hub_timeout_s"), settings.pop("hub_retries")
    if cfg.data_files:
        settings.pop("revision")
    return settings


def read(cfg: HFDataConfig, split: str) -> Iterator[Chunk]:
    """Training: ``train_size`` pairs drawn from all training files (:func:`sample_parquet`), a row
    group at a time; valid/test read whole from their own files. Only the row groups read are fetched
    (nmt.data.parquet), from the hub at the commit ``data.revision`` names (nmt.data.hub), or with
    ``data_files`` set from those files: ``path`` then names a datasets builder ("parquet", "json",
    ...) and ``data_files`` a path or glob containing ``{split}``."""
    hf_split = {"train": cfg.train_split, "valid": cfg.valid_split, "test": cfg.test_split}[split]
    where = _hf_what(cfg, hf_split)
    try:
        files = _hf_files(cfg, hf_split)
        if files is None:  # data_files that are not parquet: valid/test through datasets
            columns = _hf_columns(cfg, hf_split, _hf_rows(cfg, hf_split))
            yield columns[cfg.src_lang], columns[cfg.tgt_lang]
            return
        if split == "train":
            tables = sample_parquet(files, cfg.train_size, cfg.seed, desc=f"drawing {hf_split}")
        else:
            tables = read_parquet(files)
        for table in tables:
            yield _arrow_columns(cfg, hf_split, table)
    except NMTError:
        raise
    except Exception as e:  # network, hub and file errors come as many types
        raise NMTError(f"could not read {where}: {one_line(e)}; {_hint(cfg, e)}") from None


def _hf_what(cfg: HFDataConfig, hf_split: str) -> str:
    """The split's origin, as errors name it."""
    if cfg.data_files:
        return f"{cfg.path} files {cfg.data_files.replace('{split}', hf_split)}"
    return (
        f"Hugging Face dataset {cfg.path} ({cfg.config_name}) at revision {cfg.revision}, split {hf_split!r}"
    )


def _hf_files(cfg: HFDataConfig, hf_split: str) -> list[RangeFile] | None:
    """The parquet files of a split: the hub's at the pinned commit (from the dataset card's
    ``configs:``), or those ``data_files`` names; None for ``data_files`` that are not parquet
    (valid/test only: training draws from parquet row groups)."""
    if not cfg.data_files:
        quiet_hub()
        hub = _hub(cfg)
        return hub.split_files(hub_commit(cfg), cfg.config_name, hf_split)
    paths = _hf_data_files(cfg, hf_split)
    if all(p.endswith(".parquet") for p in paths):
        return [FsspecFile(p) for p in paths]
    if hf_split == cfg.train_split:
        raise NMTError(
            f"{cfg.path}: the training files must be parquet to draw data.train_size pairs from all of them, "
            f"got {paths[:3]}"
        )
    return None


def _hub(cfg: HFDataConfig) -> Hub:
    return Hub(cfg.path, cfg.hub_timeout_s, cfg.hub_retries)


def hub_commit(cfg: HFDataConfig) -> str:
    """The commit ``data.revision`` names: itself when it is one (no request), else asked of the hub
    once per process and logged."""
    if COMMIT.fullmatch(cfg.revision):
        return cfg.revision
    key = (_hub(cfg).endpoint, cfg.path, cfg.revision)
    if key not in _RESOLVED:
        quiet_hub()
        try:
            _RESOLVED[key] = _hub(cfg).commit(cfg.revision)
        except NMTError:
            raise
        except Exception as e:
            raise NMTError(
                f"could not resolve data.revision={cfg.revision} of Hugging Face dataset {cfg.path}: "
                f"{one_line(e)}; {_hint(cfg, e)}"
            ) from None
        log.info("data.revision=%s of %s is commit %s", cfg.revision, cfg.path, _RESOLVED[key])
    return _RESOLVED[key]


_RESOLVED: dict[tuple[str, str, str], str] = {}


def _pin_revision(cfg: HFDataConfig) -> HFDataConfig:
    """``cfg`` with ``revision`` a commit, so the prepared corpus is keyed by what was read."""
    if cfg.data_files or COMMIT.fullmatch(cfg.revision):
        return cfg
    commit = hub_commit(cfg)
    if is_dataclass(cfg):
        return replace(cfg, revision=commit)
    pinned = cfg.copy()  # a DictConfig from a script
    pinned.revision = commit
    return pinned


def _arrow_columns(cfg: HFDataConfig, hf_split: str, table: Any) -> Chunk:
    """The two languages of a ``translation`` struct column, as lists of stripped strings."""
    import pyarrow.compute as pc

    names = table.schema.names
    fields = [f.name for f in table.schema.field("translation").type] if "translation" in names else []
    for key in ("translation", cfg.src_lang, cfg.tgt_lang):
        if key not in names + fields:
            raise NMTError(
                f"{cfg.path}, split {hf_split!r}: rows must look like {{'translation': "
                f"{{'{cfg.src_lang}': ..., '{cfg.tgt_lang}': ...}}}}; missing key '{key}'"
            )
    pairs = table.column("translation")
    src, tgt = (
        [text.strip() for text in pc.struct_field(pairs, lang).to_pylist()]
        for lang in (cfg.src_lang, cfg.tgt_lang)
    )
    return src, tgt


def _hf_data_files(cfg: HFDataConfig, hf_split: str) -> list[str]:
    """The files ``data_files`` names for a split, resolved by ``datasets`` as it would load them."""
    return _hf_call(
        cfg,
        hf_split,
        lambda datasets, kwargs: [
            str(f) for f in datasets.load_dataset_builder(cfg.path, **kwargs).config.data_files[hf_split]
        ],
    )


def _hf_rows(cfg: HFDataConfig, hf_split: str):
    return _hf_call(
        cfg, hf_split, lambda datasets, kwargs: datasets.load_dataset(cfg.path, split=hf_split, **kwargs)
    )


def _hf_call(cfg: HFDataConfig, hf_split: str, load: Callable[[Any, dict[str, Any]], Any]) -> Any:
    """``load(datasets, kwargs)`` for the split's ``data_files``; any failure as one NMTError."""
    import datasets  # slow to import; only data_files needs it

    quiet_hub()
    if "{split}" not in cfg.data_files:
        raise NMTError(f"data.data_files={cfg.data_files!r} must contain '{{split}}'")
    files = cfg.data_files.replace("{split}", hf_split)
    try:
        return load(datasets, {"data_files": {hf_split: files}})
    except Exception as e:  # file errors come as different types
        raise NMTError(
            f"could not load Hugging Face dataset {cfg.path} files {files}: {one_line(e)}; {_hint(cfg, e)}"
        ) from None


def quiet_hub() -> None:
    """No retry chatter from the hub client and no line per HTTP request: a failure is reported once,
    as an NMTError, and what was read is logged a line per file."""
    from huggingface_hub.utils import logging as hub_logging

    hub_logging.set_verbosity_error()
    for name in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _hint(cfg: HFDataConfig, error: Exception | None = None) -> str:
    if cfg.data_files:
        return "check data.data_files"
    if getattr(getattr(error, "response", None), "status_code", None) == 404:
        return (
            f"check data.path={cfg.path}, data.config_name={cfg.config_name} and "
            f"data.revision={cfg.revision} (a commit, branch or tag of the dataset on the hub)"
        )
    return (
        "run again to retry; without internet access use local files: experiment=multi30k_cpu data.dir=... "
        "(a copy of Multi30k), experiment=wmt14_subset_cpu data.dir=..., or data=local data.dir=..."
    )


def _hf_columns(cfg: HFDataConfig, hf_split: str, rows) -> dict[str, list[str]]:
    langs = (cfg.src_lang, cfg.tgt_lang)
    out: dict[str, list[str]] = {lang: [] for lang in langs}
    try:
        for row in rows:
            pair = row["translation"]
            for lang in langs:
                out[lang].append(pair[lang].strip())
    except KeyError as e:
        raise NMTError(
            f"{cfg.path}, split {hf_split!r}: rows must look like {{'translation': {{'{langs[0]}': ..., "
            f"'{langs[1]}': ...}}}}; missing key {e}"
        ) from None
    except Exception as e:
        raise NMTError(
            f"{cfg.path}, split {hf_split!r}: reading failed: {one_line(e)}; {_hint(cfg, e)}"
        ) from None
    return out
