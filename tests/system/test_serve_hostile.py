"""The service as scripts/serve.py runs it, in a uvicorn process of its own, against hostile and careless
clients: huge numbers are computed or refused naming the field, one sentence's trouble stays its own,
a foreign Host is refused (and counted), a slow body is cut off at serve.timeout_s and connections are
bounded, and Ctrl-C or SIGTERM to the process group finishes the requests in flight."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nmt.data import read_lines

pytest.importorskip("fastapi")
from nmt.serve.live import free_port  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
JSON = {"Content-Type": "application/json"}
TIMEOUT_S = 3  # serve.timeout_s
CONNECTIONS = 6  # serve.max_connections


class Server:
    """``scripts/serve.py`` in a session of its own: Ctrl-C goes to its process group, workers included,
    as a terminal sends it."""

    def __init__(self, proc: subprocess.Popen, port: int):
        self.proc, self.port, self.url = proc, port, f"http://127.0.0.1:{port}"

    def post(self, path: str, payload: dict | bytes, headers: dict | None = None) -> tuple[int, dict]:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        request = urllib.request.Request(f"{self.url}{path}", body, {**JSON, **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            text = e.read()
            return e.code, json.loads(text) if e.headers.get("content-type") == "application/json" else {}

    def metric(self, name: str, **labels: str) -> float:
        """A sample of GET /metrics (Prometheus text format), 0 when absent."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"{self.url}/metrics", timeout=60) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return 0.0

    def queued(self) -> int:
        """Requests the server has taken and that wait for a worker (``/health``)."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=60) as response:
                return json.loads(response.read())["queued"]
        except urllib.error.HTTPError as e:  # 503 while a worker is down: the body says the same
            return json.loads(e.read())["queued"]

    def raw(self, data: bytes, wait_s: float = 30) -> tuple[bytes, float]:
        """Send ``data`` on a new connection; what comes back until the server closes it (or ``wait_s``
        passes), and after how long."""
        started, answer = time.monotonic(), b""
        with socket.create_connection(("127.0.0.1", self.port), timeout=wait_s) as s:
            s.sendall(data)
            try:
                while chunk := s.recv(65536):
                    answer += chunk
            except TimeoutError:
                pass
        return answer, time.monotonic() - started

    def interrupt(self, signum: int = signal.SIGINT) -> None:
        """Signal the server's process group, as a terminal's Ctrl-C (SIGINT) or a service manager's stop
        (SIGTERM to the whole group) does."""
        os.killpg(self.proc.pid, signum)

    def gone(self, within_s: float) -> bool:
        """Whether every process of the server's group (server, workers, resource tracker) has exited."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return True
            self.proc.poll()  # reap the server once it exits
            time.sleep(0.1)
        return False


@pytest.fixture(scope="module")
def start(toy, toy_run, tmp_path_factory) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start_server(*overrides: str) -> Server:
        port = free_port()
        args = [f"checkpoint={toy_run.checkpoints / 'last.pt'}", f"port={port}", "device=cpu"]
        args += ["serve.workers=1", f"serve.timeout_s={TIMEOUT_S}", f"serve.max_connections={CONNECTIONS}"]
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "scripts" / "serve.py"), *args, *overrides],
            cwd=tmp_path_factory.mktemp("serve"),
            env=toy.env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        server = Server(proc, port)
        started.append(server)
        for _ in range(1200):
            try:
                if urllib.request.urlopen(f"{server.url}/health", timeout=5).status == 200:
                    return server
            except OSError:  # not up yet (503, or waiting in the backlog past the timeout)
                time.sleep(0.1)
        raise AssertionError("the server did not start")

    yield start_server
    for server in started:
        if server.proc.poll() is None:
            server.interrupt()
            if not server.gone(30):
                os.killpg(server.proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def server(start) -> Server:
    # outputs up to the model's positions (63): a huge max_len_a or max_len_b is accepted and computed
    return start("serve.max_output_tokens=100")


@pytest.fixture(scope="module")
def pairs(toy_text) -> tuple[list[str], list[str]]:
    return read_lines(toy_text / "test.src")[:4], read_lines(toy_text / "test.tgt")[:4]


def answered(server: Server, sources: list[str]) -> None:
    status, body = server.post("/translate", {"text": sources})
    assert status == 200 and len(body["translations"]) == len(sources), body


def test_huge_finite_numbers_are_computed_or_refused_naming_the_field(server, pairs):
    sources, refs = pairs
    prefix = [refs[0].split()[0]]
    for settings in ({"max_len_a": 1e308}, {"max_len_b": 10**400}, {"max_len_a": 1e308, "prefix": prefix}):
        status, body = server.post("/translate", {"text": sources[:1], **settings})
        assert status == 200 and body["translations"][0]["text"], (settings, body)
    huge = b"9" * 5000  # more digits than Python converts to an int
    for path, head in (("/translate", b'{"text": ["a"]'), ("/score", b'{"text": ["a"], "target": ["b"]')):
        status, body = server.post(path, head + b', "max_len_b": ' + huge + b"}")
        assert (status, body["field"]) == (422, "max_len_b"), body
        assert server.post(path, b'{"text": ["a", ' + huge + b"]}")[1]["field"] == "text.1"
    answered(server, sources)


def test_an_empty_sentence_with_a_prefix_and_attention_fails_no_one(server, pairs):
    """Requests with the same settings and prefixes share a search: the empty one is answered, and so
    is the one beside it."""
    sources, refs = pairs
    prefix = [refs[0].split()[0]]
    requests = [{"text": [text], "prefix": prefix, "attention": True} for text in ("", sources[0]) * 2]
    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(lambda payload: server.post("/translate", payload), requests))
    assert all(status == 200 for status, _ in answers), answers
    empty = answers[0][1]["translations"][0]
    assert empty["text"].startswith(prefix[0]) and empty["attention"]["source_tokens"] == ["</s>"]


