"""Requests decoded together: concurrent requests with the same settings share one search, up to
``serve.max_tokens`` source subwords and ``serve.max_search_mb`` of search memory, and wait in a bounded
queue for one of the worker processes.

Each request is a :class:`Job`. The event loop only queues jobs and hands out results; each worker
(:mod:`nmt.serve.workers`) has a consumer task that takes the oldest job and every queued job with its
settings that fits beside it, and sends them to its process, so the server keeps answering (``/health``,
``/metrics``, a full queue's 503) while it translates. A job that alone exceeds ``max_tokens`` or
``max_memory`` is decoded alone (its worker cuts its search to fit). Batching never changes a
translation: the search decodes each sentence as it would decode it alone.

Everything bound to an event loop (the wake-up event, the consumer tasks) is made in :meth:`Batcher.start`
on the loop that serves, so an app can be served again (a second server, a second test client, a
notebook restart). A job whose client left, or whose deadline passed, before a worker took it is
dropped without being decoded. A consumer that fails is started again, a worker process that died
or ran past a deadline too; :attr:`Batcher.running` says whether all of them are up (``/health``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nmt.errors import NMTError
from nmt.serve.telemetry import ServiceMetrics
from nmt.serve.workers import ServerStopping, Worker, WorkerFailed, WorkerTimeout

log = logging.getLogger(__name__)

POLL_S = 1.0  # how often an idle consumer checks that its worker process is alive
RESTART_BACKOFF_S = (0.5, 30.0)  # first and longest wait between failed starts of a worker


class QueueFull(Exception):
    """No room for another request: the client should retry later."""


@dataclass
class Job:
    ids: list[list[int]]  # the request's sentences as source subwords
    key: Hashable  # jobs with equal keys (decoding settings) may share a search
    settings: Any  # what the work function needs besides the sentences
    deadline: float  # loop time after which nobody waits for the answer
    future: asyncio.Future = field(repr=False)
    memory: int = 0  # bytes its search keeps (serve.max_search_mb bounds a batch's sum)

    @property
    def tokens(self) -> int:
        return sum(len(s) + 1 for s in self.ids)

    @property
    def sentences(self) -> int:
        return len(self.ids)


class Batcher:
    """The queue of jobs and the consumers that hand them to ``workers``; a worker's answer to a batch
    is one result per job, in order."""

    def __init__(
        self,
        workers: Sequence[Worker],
        max_tokens: int,
        queue_size: int,
        metrics: ServiceMetrics,
        max_memory: float = math.inf,
    ):
        """``max_memory``: the bytes the searches of a batch's jobs may keep together (``Job.memory``)."""
        self.workers, self.max_tokens, self.queue_size, self.metrics = (
            workers,
            max_tokens,
            queue_size,
            metrics,
        )
        self.max_memory = max_memory
        self.pending: deque[Job] = deque()
        self.batches = 0  # decoded so far
        self.restarts = 0  # of workers and consumers
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._starting: set[asyncio.Future] = set()  # workers started again, in executor threads

    # ------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """On the serving loop: start the worker processes (in parallel) and their consumers. NMTError
        when a worker cannot start."""
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        await asyncio.gather(*(loop.run_in_executor(None, w.start) for w in self.workers if not w.alive))
        self._tasks = [asyncio.create_task(self._supervise(w)) for w in self.workers]
        self._update_gauges()

    async def stop(self) -> None:
        """Stop the consumers and the worker processes; waiting jobs, and a batch a worker still holds,
        fail with ServerStopping (503: retry)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        # a restart outlives its cancelled consumer (its thread runs on): let it finish, then stop what
        # it started, or that process would outlive the server (and hold up the interpreter's exit)
        await asyncio.gather(*self._starting, return_exceptions=True)
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, w.stop) for w in self.workers))
        while self.pending:
            job = self.pending.popleft()
            if not job.future.done():
                job.future.set_exception(ServerStopping("the server is stopping; retry later"))
        self._update_gauges()

    @property
    def running(self) -> bool:
        """Every consumer task and every worker process is up (False while one is started again)."""
        return (
            bool(self._tasks)
            and not any(t.done() for t in self._tasks)
            and all(w.alive for w in self.workers)
        )

    # ------------------------------------------------------------------------------ the queue
    def submit(
        self, ids: list[list[int]], key: Hashable, settings: Any, deadline: float, memory: int = 0
    ) -> Job:
        """Queue a job (on the event loop) whose search keeps ``memory`` bytes; QueueFull when
        ``queue_size`` jobs are already waiting. Cancelling the job's future takes it out of the queue."""
        if len(self.pending) >= self.queue_size:
            raise QueueFull(f"{len(self.pending)} requests are waiting")
        if self._wake is None:
            raise WorkerFailed("the service is not started")
        job = Job(ids, key, settings, deadline, asyncio.get_running_loop().create_future(), memory)
        self.pending.append(job)
        job.future.add_done_callback(lambda _: self._discard(job))
        self._wake.set()
        self._update_gauges()
        return job

    def cancel(self, job: Job, reason: str) -> None:
        """Nobody waits for ``job`` any more (``reason``: the client left, its time is up); still queued,
        it is dropped, never decoded."""
        if job in self.pending:
            self.metrics.dropped.labels(reason=reason).inc()
            self._discard(job)
        job.future.cancel()

    def _discard(self, job: Job) -> None:
        with contextlib.suppress(ValueError):  # a job taken by a worker is no longer queued
            self.pending.remove(job)
        self._update_gauges()

    def take(self) -> list[Job]:
        """The oldest job and the queued jobs with its key that fit beside it in ``max_tokens`` and
        ``max_memory``."""
        first = self.pending.popleft()
        batch, tokens, memory = [first], first.tokens, first.memory
        for job in list(self.pending):
            fits = tokens + job.tokens <= self.max_tokens and memory + job.memory <= self.max_memory
            if job.key == first.key and fits:
                self.pending.remove(job)
                batch.append(job)
                tokens += job.tokens
                memory += job.memory
        self._update_gauges()
        return batch

    def _update_gauges(self) -> None:
        self.metrics.queued.set(len(self.pending))
        self.metrics.ready.set(sum(w.alive for w in self.workers))
        self.metrics.busy.set(sum(w.busy for w in self.workers))

    # ------------------------------------------------------------------------------ the consumers
    async def _supervise(self, worker: Worker) -> None:
        """Run ``worker``'s consumer, and run it again should it fail."""
        while True:
            try:
                await self._consume(worker)
            except Exception:  # noqa: BLE001 - a bug in the loop must not end the service
                log.exception("the consumer of %s failed; starting it again", worker.name)
                self._count_restart("consumer")
                await asyncio.sleep(RESTART_BACKOFF_S[0])

    async def _consume(self, worker: Worker) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not worker.alive:
                await self._restart(worker, "crash")
            batch = await self._next_batch()
            if not batch:
                continue
            self.metrics.batch_requests.observe(len(batch))
            self.metrics.batch_sentences.observe(sum(job.sentences for job in batch))
            deadline = max(job.deadline for job in batch)
            try:
                self._update_gauges()
                results = await worker.run([(job.ids, job.settings) for job in batch], deadline - loop.time())
            except WorkerTimeout as e:
                self._fail(batch, e)
                await self._restart(worker, "timeout")
            except asyncio.CancelledError:  # stop(): the server stops before the batch is answered
                self._fail(batch, ServerStopping("the server stopped before this was translated; retry"))
                raise
            except Exception as e:  # noqa: BLE001 - handed to the waiting requests
                self._fail(batch, e)
            else:
                for job, result in zip(batch, results):
                    if not job.future.done():  # a client that went away cancelled its future
                        job.future.set_result(result)
            finally:
                self.batches += 1
                self._update_gauges()

    async def _next_batch(self) -> list[Job]:
        """The next batch of live jobs; empty after ``POLL_S`` without one. Jobs past their deadline
        are dropped here, before any work is spent on them."""
        assert self._wake is not None
        # asyncio.wait, not wait_for: Python < 3.12's wait_for can swallow a cancellation (stop())
        waiter = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({waiter}, timeout=POLL_S)
        finally:
            waiter.cancel()
        now = asyncio.get_running_loop().time()
        for job in [job for job in self.pending if job.deadline <= now]:
            self.cancel(job, "timeout")
        if not self.pending:
            self._wake.clear()
            return []
        return self.take()

    @staticmethod
    def _fail(batch: list[Job], error: Exception) -> None:
        for job in batch:
            if not job.future.done():
                job.future.set_exception(error)

    def _count_restart(self, reason: str) -> None:
        self.restarts += 1
        self.metrics.restarts.labels(reason=reason).inc()

    async def _restart(self, worker: Worker, reason: str) -> None:
        """Start ``worker`` again, waiting longer after each failed start. It is not ready from now on
        (its start, in a thread, stops what is left of it first), so no batch is sent to it meanwhile."""
        worker.ready = False
        self._count_restart(reason)
        log.warning("starting %s again (%s)", worker.name, reason)
        loop = asyncio.get_running_loop()
        wait, longest = RESTART_BACKOFF_S
        self._update_gauges()
        while True:
            starting = loop.run_in_executor(None, worker.start)
            self._starting.add(starting)
            starting.add_done_callback(self._starting.discard)
            try:
                await asyncio.shield(starting)
            except NMTError as e:
                log.error("%s did not start: %s; trying again in %.1f s", worker.name, e, wait)
                await asyncio.sleep(wait)
                wait = min(2 * wait, longest)
            else:
                self._update_gauges()
                return
