"""Any translation dataset on the Hugging Face hub, at one commit (or parquet/json files, ``data_files``).

The training split is a ``train_size`` draw from all its files (only the parquet row groups drawn are
fetched: :mod:`nmt.data.parquet`), valid and test are read whole, each from its own dataset, config
and split when set (``valid_path``, ``valid_config``, ...), or drawn from training when the dataset has
none (``valid_split: null``). Rows are a ``translation`` struct, two flat columns, or, for a config
with ``{lang}``, one language per config joined on an id (FLORES).

Requests go through :mod:`nmt.data.hub_api`, which names the commit in each. A branch is resolved to its
commit once (:func:`resolve`), logged, and the prepared cache is keyed by the commit; a dataset
without parquet files there (a loading script, json) is read from the hub's parquet conversion, the
``refs/convert/parquet`` revision, and the log says so.

Why not huggingface_hub's ``HfFileSystem`` with ``pyarrow.parquet``: measured on the tests' stand-in
(the draw of 1,500 rows from its three WMT14 training files, huggingface_hub 2.4, pyarrow 26), the
hand-written range reader (:mod:`nmt.data.parquet`) fetched 616 kB (602 kB of drawn row groups, 14 kB
of footers); ``HfFileSystem().open(..., block_size=64 KiB, cache_type="none")`` under
``pq.ParquetFile`` fetched 799 kB, its 5 MB read-ahead 1,556 kB, and its default (``block_size=0``)
file cannot seek, which pyarrow needs. The library fetches more, so the hub is read by byte range here;
``data_files`` (local or fsspec paths) go through fsspec with exact ranges (:class:`FsspecFile`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from nmt.config import HFDataConfig
from nmt.data.hub_api import COMMIT, Hub
from nmt.data.parquet import FsspecFile, RangeFile, read_parquet, sample_parquet
from nmt.data.sources.shapes import Chunk, one_line
from nmt.errors import NMTError

log = logging.getLogger(__name__)

REMOVE_HELD_OUT = True  # training pairs that are valid or test pairs are dropped
SCHEMA = HFDataConfig
CONVERTED = "refs/convert/parquet"  # the hub's parquet conversion of every public dataset
# data=wmt14_de_en's dataset (configs/data/wmt14_de_en.yaml), also what data.hub_fallback_pairs draws
WMT14 = {
    "name": "wmt14_de_en",
    "path": "wmt/wmt14",
    "config_name": "de-en",
    "revision": "b199e406369ec1b7634206d3ded5ba45de2fe696",
}
# FLORES-200 configs ({lang} in valid_config/test_config) of common language codes; data.flores_codes
# adds or overrides.
FLORES_CODES = {
    "ar": "arb_Arab", "bg": "bul_Cyrl", "cs": "ces_Latn", "da": "dan_Latn", "de": "deu_Latn",
    "el": "ell_Grek", "en": "eng_Latn", "es": "spa_Latn", "et": "est_Latn", "fi": "fin_Latn",
    "fr": "fra_Latn", "gu": "guj_Gujr", "he": "heb_Hebr", "hi": "hin_Deva", "hu": "hun_Latn",
    "id": "ind_Latn", "it": "ita_Latn", "ja": "jpn_Jpan", "kk": "kaz_Cyrl", "ko": "kor_Hang",
    "lt": "lit_Latn", "lv": "lvs_Latn", "nl": "nld_Latn", "no": "nob_Latn", "pl": "pol_Latn",
    "pt": "por_Latn", "ro": "ron_Latn", "ru": "rus_Cyrl", "sk": "slk_Latn", "sl": "slv_Latn",
    "sv": "swe_Latn", "ta": "tam_Taml", "tr": "tur_Latn", "uk": "ukr_Cyrl", "vi": "vie_Latn",
    "zh": "cmn_Hans",
}  # fmt: skip
_UNSET_UNLESS = {  # settings that change nothing at their defaults: out of the cache key then
    "src_column": None, "tgt_column": None, "valid_path": None, "valid_config": None,
    "valid_revision": None, "test_path": None, "test_config": None, "test_revision": None,
    "flores_codes": {},
}  # fmt: skip


@dataclass(frozen=True)
class Origin:
    """Where one split is read: a dataset, its config and split, at a revision."""

    path: str
    config: str
    split: str
    revision: str

    @property
    def joined(self) -> bool:
        """One language per config (FLORES-style), joined on an id column."""
        return "{lang}" in self.config

    def what(self) -> str:
        return (
            f"Hugging Face dataset {self.path} ({self.config}) at revision {self.revision}, "
            f"split {self.split!r}"
        )


def origin(cfg: HFDataConfig, split: str) -> Origin | None:
    """Where ``split`` (train/valid/test) is read; None for valid/test drawn from training."""
    if split == "train":
        return Origin(cfg.path, cfg.config_name, cfg.train_split, cfg.revision)
    name = cfg.valid_split if split == "valid" else cfg.test_split
    if not name:
        return None
    path = getattr(cfg, f"{split}_path") or cfg.path
    revision = getattr(cfg, f"{split}_revision") or (cfg.revision if path == cfg.path else "main")
    return Origin(path, getattr(cfg, f"{split}_config") or cfg.config_name, name, revision)


def resolve(cfg: HFDataConfig) -> HFDataConfig:
    """``cfg`` with every revision read a commit (a branch resolved once, logged; a revision without
    parquet files replaced by the commit of its parquet conversion), so the prepared corpus, the
    checkpoints and the test report name what was read."""
    if cfg.data_files:
        return cfg
    pins = {"revision": _pinned(cfg, origin(cfg, "train"), "data.revision")}
    for split in ("valid", "test"):
        o = origin(cfg, split)
        if o is not None and o.path != cfg.path:
            pins[f"{split}_revision"] = _pinned(cfg, o, f"data.{split}_revision")
    return _with(cfg, **pins)


pin = resolve


def describe(cfg: HFDataConfig) -> str:
    """The dataset, config and commit of each split, as the test report names them."""
    if cfg.data_files:
        return f"{cfg.path} files {cfg.data_files}"
    parts = []
    for split in ("train", "valid", "test"):
        o = origin(cfg, split)
        parts.append(
            f"{split} drawn from train"
            if o is None
            else f"{split} hf://datasets/{o.path}@{o.revision} ({o.config}, {o.split})"
        )
    return "; ".join(parts)


def _with(cfg: Any, **values: Any) -> Any:
    """``cfg`` with ``values`` replaced: a dataclass copy, or a DictConfig copy (from a script)."""
    if all(getattr(cfg, key) == value for key, value in values.items()):
        return cfg
    import dataclasses

    if dataclasses.is_dataclass(cfg):
        return dataclasses.replace(cfg, **values)
    copy = cfg.copy()
    for key, value in values.items():
        setattr(copy, key, value)
    return copy


def cache_key(cfg: HFDataConfig, settings: dict) -> dict:
    """How long to wait for the hub changes nothing; the commit read is the key (none for local files).
    Settings at their no-effect defaults are left out, so that adding one keeps older keys."""
    for key in ("hub_timeout_s", "hub_retries", "hub_deadline_s"):
        settings.pop(key, None)
    if cfg.data_files:
        settings.pop("revision")
    for key, default in _UNSET_UNLESS.items():
        if settings.get(key) == default:
            settings.pop(key, None)
    joined = any(o is not None and o.joined for o in (origin(cfg, "valid"), origin(cfg, "test")))
    if not joined:
        settings.pop("join_column", None), settings.pop("text_column", None)
    for split in ("valid", "test"):
        if settings.get(f"{split}_split"):
            settings.pop(f"{split}_size", None)
    return settings


def read(cfg: HFDataConfig, split: str) -> Iterator[Chunk]:
    """Training: ``train_size`` pairs drawn from all training files (:func:`sample_parquet`), a row
    group at a time; valid/test read whole from their own files, or drawn from training. Only the row
    groups read are fetched (nmt.data.parquet), from the hub at the commit the revision names
    (nmt.data.hub_api), or with ``data_files`` set from those files: ``path`` then names a datasets
    builder ("parquet", "json", ...) and ``data_files`` a path or glob containing ``{split}``."""
    o = origin(cfg, split)
    if o is None or (split == "train" and not all(origin(cfg, s) for s in ("valid", "test"))):
        yield from held_out_draw(cfg)[split]
        return
    try:
        if o.joined:
            yield _joined(cfg, o)
            return
        files = _files(cfg, o)
        if files is None:  # data_files that are not parquet: valid/test through datasets
            columns = _hf_columns(cfg, o.split, _hf_rows(cfg, o.split))
            yield columns[cfg.src_lang], columns[cfg.tgt_lang]
            return
        if split == "train":
            tables = sample_parquet(files, cfg.train_size, cfg.seed, desc=f"drawing {o.split}")
        else:
            tables = read_parquet(files)
        for table in tables:
            yield _arrow_columns(cfg, o, table)
    except NMTError:
        raise
    except Exception as e:  # network, hub and file errors come as many types
        raise NMTError(f"could not read {_what(cfg, o)}: {one_line(e)}; {_hint(cfg, o, e)}") from None


def _what(cfg: HFDataConfig, o: Origin) -> str:
    """The split's origin, as errors name it."""
    if cfg.data_files:
        return f"{cfg.path} files {cfg.data_files.replace('{split}', o.split)}"
    return o.what()


