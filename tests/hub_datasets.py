"""Small copies of the hub datasets the presets and docs name, laid out as the hub has them: their
cards' ``configs:``, columns, split names and file paths, whether a dataset has parquet files or only a
loading script (then its parquet conversion under ``refs/convert/parquet``,
``{config}/{split}/0000.parquet``), and whether it is gated. For :class:`hub_standin.StandIn.add_repo`;
the text is generated, a few dozen rows a split, so that a test prepares and trains in seconds."""

from __future__ import annotations

import io
import random

import pyarrow as pa
import pyarrow.parquet as pq

WORDS = [f"w{i}" for i in range(60)]


def sentences(tag: str, n: int, seed: int = 0) -> list[str]:
    rng = random.Random(f"{tag}-{seed}")
    return [f"{tag} {i} " + " ".join(rng.choices(WORDS, k=rng.randint(3, 8))) for i in range(n)]


def parquet(columns: dict[str, list]) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer, row_group_size=50)
    return buffer.getvalue()


def translation(langs: tuple[str, str], n: int, split: str) -> bytes:
    """A ``translation`` struct of two languages: the second side is the first with a language tag."""
    first = sentences(split, n)
    rows = [{langs[0]: text, langs[1]: f"{langs[1]} " + text} for text in first]
    return parquet({"translation": rows})


def card(configs: dict[str, dict[str, str]] | None, title: str) -> bytes:
    """A dataset card; ``configs``: config -> split -> path pattern (None: no ``configs:`` block)."""
    lines = ["---", "language:", "- en"]
    if configs:
        lines.append("configs:")
        for name, splits in configs.items():
            lines += [f"- config_name: {name}", "  data_files:"]
            lines += [f"  - split: {split}\n    path: {path}" for split, path in splits.items()]
    return ("\n".join(lines) + f"\n---\n\n# {title} (a stand-in for tests)\n").encode()


SIZES = {"train": 120, "validation": 20, "test": 20}


def wmt(year: str, pairs: list[str]) -> dict[str, bytes]:
    """wmt/wmt14, wmt/wmt16: a config per ``xx-en`` pair, a translation struct, train/validation/test."""
    configs = {pair: {s: f"{pair}/{s}-*" for s in SIZES} for pair in pairs}
    files = {"README.md": card(configs, f"wmt{year}")}
    for pair in pairs:
        for split, n in SIZES.items():
            files[f"{pair}/{split}-00000-of-00001.parquet"] = translation(tuple(pair.split("-")), n, split)
    return files


def iwslt2017(pairs: list[str]) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """IWSLT/iwslt2017: a loading script on main (no parquet, no configs: block); the hub's parquet
    conversion has ``iwslt2017-{src}-{tgt}/{split}/0000.parquet``."""
    main = {"README.md": card(None, "IWSLT 2017"), "iwslt2017.py": b"# a loading script\n"}
    converted = {}
    for pair in pairs:
        for split, n in SIZES.items():
            langs = tuple(pair.split("-"))
            converted[f"iwslt2017-{pair}/{split}/0000.parquet"] = translation(langs, n, split)  # type: ignore[arg-type]
    return main, converted


def opus100(pairs: list[str]) -> dict[str, bytes]:
    """Helsinki-NLP/opus-100: configs named by the pair in alphabetical order (de-en, en-fr)."""
    configs = {pair: {s: f"{pair}/{s}-*" for s in SIZES} for pair in pairs}
    files = {"README.md": card(configs, "OPUS-100")}
    for pair in pairs:
        for split, n in SIZES.items():
            files[f"{pair}/{split}-00000-of-00001.parquet"] = translation(tuple(pair.split("-")), n, split)  # type: ignore[arg-type]
    return files


def opus_books(pairs: list[str]) -> dict[str, bytes]:
    """Helsinki-NLP/opus_books: a train split only, an ``id`` and a translation struct."""
    configs = {pair: {"train": f"{pair}/train-*"} for pair in pairs}
    files = {"README.md": card(configs, "OPUS Books")}
    for pair in pairs:
        table = pq.read_table(io.BytesIO(translation(tuple(pair.split("-")), 200, "train")))  # type: ignore[arg-type]
        table = table.add_column(0, "id", pa.array([str(i) for i in range(len(table))]))
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        files[f"{pair}/train-00000-of-00001.parquet"] = buffer.getvalue()
    return files


FLORES_COLUMNS = ("id", "iso_639_3", "iso_15924", "glottocode", "text", "url", "domain", "topic")


def flores_plus(codes: dict[str, str]) -> dict[str, bytes]:
    """openlanguagedata/flores_plus (gated): a config per language (``deu_Latn``), splits dev and
    devtest, a row per sentence with its ``id`` and ``text``. ``codes``: our code -> FLORES config."""
    configs = {code: {s: f"{s}/{code}.parquet" for s in ("dev", "devtest")} for code in codes.values()}
    files = {"README.md": card(configs, "FLORES+")}
    for lang, code in codes.items():
        for split, n in (("dev", 15), ("devtest", 18)):
            ids = list(range(n))[::-1] if lang == "en" else list(range(n))  # joined by id, not by order
            texts = [f"flores {split} {i} {lang}" for i in ids]
            language, script = code.split("_")
            columns = {"id": ids, "iso_639_3": [language] * n, "iso_15924": [script] * n,
                       "glottocode": ["x"] * n, "text": texts, "url": [""] * n, "domain": ["wikinews"] * n,
                       "topic": ["t"] * n}  # fmt: skip
            files[f"{split}/{code}.parquet"] = parquet(columns)
    return files


def flat_jsonl() -> tuple[dict[str, bytes], dict[str, bytes]]:
    """bentrevett/multi30k: flat ``en``/``de`` columns in jsonl files on main; the conversion has
    ``default/{train,validation,test}/0000.parquet``."""
    main = {"README.md": card(None, "multi30k"), "train.jsonl": b"{}\n", "val.jsonl": b"{}\n"}
    converted = {}
    for split, n in SIZES.items():
        en = sentences(split, n, seed=3)
        converted[f"default/{split}/0000.parquet"] = parquet({"en": en, "de": [f"de {t}" for t in en]})
    return main, converted
