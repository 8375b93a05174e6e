"""What every source shares: the split names and the shape of what a source hands out."""

from __future__ import annotations

SPLITS = ("train", "valid", "test")
RawCorpus = dict[str, dict[str, list[str]]]
Chunk = tuple[list[str], list[str]]  # source lines, target lines


def one_line(e: Exception) -> str:
    """An exception as one line: its type and the first line of its message."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")