def _files(cfg: HFDataConfig, o: Origin, config: str | None = None) -> list[RangeFile] | None:
    """The parquet files of a split: the hub's at the pinned commit (from the dataset card's
    ``configs:``, else the parquet conversion's layout), or those ``data_files`` names; None for
    ``data_files`` that are not parquet (valid/test only: training draws from parquet row groups)."""
    if not cfg.data_files:
        quiet_hub()
        hub = _hub(cfg, o.path)
        return hub.split_files(commit_of(cfg, o), config or o.config, o.split)
    paths = _hf_data_files(cfg, o.split)
    if all(p.endswith(".parquet") for p in paths):
        return [FsspecFile(p) for p in paths]
    if o.split == cfg.train_split:
        raise NMTError(
            f"{cfg.path}: the training files must be parquet to draw data.train_size pairs from all of them, "
            f"got {paths[:3]}"
        )
    return None


def _hub(cfg: HFDataConfig, path: str | None = None) -> Hub:
    return Hub(path or cfg.path, cfg.hub_timeout_s, cfg.hub_retries, cfg.hub_deadline_s)


def commit_of(cfg: HFDataConfig, o: Origin, key: str = "data.revision", raw: bool = False) -> str:
    """The commit ``o.revision`` names: itself when it is one (no request), else asked of the hub
    once per process and logged. A failure is one NMTError, or with ``raw`` the hub client's own."""
    if COMMIT.fullmatch(o.revision):
        return o.revision
    hub = _hub(cfg, o.path)
    cache = (hub.endpoint, o.path, o.revision)
    if cache not in _RESOLVED:
        quiet_hub()
        try:
            _RESOLVED[cache] = hub.commit(o.revision)
        except NMTError:
            raise
        except Exception as e:
            if raw:
                raise
            raise NMTError(
                f"could not resolve {key}={o.revision} of Hugging Face dataset {o.path}: "
                f"{one_line(e)}; {_hint(cfg, o, e)}"
            ) from None
        log.info("%s=%s of %s is commit %s", key, o.revision, o.path, _RESOLVED[cache])
    return _RESOLVED[cache]


