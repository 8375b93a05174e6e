"""Where results are written, so that nothing a user wrote is lost to a result: an output file is never one
of the files it is made from, and an output directory is filled beside its place and replaces what is
there only when that is an earlier output of the same kind (``force=true``).

- :func:`check_output_file`: refuse ``output=`` naming an input (by its name, a symbolic or a hard link):
  opening it for writing would empty the input before a line of it is read.
- :func:`check_output_dir` and :func:`replace_output_dir`: the one rule of every ``force=`` that replaces a
  directory. A directory is replaced only when it holds ``record``, the file its writer leaves in every
  output (``nmt_export.json`` of a CTranslate2 export), so ``output=outputs/RUN`` never deletes a run;
  a symbolic link is never followed (nor replaced); the new directory is filled under a name of its
  own (two writers to one output do not share it) and renamed into place at the end, so an interrupted
  writer leaves the old output whole and never a half-written one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

from nmt.cache import process_alive
from nmt.errors import NMTError

# ------------------------------------------------------------------------------------------ output files
Input = str | Path | IO | None


def check_output_file(output: str | Path | None, inputs: Mapping[str, Input | Sequence[Input]]) -> None:
    """Refuse (NMTError) an ``output`` file that is one of ``inputs`` (``{"input": path, ...}``, named by
    the keys the user set them with; a list: several files of one key, e.g. an ensemble's checkpoints;
    an open file, e.g. ``sys.stdin`` redirected from a file, is compared by what it reads): the same
    file by name, through a symbolic link or as a hard link. Missing files and None are no one's."""
    if output is None:
        return
    try:
        written = os.stat(output)
    except OSError:
        return  # not there yet: it is no input
    pairs = [(k, p) for k, v in inputs.items() for p in (v if isinstance(v, (list, tuple)) else [v])]
    for key, path in pairs:
        try:
            read = os.stat(path) if isinstance(path, (str, Path)) else os.fstat(path.fileno())
        except (AttributeError, OSError, ValueError):  # None, or no file behind it (a closed stream)
            continue
        if os.path.samestat(written, read):
            name = f"{key}={path}" if isinstance(path, (str, Path)) else key
            raise NMTError(
                f"output={output} is {name}: writing it would empty it before it is read; "
                "choose another output file"
            )


# ------------------------------------------------------------------------------------ output directories
def check_output_dir(output: str | Path, record: str, force: bool, writer: str) -> None:
    """Refuse (NMTError), before any work, to write the directory ``output`` over anything but an earlier
    output of ``writer`` (e.g. ``scripts/export_ct2.py``), which holds the file ``record``, and over
    that only with ``force``. A symbolic link is refused whatever it points to: the directory behind
    it may be anything, and replacing the link would leave the old output in place."""
    output = Path(output)
    if output.is_symlink():
        raise NMTError(f"output={output} is a symbolic link; name a directory, not a link to one")
    if not output.exists():
        return
    if not output.is_dir():
        raise NMTError(f"output={output} is a file, not a directory of {writer}; choose another output")
    if not any(output.iterdir()):
        return  # an empty directory (made for the output) holds nothing to lose
    marker = output / record
    if marker.is_symlink() or not marker.is_file():
        raise NMTError(
            f"output={output} is a directory that {writer} did not write (no {record}), so force=true does "
            "not replace it; choose a new directory, or remove this one yourself"
        )
    if not force:
        raise NMTError(f"output={output} already exists; add force=true to replace it, or choose another")


@contextlib.contextmanager
def replace_output_dir(output: str | Path, record: str, force: bool, writer: str) -> Iterator[Path]:
    """A new, empty directory beside ``output`` for ``writer`` to fill; at the end of the block it becomes
    ``output``, replacing, with ``force``, an earlier output of ``writer`` (one holding ``record``:
    :func:`check_output_dir`, checked again here). The block's writer must put ``record`` into it. On
    an error nothing changes at ``output`` and the new directory is deleted."""
    output = Path(output)
    check_output_dir(output, record, force, writer)
    output.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(output)
    tmp = Path(tempfile.mkdtemp(prefix=f"{_prefix(output)}{os.getpid()}-", dir=output.parent))
    try:
        yield tmp
        if not (tmp / record).is_file():
            raise NMTError(f"{writer} did not write {record} into {output}; nothing was replaced")
        check_output_dir(output, record, force, writer)  # again: the block may have run for minutes
        old = None
        if output.exists():
            old = Path(tempfile.mkdtemp(prefix=f"{_prefix(output)}{os.getpid()}-old-", dir=output.parent))
            os.replace(output, old / output.name)  # no window in which a half-deleted output is there
        try:
            os.rename(tmp, output)
        except OSError:
            if old is not None:
                os.replace(old / output.name, output)
            raise NMTError(f"output={output} was written by another process meanwhile; run again") from None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _prefix(output: Path) -> str:
    """The start of the temporary names beside ``output``: hidden, and naming this host and (next) the
    process, so that an abandoned one can be told apart and cleaned by a later writer."""
    return f".{output.name}.tmp-{socket.gethostname()}-"


def _remove_abandoned(output: Path) -> None:
    """Delete the temporary directories of ``output`` left by a process of this host that is gone (killed
    mid-way): an export can be hundreds of megabytes. Other hosts' (a shared filesystem) are theirs."""
    prefix = _prefix(output)
    for tmp in output.parent.iterdir():
        if not tmp.name.startswith(prefix) or tmp.is_symlink() or not tmp.is_dir():
            continue
        pid = tmp.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)
