"""Requests decoded together: concurrent requests with the same settings share one search, up to
``serve.max_tokens`` source subwords, and wait in a bounded queue.

Each request is a :class:`Job`. The event loop only queues jobs and hands out results; one worker
takes the oldest job and every queued job with its settings that fits beside it, and decodes them in
a thread, so the server keeps answering (``/health``, a full queue's 503) while it translates. A job
that alone exceeds ``max_tokens`` is decoded alone. Batching never changes a translation: the search
decodes each sentence as it would decode it alone.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any


class QueueFull(Exception):
    """No room for another request: the client should retry later."""


@dataclass
class Job:
    ids: list[list[int]]  # the request's sentences as source subwords
    key: Hashable  # jobs with equal keys (decoding settings) may share a search
    settings: Any  # what the work function needs besides the sentences
    future: asyncio.Future = field(repr=False)

    @property
    def tokens(self) -> int:
        return sum(len(s) + 1 for s in self.ids)


class Batcher:
    """Queue of jobs and the worker that decodes them; ``work(jobs)`` returns one result per job."""

    def __init__(self, work: Callable[[list[Job]], list[Any]], max_tokens: int, queue_size: int):
        self.work, self.max_tokens, self.queue_size = work, max_tokens, queue_size
        self.pending: deque[Job] = deque()
        self.ready = asyncio.Event()
        self.batches = 0  # decoded so far, for /health

    def submit(self, ids: list[list[int]], key: Hashable, settings: Any) -> asyncio.Future:
        """Queue a job (on the event loop); QueueFull when ``queue_size`` jobs are already waiting."""
        if len(self.pending) >= self.queue_size:
            raise QueueFull(f"{len(self.pending)} requests are waiting")
        job = Job(ids, key, settings, asyncio.get_running_loop().create_future())
        self.pending.append(job)
        self.ready.set()
        return job.future

    def take(self) -> list[Job]:
        """The oldest job and the queued jobs with its key that fit beside it in ``max_tokens``."""
        first = self.pending.popleft()
        batch, tokens = [first], first.tokens
        for job in list(self.pending):
            if job.key == first.key and tokens + job.tokens <= self.max_tokens:
                self.pending.remove(job)
                batch.append(job)
                tokens += job.tokens
        return batch

    async def run(self) -> None:
        """Decode until cancelled; a failing batch fails its own requests only."""
        loop = asyncio.get_running_loop()
        while True:
            await self.ready.wait()
            if not self.pending:
                self.ready.clear()
                continue
            batch = self.take()
            try:
                results = await loop.run_in_executor(None, self.work, batch)
            except Exception as e:  # noqa: BLE001 - handed to the waiting requests
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(e)
            else:
                for job, result in zip(batch, results):
                    if not job.future.done():  # a client that went away cancelled its future
                        job.future.set_result(result)
            self.batches += 1
