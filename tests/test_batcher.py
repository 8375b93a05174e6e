"""The service's queue and worker processes without a model (tests/serve_fakes.py): batching, a job whose
client left is never decoded, a batch past its deadline stops its worker, which comes back, a crashed
worker comes back, and an app served twice (a second event loop) still decodes.

Most tests share one batcher, started once (a worker process takes a second or two to start: it imports
torch); the others start and stop a batcher of their own."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from serve_fakes import failing_factory, fake_factory

from nmt.errors import NMTError
from nmt.serve.batcher import Batcher, QueueFull
from nmt.serve.telemetry import ServiceMetrics
from nmt.serve.workers import Refused, ServerStopping, Worker, WorkerTimeout


def sample(metrics: ServiceMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def make_batcher(workers: int = 1, queue_size: int = 8) -> Batcher:
    pool = [Worker(fake_factory, threads=1, name=f"worker {i}") for i in range(workers)]
    return Batcher(pool, max_tokens=100, queue_size=queue_size, metrics=ServiceMetrics())


async def answer(batcher: Batcher, ids, settings=None, timeout: float = 30.0):
    loop = asyncio.get_running_loop()
    job = batcher.submit(ids, repr(settings), settings or {}, loop.time() + timeout)
    return await job.future


# The event loop that the shared batcher (the fixture's) serves on, in a thread of its own.
SERVING: dict[Batcher, asyncio.AbstractEventLoop] = {}


@pytest.fixture(scope="module")
def batcher():
    """One batcher for the module's tests, started once on an event loop in a thread of its own: its
    worker process is started once, and again only after a test stops or kills it."""
    batcher = make_batcher()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="serving loop", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(batcher.start(), loop).result()
    SERVING[batcher] = loop
    yield batcher
    del SERVING[batcher]
    asyncio.run_coroutine_threadsafe(batcher.stop(), loop).result()
    asyncio.run_coroutine_threadsafe(loop.shutdown_default_executor(), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def run(batcher: Batcher, coro_fn):
    """``coro_fn()`` on the shared batcher's loop, or (another batcher) on a loop of its own that starts
    the batcher before and stops it after."""
    if batcher in SERVING:
        return asyncio.run_coroutine_threadsafe(coro_fn(), SERVING[batcher]).result(timeout=300)

    async def main():
        await batcher.start()
        try:
            return await coro_fn()
        finally:
            await batcher.stop()

    return asyncio.run(main())


def test_waiting_jobs_with_equal_settings_share_a_batch(batcher):
    async def scenario():
        slow = asyncio.ensure_future(answer(batcher, [[1]], {"sleep": 0.5}))
        await asyncio.sleep(0.2)  # the worker has the slow job
        rest = [asyncio.ensure_future(answer(batcher, [[i, i]])) for i in range(2, 6)]
        return await slow, await asyncio.gather(*rest)

    before = batcher.batches
    slow, rest = run(batcher, scenario)
    assert slow[0] == [[1]] and [ids for ids, _ in rest] == [[[i, i]] for i in range(2, 6)]
    assert batcher.batches - before == 2  # the four waiting jobs went in one batch
    assert sample(batcher.metrics, "nmt_batch_requests_count") >= 2


def test_jobs_are_joined_only_while_their_searches_fit_the_memory_limit():
    """serve.max_search_mb: waiting jobs with equal settings share a batch only as far as their search
    memory (Job.memory) fits; a job over it alone is still decoded, alone."""
    pool = [Worker(fake_factory, threads=1, name="worker 0")]
    batcher = Batcher(pool, max_tokens=100, queue_size=8, metrics=ServiceMetrics(), max_memory=100)

    async def scenario():
        loop = asyncio.get_running_loop()
        slow = batcher.submit([[1]], "key", {"sleep": 0.5}, loop.time() + 30)
        await asyncio.sleep(0.2)  # the worker has the slow job; the others wait and are taken together
        jobs = [
            batcher.submit([[i]], "key", {}, loop.time() + 30, memory)
            for i, memory in enumerate([60, 30, 20, 150, 10])
        ]
        await asyncio.gather(slow.future, *(job.future for job in jobs))
        return [job.future.result() for job in jobs]

    before = batcher.batches
    answers = run(batcher, scenario)
    assert [ids for ids, _ in answers] == [[[i]] for i in range(5)]
    # in queue order: [60, 30, 10] (20 and 150 do not fit beside them), then [20], then [150] alone;
    # without the limit all five would have shared one batch
    assert batcher.batches - before == 4


def test_a_job_cancelled_while_queued_is_never_decoded_and_frees_its_place(batcher):
    async def scenario():
        loop = asyncio.get_running_loop()
        slow = batcher.submit([[1]], "slow", {"sleep": 0.5}, loop.time() + 30)
        await asyncio.sleep(0.2)
        gone = batcher.submit([[2]], "fast", {}, loop.time() + 30)
        assert len(batcher.pending) == 1
        batcher.cancel(gone, "disconnected")
        assert not batcher.pending  # the place in the queue is free at once
        await slow.future
        await asyncio.sleep(0.3)  # the worker is idle: it would have taken the job by now
        return gone

    before = batcher.batches
    gone = run(batcher, scenario)
    assert gone.future.cancelled() and batcher.batches - before == 1
    assert sample(batcher.metrics, "nmt_requests_dropped_total", reason="disconnected") == 1


def test_a_job_past_its_deadline_in_the_queue_is_dropped(batcher):
    async def scenario():
        loop = asyncio.get_running_loop()
        slow = batcher.submit([[1]], "slow", {"sleep": 0.6}, loop.time() + 30)
        await asyncio.sleep(0.1)
        late = batcher.submit([[2]], "fast", {}, loop.time() + 0.2)
        await slow.future
        await asyncio.sleep(0.1)
        return late

    before = batcher.batches
    late = run(batcher, scenario)
    assert late.future.cancelled() and batcher.batches - before == 1
    assert sample(batcher.metrics, "nmt_requests_dropped_total", reason="timeout") == 1


def test_a_full_queue_refuses(batcher):
    async def scenario():
        loop = asyncio.get_running_loop()
        jobs = [batcher.submit([[1]], "slow", {"sleep": 0.3}, loop.time() + 30)]
        await asyncio.sleep(0.1)
        jobs += [batcher.submit([[i]], f"k{i}", {}, loop.time() + 30) for i in range(8)]
        with pytest.raises(QueueFull):
            batcher.submit([[9]], "k9", {}, loop.time() + 30)
        await asyncio.gather(*(job.future for job in jobs))

    run(batcher, scenario)


def test_refusals_and_errors_fail_their_batch_only(batcher):
    async def scenario():
        with pytest.raises(Refused, match="decoding.beam_size"):
            await answer(batcher, [[1]], {"refuse": True})
        with pytest.raises(RuntimeError, match="a bug in the fake worker"):
            await answer(batcher, [[1]], {"fail": True})
        return await answer(batcher, [[7]])

    assert run(batcher, scenario)[0] == [[7]]


def test_a_batch_past_its_deadline_stops_its_worker_which_is_started_again(batcher):
    async def scenario():
        started = time.monotonic()
        with pytest.raises(WorkerTimeout):
            await answer(batcher, [[1]], {"sleep": 60}, timeout=1.0)
        stopped_after = time.monotonic() - started
        assert not batcher.running  # the worker is starting again
        ids, pid = await answer(batcher, [[2]])
        return stopped_after, pid

    before = sample(batcher.metrics, "nmt_worker_restarts_total", reason="timeout")
    stopped_after, pid = run(batcher, scenario)
    assert stopped_after < 5 and pid != os.getpid()
    assert sample(batcher.metrics, "nmt_worker_restarts_total", reason="timeout") == before + 1


def test_a_crashed_worker_is_started_again_and_the_service_says_so_meanwhile(batcher):
    async def scenario():
        pid = (await answer(batcher, [[1]]))[1]
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if not batcher.running:
                break
            await asyncio.sleep(0.01)
        assert not batcher.running  # a dead worker is not reported as running
        for _ in range(600):
            if batcher.running:
                break
            await asyncio.sleep(0.1)
        assert batcher.running
        return pid, (await answer(batcher, [[2]]))[1]

    before = sample(batcher.metrics, "nmt_worker_restarts_total", reason="crash")
    old, new = run(batcher, scenario)
    assert old != new
    assert sample(batcher.metrics, "nmt_worker_restarts_total", reason="crash") == before + 1


def test_a_crash_while_decoding_fails_the_batch_and_the_worker_comes_back(batcher):
    async def scenario():
        with pytest.raises(Exception, match="died"):
            await answer(batcher, [[1]], {"crash": True})
        return await answer(batcher, [[2]])

    assert run(batcher, scenario)[0] == [[2]]


def test_ctrl_c_leaves_a_worker_to_finish_its_batch(batcher):
    """SIGINT reaches every process of the terminal's group: the server handles it, the worker ignores
    it and answers the batch it holds."""

    async def scenario():
        return await answer(batcher, [[3]], {"interrupt": True, "sleep": 0.3})

    assert run(batcher, scenario)[0] == [[3]]


def test_the_jobs_a_stopping_server_holds_are_told_to_retry():
    """The batch a worker holds when the server stops and the jobs still queued get ServerStopping (503
    with Retry-After), not a worker failure (500)."""
    batcher = make_batcher()

    async def main():
        await batcher.start()
        loop = asyncio.get_running_loop()
        held = batcher.submit([[1]], "slow", {"sleep": 1.0}, loop.time() + 30)
        await asyncio.sleep(0.3)  # the worker has it
        queued = batcher.submit([[2]], "other", {}, loop.time() + 30)
        await batcher.stop()
        return held, queued

    held, queued = asyncio.run(main())
    for job in (held, queued):
        assert isinstance(job.future.exception(), ServerStopping), job.future.exception()


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="POSIX named semaphores live in /dev/shm")
def test_a_worker_stopped_for_a_timeout_leaves_no_semaphore_in_dev_shm():
    """tqdm's default lock is a multiprocessing lock: a named semaphore that a killed worker process
    would leave in /dev/shm until the server exits."""
    worker = Worker(fake_factory, threads=1, name="worker 0")
    worker.start()
    try:
        names = asyncio.run(worker.run([([[1]], {"tqdm": True})], 30))[0]
    finally:
        worker.kill()
    assert not [name for name in names if Path(f"/dev/shm/sem.{name.lstrip('/')}").exists()], names


def test_two_workers_decode_two_batches_at_once():
    batcher = make_batcher(workers=2)

    async def scenario():
        started = time.monotonic()
        answers = await asyncio.gather(*(answer(batcher, [[i]], {"sleep": 1.0, "k": i}) for i in range(2)))
        return time.monotonic() - started, {pid for _, pid in answers}

    elapsed, pids = run(batcher, scenario)
    assert len(pids) == 2 and elapsed < 1.9


def test_a_batcher_served_again_on_another_event_loop_still_decodes():
    """Stopped, then started on a new event loop (an app served twice), a batcher decodes again."""
    batcher = make_batcher()
    first = run(batcher, lambda: answer(batcher, [[1]]))
    second = run(batcher, lambda: answer(batcher, [[2]]))
    assert first[0] == [[1]] and second[0] == [[2]] and first[1] != second[1]  # a worker started again


def test_a_worker_that_cannot_start_is_an_error_naming_why():
    batcher = Batcher([Worker(failing_factory, 1, "worker 0")], 100, 8, ServiceMetrics())
    with pytest.raises(NMTError, match="worker 0 could not start: ct2_model=/nowhere: no model here"):
        run(batcher, lambda: asyncio.sleep(0))


def test_a_server_stopped_while_a_worker_starts_again_leaves_no_process_behind():
    """A worker started again (after a crash) is still starting in its thread when the server stops:
    the stop waits for it and stops it, so no process outlives the server (a worker ignores SIGTERM,
    so one left behind would hold up the interpreter's exit)."""
    name = "worker 7"  # a name no other test's worker has
    batcher = Batcher([Worker(fake_factory, 1, name)], 100, 8, ServiceMetrics())

    async def main():
        await batcher.start()
        os.kill(batcher.workers[0].process.pid, signal.SIGKILL)
        for _ in range(500):  # until the supervisor has begun starting it again
            if batcher.restarts:
                break
            await asyncio.sleep(0.01)
        assert batcher.restarts == 1 and not batcher.workers[0].ready  # mid-start
        await batcher.stop()

    asyncio.run(main())  # returns once the executor's threads, the start among them, have ended
    assert not [p for p in multiprocessing.active_children() if p.name == name]
