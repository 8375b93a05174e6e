"""Parquet read by byte range: the footer, then only the row groups wanted, from any file that answers
a byte range (the Hugging Face hub, a local or fsspec file).

A row group's column chunks lie side by side in the file, so a group is one byte range. Groups that
touch are fetched in one request (up to ``MAX_REQUEST_BYTES``); groups apart are never joined, so the
bytes fetched are those of the groups wanted plus the footer, never the gaps between them (a buffered
reader's read-ahead would fetch the gaps too).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from nmt.errors import NMTError
from nmt.progress import progress_bar

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 32 << 20  # touching groups merged into one request up to this size: memory stays bounded
MAGIC = b"PAR1"


class RangeFile(Protocol):
    """A file that can hand out byte ranges: named in logs and errors, its size known."""

    name: str
    size: int

    def fetch(self, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive), exactly."""
        ...


class FsspecFile:
    """A local path or fsspec URL (data.data_files) read by exact ranges, no read-ahead."""

    def __init__(self, url: str):
        import fsspec  # comes with datasets

        self.name = url
        self._fs, self._path = fsspec.core.url_to_fs(url)
        self.size = int(self._fs.size(self._path))

    def fetch(self, start: int, end: int) -> bytes:
        return self._fs.cat_file(self._path, start, end)


class ParquetRanges:
    """One parquet file: its footer, read on opening (two ranges: the length, then the metadata), and
    its row groups, read by byte range. ``fetched`` counts the bytes asked for."""

    def __init__(self, file: RangeFile):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.file = file
        self.fetched = 0
        if file.size < 12:
            raise NMTError(f"{file.name}: {file.size} bytes, too short for a parquet file")
        tail = self._fetch(file.size - 8, file.size)
        length = int.from_bytes(tail[:4], "little")
        if tail[4:] != MAGIC or length + 12 > file.size:
            raise NMTError(f"{file.name}: not a parquet file (no parquet footer at its end)")
        footer = self._fetch(file.size - 8 - length, file.size - 8)
        self.metadata = pq.read_metadata(pa.BufferReader(MAGIC + footer + tail))

    @property
    def num_rows(self) -> int:
        return self.metadata.num_rows

    def group_rows(self, group: int) -> int:
        return self.metadata.row_group(group).num_rows

    def span(self, group: int) -> tuple[int, int]:
        """The bytes of one row group: from its first column chunk (dictionary page first) to the end of
        its last."""
        row_group = self.metadata.row_group(group)
        starts, ends = [], []
        for i in range(row_group.num_columns):
            column = row_group.column(i)
            start = column.data_page_offset
            if column.has_dictionary_page and 0 < column.dictionary_page_offset < start:
                start = column.dictionary_page_offset
            starts.append(start)
            ends.append(start + column.total_compressed_size)
        return min(starts), max(ends)

    def requests(self, groups: list[int]) -> list[tuple[list[int], int, int]]:
        """The requests that fetch ``groups`` (sorted): runs of groups whose bytes touch, each with its
        range."""
        runs: list[tuple[list[int], int, int]] = []
        for group in groups:
            start, end = self.span(group)
            if runs and runs[-1][2] == start and end - runs[-1][1] <= MAX_REQUEST_BYTES:
                runs[-1] = (runs[-1][0] + [group], runs[-1][1], end)
            else:
                runs.append(([group], start, end))
        return runs

    def read_groups(self, groups: list[int], bar: Any = None) -> Iterator[tuple[int, Any]]:
        """``(group, table)`` for each of ``groups`` (sorted), one request per run of touching groups."""
        import pyarrow.parquet as pq

        for run, start, end in self.requests(groups):
            window = _Window(self, start, self._fetch(start, end))
            if bar is not None:
                bar.update(end - start)
            reader = pq.ParquetFile(window, metadata=self.metadata)
            for group in run:
                yield group, reader.read_row_group(group)

    def _fetch(self, start: int, end: int) -> bytes:
        data = self.file.fetch(start, end)
        if len(data) != end - start:
            raise NMTError(
                f"{self.file.name}: asked for bytes {start}-{end - 1}, got {len(data)} bytes; "
                "run again to retry"
            )
        self.fetched += len(data)
        return data


