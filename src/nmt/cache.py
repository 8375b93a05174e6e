"""Small helpers for the on-disk caches of prepared data: content keys and atomic writes."""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import IO, Any

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


def config_dict(cfg: Any) -> dict:
    """A plain, resolved dict of a dataclass or DictConfig, so it can be hashed and stored as JSON."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    if is_dataclass(cfg):
        return asdict(cfg)
    return dict(cfg)


def hash_key(obj: Any) -> str:
    """Short stable hash of JSON-serialisable settings: the name of a cache folder."""
    return hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


def file_digest(path: Path) -> dict:
    """Size and SHA-1 of a file: identifies training text whatever its name or modification time."""
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"size": os.path.getsize(path), "sha1": h.hexdigest()}


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Fill a temporary folder and rename it to ``path`` at the end.

    An interrupted run leaves no half-written cache behind that a later run would trust.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    _remove_abandoned(path)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if path.exists():  # someone else finished first; theirs is as good as ours
            shutil.rmtree(tmp)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def preparing(path: Path) -> Iterator[None]:
    """Hold the lock of the cache folder ``path`` (``path.lock`` beside it) while preparing it: jobs that
    need the same data (a sweep's) prepare it once; the others wait, then find it cached. The lock goes
    with the process that holds it, killed or not (flock), so a stale lock never blocks anyone."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f"{path.name}.lock"), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process preparing %s", path)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _remove_abandoned(path: Path) -> None:
    """Delete the temporary folders of ``path`` left by a process of this host that is gone (killed
    mid-way): a prepared corpus can be gigabytes, which must not pile up at every interrupted run. Other
    hosts' folders (a shared filesystem) are theirs to clean."""
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.tmp-{glob.escape(socket.gethostname())}-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host is still there (another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


_UMASK = os.umask(0o022)  # read once, at import: os.umask can only be read by setting it
os.umask(_UMASK)


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """The one atomic write of the package (prepared data, checkpoints, shortlists, reports): ``write``
    fills a temporary file beside ``path``, which is fsynced and renamed over ``path``, so a file that
    exists is complete and a resumed job can trust every file it finds. The temporary file is made by
    ``mkstemp`` (a new name, opened with O_EXCL): a file or symlink planted at a predictable name is never
    written through. Its mode is what ``open`` would give (0666 less the umask), on purpose: mkstemp's
    0600 would hide a group-shared cache's or ``outputs/``'s files from the others."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write` of ``text`` in UTF-8."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))