_RESOLVED: dict[tuple[str, str, str], str] = {}


def _pinned(cfg: HFDataConfig, o: Origin, key: str) -> str:
    """The commit to read ``o`` at: ``o.revision``'s, or when that holds no parquet files for the
    config (a dataset with a loading script, or json files), its parquet conversion's."""
    if COMMIT.fullmatch(o.revision):
        return o.revision
    commit = commit_of(cfg, o, key)
    hub = _hub(cfg, o.path)
    config = _config_of(cfg, o, cfg.src_lang)
    try:
        if hub.card_configs(commit) and config not in hub.card_configs(commit):
            hub.split_files(commit, config, o.split)  # refused, naming the configs the card has
        if hub.has_parquet(commit, config, o.split):
            return commit
        converted = commit_of(cfg, Origin(o.path, o.config, o.split, CONVERTED), key, raw=True)
    except NMTError:
        raise
    except Exception as e:
        if getattr(getattr(e, "response", None), "status_code", None) == 404:
            raise NMTError(
                f"{o.path} ({config}) has no parquet files at {key}={o.revision} and no parquet conversion "
                f"({CONVERTED}): a dataset with a loading script only cannot be read; convert it to "
                "parquet (datasets' push_to_hub) or use its files with data.data_files=..."
            ) from None
        raise NMTError(f"could not read {o.what()}: {one_line(e)}; {_hint(cfg, o, e)}") from None
    log.info(
        "%s (%s) has no parquet files at %s=%s: reading the hub's parquet conversion (%s, commit %s)",
        o.path, config, key, o.revision, CONVERTED, converted,
    )  # fmt: skip
    return converted