class _Window:
    """A read-only file of the parquet file's size whose bytes ``start`` to ``start + len(data)`` are
    at hand: what pyarrow reads row groups from. A read outside it (a column chunk the metadata
    placed wrongly) is fetched, counted and logged, rather than failing."""

    def __init__(self, parquet: ParquetRanges, start: int, data: bytes):
        self._parquet, self._start, self._data = parquet, start, memoryview(data)
        self._pos = 0
        self.closed = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._pos, self._parquet.file.size)[whence]
        self._pos = base + offset
        return self._pos

    def read(self, n: int = -1) -> bytes:
        size = self._parquet.file.size
        end = size if n is None or n < 0 else min(self._pos + n, size)
        start, self._pos = self._pos, end
        lo, hi = start - self._start, end - self._start
        if lo >= 0 and hi <= len(self._data):
            return self._data[lo:hi].tobytes()
        log.debug(
            "%s: bytes %d-%d lie outside the row groups' ranges: fetched", self._parquet.file.name, start, end
        )
        return self._parquet._fetch(start, end)

    def close(self) -> None:
        self.closed = True


def sample_parquet(files: list[RangeFile], n: int, seed: int, desc: str = "drawing") -> Iterator[Any]:
    """``n`` rows drawn from all ``files`` in proportion to their sizes, deterministic for ``seed``, as
    pyarrow tables of one row group's drawn rows each.

    WMT14's training split is written corpus after corpus (Europarl, then CommonCrawl, then News
    Commentary), so its first rows are one corpus only. Here each file gets its share of ``n``; from
    each file, row groups are chosen in a seeded random order until they hold that share, and the share
    is drawn from them. Only the footers and those row groups are fetched (:class:`ParquetRanges`),
    and they are read a run of touching groups at a time, so memory stays near one request and traffic
    near ``n`` rows, not the 4.5M of the whole split. ``n`` >= the total means every row. One log line
    per file says what was fetched and drawn; a bar counts the bytes.
    """
    rng = np.random.default_rng(seed)
    parquet = [ParquetRanges(f) for f in files]
    quotas = _proportional([p.num_rows for p in parquet], n)
    plans = [_plan(p, quota, rng) for p, quota in zip(parquet, quotas)]
    total = sum(end - start for p, (groups, _) in zip(parquet, plans) for _, start, end in p.requests(groups))
    with progress_bar(total=total, desc=desc, unit="B", unit_scale=True, leave=False) as bar:
        for p, quota, (groups, rows) in zip(parquet, quotas, plans):
            for group, table in p.read_groups(groups, bar):
                yield table.take(rows[group])
            _log_file(p, quota, len(groups))


def read_parquet(files: list[RangeFile]) -> Iterator[Any]:
    """Every row of ``files``, a row group at a time (valid/test: small, fetched whole)."""
    for f in files:
        p = ParquetRanges(f)
        groups = list(range(p.metadata.num_row_groups))
        for _, table in p.read_groups(groups):
            yield table
        _log_file(p, p.num_rows, len(groups))


def _plan(p: ParquetRanges, quota: int, rng: np.random.Generator) -> tuple[list[int], dict[int, np.ndarray]]:
    """The row groups to read (sorted) and the rows to take from each, for a share of ``quota`` rows."""
    if quota == 0:
        return [], {}
    groups, rows = [], 0
    for g in rng.permutation(p.metadata.num_row_groups).tolist():
        groups.append(g)
        rows += p.group_rows(g)
        if rows >= quota:
            break
    groups.sort()
    starts = np.cumsum([0] + [p.group_rows(g) for g in groups])
    chosen = np.sort(rng.choice(int(starts[-1]), quota, replace=False))
    bounds = np.searchsorted(chosen, starts)
    taken = {g: chosen[bounds[i] : bounds[i + 1]] - starts[i] for i, g in enumerate(groups)}
    return [g for g in groups if len(taken[g])], taken


def _log_file(p: ParquetRanges, rows: int, groups: int) -> None:
    log.info(
        "%s: %s of %s rows drawn from %d of %d row groups, %s of %s bytes fetched",
        p.file.name,
        f"{rows:,}",
        f"{p.num_rows:,}",
        groups,
        p.metadata.num_row_groups,
        f"{p.fetched:,}",
        f"{p.file.size:,}",
    )


def _proportional(sizes: list[int], n: int) -> list[int]:
    """Split ``n`` over parts of these sizes in proportion (largest remainders), none above its size."""
    total = sum(sizes)
    if n >= total:
        return list(sizes)
    exact = [n * size / total for size in sizes]
    quotas = [int(x) for x in exact]
    by_remainder = sorted(range(len(sizes)), key=lambda i: quotas[i] - exact[i])
    for i in by_remainder[: n - sum(quotas)]:
        quotas[i] += 1
    return quotas
