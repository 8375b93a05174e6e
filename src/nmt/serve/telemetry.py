"""What the service reports at ``GET /metrics`` (Prometheus text format, prometheus-client) and in its
access log: one registry per app, so two apps in one process (tests, a notebook) count apart."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

access_log = logging.getLogger("nmt.serve.access")

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServiceMetrics:
    """The service's counters, gauges and histograms (names prefixed ``nmt_``)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "nmt_requests", "HTTP requests answered, by path and status code", ["path", "status"], registry=r
        )
        self.latency = Histogram(
            "nmt_request_seconds", "Time to answer POST /translate", buckets=LATENCY_BUCKETS, registry=r
        )
        self.queued = Gauge("nmt_queue_depth", "Requests waiting for a worker", registry=r)
        self.busy = Gauge("nmt_workers_busy", "Worker processes decoding a batch", registry=r)
        self.ready = Gauge("nmt_workers_ready", "Worker processes running and ready to decode", registry=r)
        self.batch_sentences = Histogram(
            "nmt_batch_sentences", "Sentences per decoded batch", buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_requests = Histogram(
            "nmt_batch_requests", "Requests per decoded batch", buckets=BATCH_BUCKETS, registry=r
        )
        self.sentences = Counter("nmt_sentences", "Sentences translated", registry=r)
        self.source_tokens = Counter("nmt_source_tokens", "Source subwords translated", registry=r)
        self.target_tokens = Counter(
            "nmt_target_tokens", "Target subwords produced (best hypotheses)", registry=r
        )
        self.dropped = Counter(
            "nmt_requests_dropped",
            "Queued requests dropped before decoding, by why (the client left, the timeout passed)",
            ["reason"],
            registry=r,
        )
        self.restarts = Counter(
            "nmt_worker_restarts",
            "Worker processes restarted (after a crash or a timeout)",
            ["reason"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def answered(self, path: str, status: int, sentences: int, seconds: float) -> None:
        """Count one answered request and write its access-log line."""
        self.requests.labels(path=path, status=str(status)).inc()
        if path == "/translate":
            self.latency.observe(seconds)
        access_log.info("%s %d sentences=%d ms=%.1f", path, status, sentences, 1000 * seconds)