def _config_of(cfg: HFDataConfig, o: Origin, lang: str) -> str:
    """The config to read: ``o.config``, with ``{lang}`` the language's own (FLORES-style)."""
    if not o.joined:
        return o.config
    codes = {**FLORES_CODES, **dict(cfg.flores_codes)}
    return o.config.replace("{lang}", codes.get(lang, lang))


def _arrow_columns(cfg: HFDataConfig, o: Origin, table: Any) -> Chunk:
    """The two languages of a ``translation`` struct, or of two flat columns (``src_column`` and
    ``tgt_column``, by default the language codes), as lists of stripped strings."""
    import pyarrow.compute as pc

    names = table.schema.names
    if "translation" in names and not (cfg.src_column or cfg.tgt_column):
        fields = [f.name for f in table.schema.field("translation").type]
        for lang in (cfg.src_lang, cfg.tgt_lang):
            if lang not in fields:
                raise NMTError(
                    f"{_what(cfg, o)}: language {lang!r} is not in the pair: its translation column holds "
                    f"{', '.join(fields)}; check data.src_lang and data.tgt_lang"
                )
        pairs = table.column("translation")
        return tuple(  # type: ignore[return-value]
            _texts(pc.struct_field(pairs, lang)) for lang in (cfg.src_lang, cfg.tgt_lang)
        )
    columns = (cfg.src_column or cfg.src_lang, cfg.tgt_column or cfg.tgt_lang)
    _need_columns(cfg, o, names, columns, ("data.src_column", "data.tgt_column"))
    return _texts(table.column(columns[0])), _texts(table.column(columns[1]))


def _texts(column: Any) -> list[str]:
    return [(text or "").strip() for text in column.to_pylist()]


def _need_columns(cfg: HFDataConfig, o: Origin, names: list[str], wanted: tuple, keys: tuple) -> None:
    for column, key in zip(wanted, keys):
        if column not in names:
            raise NMTError(
                f"{_what(cfg, o)} has no column {column!r}: its columns are {', '.join(names)}; set {key} "
                "(two text columns) or check data.src_lang and data.tgt_lang (a translation column)"
            )


def _joined(cfg: HFDataConfig, o: Origin) -> Chunk:
    """A FLORES-style split: one config per language (``{lang}`` in the config), each row an id and a
    text, the source's rows in order with the target's text of the same id."""
    import pyarrow as pa

    sides = []
    for lang in (cfg.src_lang, cfg.tgt_lang):
        config = _config_of(cfg, o, lang)
        side = Origin(o.path, config, o.split, o.revision)
        files = _files(cfg, side)
        assert files is not None  # no data_files here (a joined config is the hub's)
        table = pa.concat_tables(list(read_parquet(files)))
        _need_columns(cfg, side, table.schema.names, (cfg.join_column, cfg.text_column),
                      ("data.join_column", "data.text_column"))  # fmt: skip
        sides.append(
            dict(zip(table.column(cfg.join_column).to_pylist(), _texts(table.column(cfg.text_column))))
        )
    src, tgt = sides
    missing = [key for key in src if key not in tgt]
    if missing:
        raise NMTError(
            f"{o.what()}: {len(missing)} of {len(src)} ids of {cfg.src_lang} have no {cfg.tgt_lang} row "
            f"(first {missing[0]!r}); check data.join_column={cfg.join_column}"
        )
    return list(src.values()), [tgt[key] for key in src]


