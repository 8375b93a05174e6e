"""Decoding in worker processes: each worker is a process (``spawn``: nothing of the server's threads,
OpenMP or CTranslate2 pools is inherited) that builds its work function once and then decodes one
batch at a time, sent and answered over a pipe.

Processes rather than threads, for two reasons. The search is Python stepping through PyTorch calls,
so threads would share one interpreter lock, and ``torch.set_num_threads`` is per process, not per
thread: N processes of one intra-op thread each use N cores for N batches at once, where one process
of N threads spends much of each small step synchronising them. And a process can be stopped: a
batch that runs past its deadline is killed with its process, which is started again, so no request
holds a worker longer than ``serve.timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import signal
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch
from tqdm.std import tqdm

from nmt.errors import NMTError

log = logging.getLogger(__name__)

# Builds, in the worker process, the function that decodes one batch; must pickle (a module-level
# function or a functools.partial of one).
WorkFactory = Callable[[], Callable[[Any], Any]]


class WorkerFailed(Exception):
    """The worker process died or was stopped while it had the batch; it is started again."""


class WorkerTimeout(WorkerFailed):
    """The batch ran past its deadline: the worker was stopped and is started again."""


class ServerStopping(WorkerFailed):
    """The server stopped before the job was decoded: the client may retry (503)."""


class Refused(Exception):
    """The work function refused the batch with an NMTError (settings the backend cannot decode)."""


def worker_main(conn: Connection, factory: WorkFactory, threads: int) -> None:
    """The worker process: build the work function, say ready, then answer batch after batch until the
    pipe closes (the server stopped) or a ``None`` arrives.

    Ctrl-C reaches every process of the terminal's process group, workers included, and so does the
    SIGTERM of a service manager that stops the whole group (systemd's default ``KillMode=control-group``,
    ``kill -TERM -PGID``): both are the server's to handle (uvicorn finishes the requests in flight, then
    stops the workers, killing one that has not ended within its grace), so a worker ignores them and
    finishes the batch it holds. Progress bars get a thread lock instead of tqdm's default, a
    multiprocessing lock whose named semaphore in /dev/shm would outlive a worker killed for a timeout
    until the server exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    tqdm.set_lock(threading.RLock())
    torch.set_num_threads(threads)
    try:
        work = factory()
    except Exception as e:  # noqa: BLE001 - reported to the server, which refuses to start
        conn.send(("failed", str(e) if isinstance(e, NMTError) else traceback.format_exc()))
        return
    conn.send(("ready", None))
    while True:
        try:
            batch = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if batch is None:
            return
        try:
            conn.send(("ok", work(batch)))
        except NMTError as e:
            conn.send(("refused", str(e)))
        except Exception:  # noqa: BLE001 - the batch fails, the worker goes on
            conn.send(("error", traceback.format_exc()))


class Worker:
    """One worker process and the pipe to it; started again after it dies or is stopped."""

    def __init__(self, factory: WorkFactory, threads: int, name: str):
        self.factory, self.threads, self.name = factory, threads, name
        self.process: multiprocessing.process.BaseProcess | None = None
        self.conn: Connection | None = None
        self.ready = False  # started and not known to be dead
        self.busy = False

    @property
    def alive(self) -> bool:
        return self.ready and self.process is not None and self.process.is_alive()

    def start(self) -> None:
        """Start the process and wait (blocking) until it is ready; NMTError, with the worker's own
        message, when it cannot start (a model that does not load)."""
        self.stop()
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        process = context.Process(
            target=worker_main, args=(child, self.factory, self.threads), name=self.name, daemon=True
        )
        process.start()
        child.close()
        try:
            kind, message = parent.recv()
        except EOFError:
            process.join()
            raise NMTError(f"{self.name} exited with status {process.exitcode} while starting") from None
        if kind != "ready":
            process.join()
            parent.close()
            raise NMTError(f"{self.name} could not start: {message}")
        self.process, self.conn, self.ready = process, parent, True

    async def run(self, batch: Any, timeout: float) -> Any:
        """The work function's answer to ``batch``; WorkerTimeout after ``timeout`` seconds (the process
        is killed), WorkerFailed when it dies, Refused for an NMTError, RuntimeError for another error."""
        if not self.alive or self.conn is None:
            raise WorkerFailed(f"{self.name} is not running")
        loop = asyncio.get_running_loop()
        answered = loop.create_future()
        fd = self.conn.fileno()
        self.busy = True
        try:
            self.conn.send(batch)
            loop.add_reader(fd, lambda: answered.done() or answered.set_result(None))
            try:  # asyncio.wait, not wait_for: Python < 3.12's wait_for can swallow a cancellation
                await asyncio.wait({answered}, timeout=max(timeout, 0.0))
            finally:
                with contextlib.suppress(ValueError, OSError):  # ValueError: the pipe is closed
                    loop.remove_reader(fd)
            if not answered.done():
                self.kill()
                raise WorkerTimeout(f"{self.name} was stopped after {timeout:.1f} s")
            try:
                kind, value = self.conn.recv()
            except (EOFError, OSError):
                self.kill()
                raise WorkerFailed(f"{self.name} died while decoding") from None
        finally:
            self.busy = False
        if kind == "ok":
            return value
        if kind == "refused":
            raise Refused(value)
        raise RuntimeError(f"{self.name}: {value}")

    def kill(self) -> None:
        """Stop the process now (a batch past its deadline, or the server stopping)."""
        self.ready = False
        if self.process is not None and self.process.is_alive():
            self.process.kill()
        if self.process is not None:
            self.process.join()
        if self.conn is not None:
            self.conn.close()
        self.process, self.conn = None, None

    def stop(self, grace_s: float = 5.0) -> None:
        """Ask the process to end, then kill it if it has not within ``grace_s``."""
        if self.process is not None and self.conn is not None and self.process.is_alive():
            with contextlib.suppress(OSError):
                self.conn.send(None)
            self.process.join(grace_s)
        self.kill()


class InlineWorker:
    """The work function in a thread of the server's own process, for a Translator made in code (one
    that cannot be built again in another process). It cannot be stopped: a batch past its deadline
    runs to its end (its requests get their 504 on time meanwhile)."""

    def __init__(self, work: Callable[[Any], Any], name: str):
        self.work, self.name = work, name
        self.alive, self.busy = True, False

    def start(self) -> None:
        self.alive = True

    def stop(self) -> None:
        """Nothing to stop: the thread ends with its batch."""

    async def run(self, batch: Any, timeout: float) -> Any:
        """The work function's answer to ``batch``; Refused for an NMTError."""
        self.busy = True
        try:
            return await asyncio.get_running_loop().run_in_executor(None, self.work, batch)
        except NMTError as e:
            raise Refused(str(e)) from None
        finally:
            self.busy = False
