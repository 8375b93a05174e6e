"""Writers of a prepared corpus's files, a chunk at a time: the cleaned text (plain, or the training
split as gzip members of whole chunks) and one-dimensional ``.npy`` arrays whose length is known only at
the end. Every write error is one line naming the file; the folder they write in is made atomically
(nmt.cache.atomic_dir), so nothing half-written is ever taken for complete.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import BinaryIO

import numpy as np

from nmt.errors import NMTError

CHUNK_PAIRS = 10_000  # training pairs per gzip member: a worker's unit of work
GZIP_LEVEL = 1  # the training text is read back once per encoding; level 1 is ~4x faster than 6


class PlainTextWriter:
    """``{split}.{lang}`` files, a line per sentence, written as chunks come."""

    def __init__(self, folder: Path, split: str, langs: tuple[str, str]):
        self.paths = {lang: folder / f"{split}.{lang}" for lang in langs}
        self.files = {lang: _open_for_writing(path) for lang, path in self.paths.items()}
        self.pairs = 0

    def add(self, lines: dict[str, list[str]]) -> None:
        for lang, f in self.files.items():
            _write(f, self.paths[lang], "".join(line + "\n" for line in lines[lang]).encode("utf-8"))
        self.pairs += len(lines[next(iter(lines))])

    def chunks(self) -> dict:
        return {}

    def __enter__(self) -> PlainTextWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        for lang, f in self.files.items():
            _close(f, self.paths[lang])


class TrainTextWriter(PlainTextWriter):
    """``train.{lang}.gz``: gzip members of ``CHUNK_PAIRS`` lines (the last may hold fewer), whose byte
    offsets go to meta.json, so that each worker decompresses just its own chunk."""

    def __init__(self, folder: Path, langs: tuple[str, str]):
        self.paths = {lang: folder / f"train.{lang}.gz" for lang in langs}
        self.files = {lang: _open_for_writing(path) for lang, path in self.paths.items()}
        self.pairs = 0
        self.buffer: dict[str, list[str]] = {lang: [] for lang in langs}
        self.offsets: dict[str, list[int]] = {lang: [0] for lang in langs}
        self.sizes: list[int] = []

    def add(self, lines: dict[str, list[str]]) -> None:
        for lang, new in lines.items():
            self.buffer[lang] += new
        while len(self.buffer[next(iter(self.buffer))]) >= CHUNK_PAIRS:
            self._flush(CHUNK_PAIRS)

    def _flush(self, n: int) -> None:
        for lang, f in self.files.items():
            lines, self.buffer[lang] = self.buffer[lang][:n], self.buffer[lang][n:]
            text = "".join(line + "\n" for line in lines).encode("utf-8")
            member = gzip.compress(text, compresslevel=GZIP_LEVEL, mtime=0)
            _write(f, self.paths[lang], member)
            self.offsets[lang].append(self.offsets[lang][-1] + len(member))
        self.sizes.append(n)
        self.pairs += n

    def chunks(self) -> dict:
        return {"pairs": self.sizes, "offsets": self.offsets}

    def __exit__(self, *exc: object) -> None:
        rest = len(self.buffer[next(iter(self.buffer))])
        if rest and exc[0] is None:
            self._flush(rest)
        super().__exit__(*exc)


def _open_for_writing(path: Path) -> BinaryIO:
    try:
        return open(path, "wb")  # noqa: SIM115 (closed by the writer)
    except OSError as e:
        raise _disk_error(path, e) from None


def _write(f: BinaryIO, path: Path, data: bytes | memoryview) -> None:
    try:
        f.write(data)
    except OSError as e:
        raise _disk_error(path, e) from None


def _close(f: BinaryIO, path: Path) -> None:
    try:
        f.close()
    except OSError as e:
        raise _disk_error(path, e) from None


def _disk_error(path: Path, e: OSError) -> NMTError:
    """One line naming the file; nothing half-written stays (the folder is written atomically)."""
    return NMTError(
        f"{path}: cannot write it ({e.strerror or e}); nothing was kept: free some space or set "
        "data.cache_dir=... to another disk, then run again"
    )


class EncodedWriter:
    """``{name}.ids.npy`` and ``{name}.offsets.npy`` written a chunk at a time."""

    def __init__(self, folder: Path, name: str, dtype: np.dtype):
        self.ids = NpyWriter(folder / f"{name}.ids.npy", dtype)
        self.offsets = NpyWriter(folder / f"{name}.offsets.npy", np.dtype(np.int64))
        self.offsets.add(np.zeros(1, dtype=np.int64))
        self.end = 0

    def add(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        self.ids.add(flat)
        self.offsets.add(self.end + np.cumsum(lengths, dtype=np.int64))
        self.end += int(lengths.sum())

    def close(self) -> None:
        self.ids.close()
        self.offsets.close()


class NpyWriter:
    """A one-dimensional ``.npy`` file written in pieces, its length unknown until the end: a header of
    fixed size is reserved, and filled in (with the final shape) when the file is closed."""

    HEADER = 128  # bytes, a multiple of 64 as the format asks; room for any shape of one dimension

    def __init__(self, path: Path, dtype: np.dtype):
        self.path, self.dtype, self.count = path, np.dtype(dtype), 0
        self.file = _open_for_writing(path)
        _write(self.file, path, bytes(self.HEADER))

    def add(self, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array, dtype=self.dtype)
        _write(self.file, self.path, memoryview(array).cast("B"))
        self.count += len(array)

    def close(self) -> None:
        descr = np.lib.format.dtype_to_descr(self.dtype)
        header = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': ({self.count},), }}"
        header = header.ljust(self.HEADER - 10 - 1) + "\n"
        magic = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little")
        try:
            self.file.seek(0)
            self.file.write(magic + header.encode("latin1"))
        except OSError as e:
            raise _disk_error(self.path, e) from None
        _close(self.file, self.path)