@pytest.mark.parametrize("path", ["/translate", "/info", "/health", "/", "/no/such/page"])
def test_a_foreign_host_is_refused_and_counted(server, path):
    """A DNS-rebinding page reaches the service under its own name: only the bound address and the
    names of localhost are answered by default. Each refusal shows in /metrics, under its path (a path
    the service does not have, under ``other``: no label per path a client makes up)."""
    method = b"POST" if path == "/translate" else b"GET"
    body = b'{"text": ["a"]}'
    label = path if path.count("/") == 1 else "other"
    refused = {"name": "nmt_requests_total", "path": label, "status": "400"}
    before = server.metric(**refused)
    answers = ((b"rebind.attacker.example", b"400"), (b"localhost:%d" % server.port, b"200"))
    for host, status in answers if label != "other" else answers[:1]:
        request = b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (method, path.encode(), host)
        request += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        answer, _ = server.raw(request + b"Connection: close\r\n\r\n" + body)
        assert answer.split(b" ", 2)[1] == status, (host, answer[:200])
    assert server.metric(**refused) == before + 1
    named = server.metric("nmt_requests_total", path=path, status="400")
    assert named == (before + 1 if label == path else 0)


def test_a_body_sent_slowly_is_cut_off_at_the_timeout(server, pairs):
    """Content-Length 200, 10 bytes, then nothing: 408 at serve.timeout_s, and the connection closes."""
    head = b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    answer, elapsed = server.raw(head + b"Content-Length: 200\r\n\r\n" + b'{"text": [', wait_s=TIMEOUT_S + 20)
    assert answer.startswith(b"HTTP/1.1 408 ") and b'"field":"body"' in answer, answer
    assert TIMEOUT_S - 0.5 < elapsed < TIMEOUT_S + 5  # answered, and closed, at the timeout
    answered(server, pairs[0])


def test_connections_beyond_the_limit_get_a_503(server, pairs):
    held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(CONNECTIONS)]
    try:
        time.sleep(0.5)
        answer, _ = server.raw(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 503 "), answer
    finally:
        for connection in held:
            connection.close()
    time.sleep(0.5)
    answered(server, pairs[0])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_finishes_the_requests_in_flight(start, pairs, signum):
    """Ctrl-C, or a service manager's SIGTERM, reaches the server and its workers (one process group):
    the workers ignore it, the request being decoded and those waiting are answered, then everything
    exits. Each request is decoded alone (serve.max_tokens) and takes a while, and the signal comes once
    all of them are in: some are still in flight then, however slowly this process is scheduled."""
    server = start("serve.timeout_s=120", "serve.max_tokens=64")
    payload = {"text": pairs[0] * 16, "beam_size": 16, "nbest": 5}
    requests = 4  # with the health checks, within serve.max_connections

    def answered_when() -> tuple[int, float]:
        return server.post("/translate", payload)[0], time.monotonic()

    with ThreadPoolExecutor(requests) as pool:
        answers = [pool.submit(answered_when) for _ in range(requests)]
        deadline = time.monotonic() + 60
        while server.queued() < requests - 1 and time.monotonic() < deadline:  # one decoded, the rest wait
            time.sleep(0.05)
        interrupted = time.monotonic()
        server.interrupt(signum)
        results = [answer.result(timeout=300) for answer in answers]
    assert [status for status, _ in results] == [200] * requests, results
    assert any(at > interrupted for _, at in results), (interrupted, results)  # answered after the signal
    assert server.gone(60)


def test_port_0_prints_the_port_bound_which_answers(toy, toy_run, tmp_path):
    """``port=0`` takes a free port: the line says which, not ``:0``; ``host=0.0.0.0`` is said to serve
    every address, with a URL that works here."""
    args = [f"checkpoint={toy_run.checkpoints / 'last.pt'}", "port=0", "host=0.0.0.0", "device=cpu"]
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "serve.py"), *args, "serve.workers=1"],
        cwd=tmp_path,
        env=toy.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    server = Server(proc, 0)
    try:
        line = proc.stdout.readline()
        match = re.match(r"serving on http://127\.0\.0\.1:(\d+)/ \(and every address of this machine", line)
        assert match and int(match.group(1)) > 0, line
        with urllib.request.urlopen(f"http://127.0.0.1:{match.group(1)}/health", timeout=60) as response:
            assert response.status == 200
    finally:
        server.interrupt()
        if not server.gone(30):
            os.killpg(proc.pid, signal.SIGKILL)
