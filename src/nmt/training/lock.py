"""One training process per run dir: a second one (a job submitted twice, a requeue while the first is
alive) would interleave its checkpoints with the first's, and each would prune the other's step files.

The lock is an ``flock`` on ``<run dir>/train.lock``, which holds the holder's PID. The kernel drops it
when its holder dies, however it dies, so a lock left by a dead process is simply taken over.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from nmt.errors import NMTError
from nmt.training.distributed import launched_rank

log = logging.getLogger(__name__)

LOCK_NAME = "train.lock"


@contextlib.contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for this training process, or refuse in one line naming the PID that holds it.
    Under torchrun rank 0 holds it for the job's ranks (the others do not take it: they write nothing
    there and would refuse each other). A run dir this made and left empty is removed."""
    if launched_rank() != 0:  # torchrun, srun or submitit: known before the group is joined
        yield
        return
    made = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise NMTError(
                f"{run_dir}: another training process (PID {holder(fd) or '?'}) is running in this "
                f"hydra.run.dir ({path}); wait for it to end, stop it, or train in another hydra.run.dir"
            ) from None
        stale = holder(fd)
        if stale and stale != str(os.getpid()):
            log.warning("%s: taking over the lock of PID %s, which ended without releasing it", path, stale)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # released: no PID left to name
    finally:
        os.close(fd)
        if made and [p.name for p in run_dir.iterdir()] == [LOCK_NAME]:
            path.unlink()
            run_dir.rmdir()


def holder(fd: int) -> str:
    """The PID written in the lock file, "" when there is none."""
    return os.pread(fd, 32, 0).decode(errors="replace").strip()
