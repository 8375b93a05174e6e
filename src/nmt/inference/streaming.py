"""Translate a stream of text line by line (``scripts/translate.py``): a terminal a line at a time, a
pipe or file in batches, each written and flushed as soon as it is translated, so that a long input
shows its first translations early and a killed run keeps all it wrote.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, TextIO

from nmt.config import DecodingConfig
from nmt.errors import NMTError
from nmt.inference.translator import Translator


@dataclass
class StreamOptions:
    """What :func:`translate_stream` does besides translating each line."""

    prefixes: BinaryIO | None = None  # target prefixes, a line per input line (empty = none)
    prefix_name: str = "prefix_file"  # what errors call ``prefixes``
    alignments: bool = False  # append a tab and the translation's word alignment (Pharaoh i-j)
    alignment_layer: int | None = None  # None: the penultimate decoder layer


def translate_stream(
    translator: Translator,
    source: BinaryIO,
    target: TextIO,
    decoding: DecodingConfig,
    batch_sentences: int,
    name: str = "stdin",
    options: StreamOptions | None = None,
) -> None:
    """Translate ``source`` (bytes, UTF-8, called ``name`` in errors) line by line to ``target``: one
    line at a time when interactive, batches of ``batch_sentences`` otherwise, flushing after each."""
    options = options or StreamOptions()
    interactive = source.isatty()
    size = 1 if interactive else max(1, batch_sentences)
    prefix_lines = _lines(options.prefixes, False, options.prefix_name) if options.prefixes else None
    batch: list[str] = []
    prefixes: list[str] = []
    done = 0  # lines written so far: warnings name input lines, not lines of the batch
    for line in _lines(source, interactive, name):
        batch.append(line)
        if prefix_lines is not None:
            prefix = next(prefix_lines, None)
            if prefix is None:
                raise NMTError(
                    f"{options.prefix_name} has {done + len(batch) - 1} lines, {name} more: "
                    "give a prefix line (empty for none) per input line"
                )
            prefixes.append(prefix)
        if len(batch) >= size:
            _write(target, _translate_lines(translator, batch, prefixes, decoding, done + 1, options))
            done, batch, prefixes = done + len(batch), [], []
    if batch:
        _write(target, _translate_lines(translator, batch, prefixes, decoding, done + 1, options))
        done += len(batch)
    if prefix_lines is not None and next(prefix_lines, None) is not None:
        raise NMTError(f"{options.prefix_name} has more lines than the {done} of {name}")


def _translate_lines(
    translator: Translator,
    lines: list[str],
    prefixes: list[str],
    decoding: DecodingConfig,
    first_line: int,
    options: StreamOptions,
) -> list[str]:
    """The output lines of a batch: each translation, with a tab and its alignment when asked."""
    done = translator.translations(
        lines, decoding, first_line=first_line, prefixes=prefixes if options.prefixes else None
    )
    if not options.alignments:
        return done.texts
    aligned = translator.align(done.sources, done.best_tokens, options.alignment_layer, decoding.max_tokens)
    return [f"{text}\t{a.pharaoh()}" for text, a in zip(done.texts, aligned)]


def _lines(source: BinaryIO, interactive: bool, name: str) -> Iterator[str]:
    """Decoded lines; invalid UTF-8 is an error naming the line (SentencePiece would fail obscurely)."""
    number = 0
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        raw = source.readline()
        if not raw:
            return
        number += 1
        try:
            yield raw.decode("utf-8").rstrip("\n")
        except UnicodeDecodeError as e:
            raise NMTError(
                f"{name}:{number}: invalid UTF-8 ({e.reason} at byte {e.start} of the line)"
            ) from None


def _write(target: TextIO, lines: list[str]) -> None:
    target.write("".join(line + "\n" for line in lines))
    target.flush()