# ------------------------------------------------------------------------------- held-out from train


def held_out_draw(cfg: HFDataConfig) -> dict[str, list[Chunk]]:
    """Valid and test drawn from the training split when the dataset has none (``valid_split`` /
    ``test_split`` null): ``train_size`` plus the held-out pairs are drawn at once (seeded), then a
    seeded ``valid_size`` of them become valid and ``test_size`` test, disjoint from each other and from
    training. Held in memory once per process (the read of each split asks for it)."""
    key = repr(cfg)
    if key not in _DRAWN:
        _DRAWN.clear()
        _DRAWN[key] = _draw_held_out(cfg)
    return _DRAWN[key]


_DRAWN: dict[str, dict[str, list[Chunk]]] = {}


def _draw_held_out(cfg: HFDataConfig) -> dict[str, list[Chunk]]:
    sizes = {split: 0 if origin(cfg, split) else getattr(cfg, f"{split}_size") for split in ("valid", "test")}
    held = sizes["valid"] + sizes["test"]
    train_cfg = _with(cfg, train_size=cfg.train_size + held, valid_split="-", test_split="-")
    src: list[str] = []
    tgt: list[str] = []
    for a, b in read(train_cfg, "train"):
        src += a
        tgt += b
    if len(src) <= held:
        raise NMTError(
            f"{origin(cfg, 'train').what()} has {len(src):,} pairs, too few to draw "  # type: ignore[union-attr]
            f"{' and '.join(f'data.{s}_size={n:,}' for s, n in sizes.items() if n)} from it and train on the "
            "rest: lower them, or set data.valid_split/data.test_split to splits of their own"
        )
    order = np.random.default_rng([cfg.seed, 1]).permutation(len(src))
    picked = {"valid": order[: sizes["valid"]], "test": order[sizes["valid"] : held]}
    out: dict[str, list[Chunk]] = {}
    for split, rows in picked.items():
        rows = np.sort(rows)
        out[split] = [([src[i] for i in rows], [tgt[i] for i in rows])]
        if len(rows):
            log.info("%s: %s pairs drawn from %s (seed %d), kept out of training", split, f"{len(rows):,}",
                     cfg.train_split, cfg.seed)  # fmt: skip
    train = np.sort(order[held:])
    out["train"] = [([src[i] for i in train], [tgt[i] for i in train])]
    return out


# ---------------------------------------------------------------------------------------- data_files


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
            f"could not load Hugging Face dataset {cfg.path} files {files}: {one_line(e)}; "
            f"{_hint(cfg, None, e)}"
        ) from None


def quiet_hub() -> None:
    """No retry chatter from the hub client and no line per HTTP request: a failure is reported once,
    as an NMTError, and what was read is logged a line per file."""
    from huggingface_hub.utils import logging as hub_logging

    hub_logging.set_verbosity_error()
    for name in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _hint(cfg: HFDataConfig, o: Origin | None, error: Exception | None = None) -> str:
    """What to do about ``error``: check a setting, log in, or retry (never the token itself)."""
    from huggingface_hub import errors

    if cfg.data_files:
        return "check data.data_files"
    path, config, revision = (
        (o.path, o.config, o.revision) if o else (cfg.path, cfg.config_name, cfg.revision)
    )
    status = getattr(getattr(error, "response", None), "status_code", None)
    if isinstance(error, errors.GatedRepoError):
        return (
            f"{path} is gated: accept its conditions on its page on the hub, then log in with "
            "`hf auth login` (or set HF_TOKEN)"
        )
    if isinstance(error, errors.RepositoryNotFoundError) or status in (401, 403):
        return (
            f"there is no dataset {path} on the hub, or it is private: check data.path, or log in with "
            "`hf auth login` (or set HF_TOKEN) with an account that may read it"
        )
    if status == 404:
        return (
            f"check data.path={path}, data.config_name={config} and "
            f"data.revision={revision} (a commit, branch or tag of the dataset on the hub)"
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
            f"{cfg.path}, split {hf_split!r}: reading failed: {one_line(e)}; {_hint(cfg, None, e)}"
        ) from None
    return out
