"""Speed of the service (``scripts/benchmark_server.py``): single-sentence requests from 1, 8, ...
concurrent clients against the server on 127.0.0.1, each client on one kept-alive connection.
Reports requests/s and the median and 95th-percentile latency per client count."""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from typing import Any
from urllib.parse import urlparse

from fastapi import FastAPI

from nmt.serve.live import serve_in_thread


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by the nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def run_clients(url: str, sentences: list[str], clients: int, requests: int) -> dict[str, Any]:
    """``requests`` requests of one sentence each (in turn from ``sentences``), shared by ``clients``."""
    host = urlparse(url)
    latencies: list[float] = []
    statuses: list[int] = []
    lock, counter = threading.Lock(), iter(range(requests))

    def client() -> None:
        connection = http.client.HTTPConnection(host.hostname, host.port, timeout=300)
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                break
            body = json.dumps({"text": [sentences[i % len(sentences)]]})
            start = time.perf_counter()
            connection.request("POST", "/translate", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            elapsed = time.perf_counter() - start
            with lock:
                latencies.append(elapsed)
                statuses.append(response.status)
        connection.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    return {
        "clients": clients,
        "requests": requests,
        "ok": statuses.count(200),
        "busy": statuses.count(503),
        "seconds": round(seconds, 3),
        "requests_per_s": round(requests / seconds, 2),
        "p50_ms": round(1000 * statistics.median(latencies), 1),
        "p95_ms": round(1000 * percentile(latencies, 0.95), 1),
    }


def benchmark_service(app: FastAPI, sentences: list[str], clients: list[int], requests: int) -> list[dict]:
    with serve_in_thread(app) as url:
        run_clients(url, sentences, 1, min(10, requests))  # warm up: first batches, allocator
        return [run_clients(url, sentences, n, requests) for n in clients]


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'clients':>8}{'requests':>10}{'ok':>6}{'503':>6}{'req/s':>9}{'p50 ms':>9}{'p95 ms':>9}"]
    for r in rows:
        lines.append(
            f"{r['clients']:>8}{r['requests']:>10}{r['ok']:>6}{r['busy']:>6}"
            f"{r['requests_per_s']:>9.1f}{r['p50_ms']:>9.1f}{r['p95_ms']:>9.1f}"
        )
    return "\n".join(lines)
