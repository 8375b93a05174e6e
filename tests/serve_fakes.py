"""Work functions for the service's worker processes that need no model: they answer at once, sleep,
crash or refuse, as a job's settings say. Module-level, so a spawned worker process can import them."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from tqdm.auto import tqdm

from nmt.errors import NMTError


def fake_work(items: list[tuple[list[list[int]], dict[str, Any]]]) -> list[Any]:
    """Per job: its ids and the worker's pid, after ``sleep`` seconds; ``crash`` ends the process,
    ``refuse`` raises NMTError, ``fail`` another error, ``interrupt`` sends the worker a SIGINT (Ctrl-C)
    first, ``tqdm`` answers the names of the named semaphores behind tqdm's lock instead."""
    settings = items[0][1]
    if settings.get("interrupt"):
        os.kill(os.getpid(), signal.SIGINT)
    if settings.get("tqdm"):
        with tqdm(total=1, disable=True):  # as the search makes one, progress off
            pass
        locks = getattr(tqdm.get_lock(), "locks", [])
        return [[lock._semlock.name for lock in locks if hasattr(lock, "_semlock")] for _ in items]
    time.sleep(settings.get("sleep", 0))
    if settings.get("crash"):
        os._exit(3)
    if settings.get("refuse"):
        raise NMTError("decoding.beam_size=3: refused by the fake worker")
    if settings.get("fail"):
        raise ValueError("a bug in the fake worker")
    return [(ids, os.getpid()) for ids, _ in items]


def fake_factory() -> Any:
    return fake_work


def failing_factory() -> Any:
    raise NMTError("ct2_model=/nowhere: no model here")
