"""Speed of the service (``scripts/benchmark_server.py``), measured from outside: the server runs in a
process of its own (``scripts/serve.py``), the clients in this one, so neither competes with the other
for the interpreter. Each client keeps one connection and sends its next request when the last is
answered (a closed loop); rows are client counts x sentences per request, with requests/s, sentences/s
and latency percentiles. ``direct`` decodes the same requests with the CTranslate2 backend in this
process, with the same threads, for the cost of the service around it (HTTP, JSON, queue, processes).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from nmt.config import DecodingOverrides, ServerLimits
from nmt.errors import NMTError


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by the nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def requests_of(sentences: Sequence[str], per_request: int, count: int) -> list[bytes]:
    """``count`` request bodies of ``per_request`` consecutive sentences each (in turn, wrapping)."""
    bodies = []
    for i in range(count):
        start = (i * per_request) % len(sentences)
        text = [sentences[(start + j) % len(sentences)] for j in range(per_request)]
        bodies.append(json.dumps({"text": text}).encode())
    return bodies


async def _client(
    host: str, port: int, bodies: list[bytes], latencies: list[float], statuses: list[int]
) -> None:
    """One keep-alive connection sending ``bodies`` (a shared list, popped) one at a time."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while bodies:
            body = bodies.pop()
            head = f"POST /translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            start = time.perf_counter()
            writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
            status = int((await reader.readline()).split()[1])
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
            statuses.append(status)
    finally:
        writer.close()


def run_clients(url: str, bodies: list[bytes], clients: int, sentences: int) -> dict[str, Any]:
    """Send ``bodies`` from ``clients`` concurrent connections; the row of the table."""
    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    statuses: list[int] = []
    todo = list(reversed(bodies))

    async def main() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(_client(host, int(port), todo, latencies, statuses) for _ in range(clients)))
        return time.perf_counter() - started

    seconds = asyncio.run(main())
    return {
        "clients": clients,
        "sentences_per_request": sentences,
        "requests": len(bodies),
        "ok": statuses.count(200),
        "busy": statuses.count(503),
        "seconds": round(seconds, 3),
        "requests_per_s": round(len(bodies) / seconds, 2),
        "sentences_per_s": round(len(bodies) * sentences / seconds, 1),
        "p50_ms": round(1000 * percentile(latencies, 0.50), 1),
        "p95_ms": round(1000 * percentile(latencies, 0.95), 1),
        "p99_ms": round(1000 * percentile(latencies, 0.99), 1),
    }


def serve_command(
    script: Path, cfg: Any, port: int, limits: ServerLimits, decoding: DecodingOverrides
) -> list[str]:
    """``python scripts/serve.py`` with the benchmark's checkpoint, backend, decoding and ``serve.*``."""
    checkpoint = cfg.checkpoint if isinstance(cfg.checkpoint, str) else f"[{','.join(cfg.checkpoint)}]"
    args = [f"checkpoint={checkpoint}", f"port={port}", f"device={cfg.device}", f"backend={cfg.backend}"]
    if cfg.ct2_model:
        args.append(f"ct2_model={cfg.ct2_model}")
    args += [f"serve.{key}={value}" for key, value in asdict(limits).items()]
    args += [
        f"decoding.{f.name}={getattr(decoding, f.name)}"
        for f in fields(decoding)
        if getattr(decoding, f.name) is not None
    ]
    return [sys.executable, str(script), *args]


class Server:
    """A server process, started and stopped with the block; ``url`` once it answers ``/health``. Its
    log (an access line per request) goes to a temporary file, whose end an error quotes."""

    def __init__(self, command: list[str], port: int, start_timeout_s: float = 600):
        self.command, self.url, self.timeout = command, f"http://127.0.0.1:{port}", start_timeout_s

    def __enter__(self) -> Server:
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                tail = self.log.read().decode(errors="replace")[-2000:]
                raise NMTError(f"the server exited with status {self.process.returncode}: {tail}")
            try:
                if urllib.request.urlopen(f"{self.url}/health", timeout=5).status == 200:
                    return self
            except OSError:  # refused, 503 while workers start, or a timeout in the backlog meanwhile
                pass
            time.sleep(0.2)
        self.__exit__()
        raise NMTError(f"the server did not answer /health within {self.timeout:.0f} s")

    def __exit__(self, *_: Any) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def benchmark_service(
    url: str, sentences: Sequence[str], clients: Sequence[int], per_request: Sequence[int], requests: int
) -> list[dict[str, Any]]:
    """One row per (sentences per request, clients), after a warm-up (first batches, allocators)."""
    run_clients(url, requests_of(sentences, 1, 8), 1, 1)
    return [run_clients(url, requests_of(sentences, n, requests), c, n) for n in per_request for c in clients]


def benchmark_direct(
    backend: Any,
    ids: Sequence[list[int]],
    decoding: Any,
    per_request: Sequence[int],
    callers: Sequence[int],
    requests: int,
) -> list[dict[str, Any]]:
    """The same requests decoded by ``backend.translate_ids`` in this process, one call per request,
    from each number of ``callers`` (threads) at once."""
    rows = []
    for n in per_request:
        batches = [[ids[(i * n + j) % len(ids)] for j in range(n)] for i in range(requests)]
        backend.translate_ids(batches[0], decoding)  # warm-up
        for c in callers:
            with ThreadPoolExecutor(c) as pool:
                started = time.perf_counter()
                list(pool.map(lambda batch: backend.translate_ids(batch, decoding), batches))
                seconds = time.perf_counter() - started
            rows.append(
                {
                    "callers": c,
                    "sentences_per_request": n,
                    "requests": requests,
                    "requests_per_s": round(requests / seconds, 2),
                    "sentences_per_s": round(requests * n / seconds, 1),
                }
            )
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'sent/req':>9}{'clients':>8}{'requests':>9}{'ok':>6}{'503':>5}{'req/s':>9}{'sent/s':>9}"
        f"{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}"
    ]
    for r in rows:
        lines.append(
            f"{r['sentences_per_request']:>9}{r['clients']:>8}{r['requests']:>9}{r['ok']:>6}{r['busy']:>5}"
            f"{r['requests_per_s']:>9.1f}{r['sentences_per_s']:>9.1f}{r['p50_ms']:>9.1f}{r['p95_ms']:>9.1f}"
            f"{r['p99_ms']:>9.1f}"
        )
    return "\n".join(lines)
