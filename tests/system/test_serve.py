"""The translation service on the session's toy model: the API answers what the Translator answers, bad
and hostile requests get a 4xx naming the field (and the next good request its 200), a request's cost is
bounded before it is paid (body, output, attention, response, time), the health check tells the truth,
metrics move, concurrent clients are all answered, and the page works in a real (headless) browser."""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from nmt.config import DecodingOverrides, ServerLimits
from nmt.data import prepare_text, read_lines
from nmt.errors import NMTError
from nmt.tooling.shortlist_builder import build_shortlist

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from live_service import NO_BROWSER, chromium, headless_chromium, serve_in_thread  # noqa: E402

from nmt.inference.translator import Translator  # noqa: E402
from nmt.serve import create_app  # noqa: E402
from nmt.serve.batch_decoding import TranslatorSpec  # noqa: E402
from nmt.serve.live import free_port  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
LIMITS = ServerLimits(
    max_sentences=8, max_chars=400, max_beam_size=6, max_body_kb=16, max_output_tokens=48, workers=1
)
JSON = {"Content-Type": "application/json"}
SLOW = 0.125  # the word_reward that makes SlowBackend sleep


@pytest.fixture(scope="module")
def checkpoint(toy_run) -> str:
    return str(toy_run.checkpoints / "last.pt")


@pytest.fixture(scope="module")
def translator(checkpoint) -> Translator:
    return Translator.from_checkpoint(checkpoint, torch.device("cpu"))


@pytest.fixture(scope="module")
def sentences(toy_run) -> list[str]:
    return read_lines(prepare_text(toy_run.cfg.data, progress=False) / "test.src")[:40]


@pytest.fixture(scope="module")
def defaults(translator):
    return translator.decoding_with(DecodingOverrides())


@pytest.fixture(scope="module")
def app(translator, checkpoint, defaults):
    """The service as scripts/serve.py runs it: a worker process built from the checkpoint."""
    return create_app(translator, LIMITS, defaults, TranslatorSpec(checkpoint, "cpu"))


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app) as client:
        yield client


@pytest.fixture
def good(client, sentences):
    """A good request, answered 200: after any refusal the service still translates."""

    def check() -> None:
        response = client.post("/translate", json={"text": sentences[:2]})
        assert response.status_code == 200, response.text
        assert len(response.json()["translations"]) == 2

    return check


def test_translate_answers_what_the_translator_answers(client, translator, sentences):
    for settings in ({}, {"beam_size": 2, "nbest": 2, "alpha": 1.0}, {"beam_size": 1}):
        response = client.post("/translate", json={"text": [*sentences[:5], ""], **settings})
        assert response.status_code == 200, response.text
        body = response.json()
        decoding = translator.decoding_with(DecodingOverrides(**settings))
        assert body["decoding"] == asdict(decoding) and body["backend"] == "torch"
        expected = translator.translations([*sentences[:5], ""], decoding).nbest
        for got, nbest in zip(body["translations"], expected):
            texts = translator.texts(nbest)
            assert [h["text"] for h in got["nbest"]] == texts and len(texts) == decoding.nbest * bool(nbest)
            assert [h["score"] for h in got["nbest"]] == [h.score for h in nbest]
            assert got["text"] == (texts[0] if nbest else "")
        assert "attention" not in body["translations"][0]


def test_translations_equal_the_translate_script(toy, checkpoint, client, sentences, tmp_path):
    stdin = "".join(line + "\n" for line in sentences[:8])
    proc = toy.script("translate.py", f"checkpoint={checkpoint}", cwd=tmp_path, stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    served = client.post("/translate", json={"text": sentences[:8]}).json()["translations"]
    assert [t["text"] for t in served] == proc.stdout.splitlines()


def test_attention_weights_come_per_layer_and_head(client, translator):
    body = client.post("/translate", json={"text": ["ka lo mi"], "attention": True}).json()
    attention = body["translations"][0]["attention"]
    weights = torch.tensor(attention["weights"])
    cfg = translator.cfg.model
    assert weights.shape == (
        cfg.decoder_layers,
        cfg.heads,
        len(attention["target_tokens"]),
        len(attention["source_tokens"]),
    )
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-3, rtol=0)
    assert attention["source_tokens"][-1] == attention["target_tokens"][-1] == "</s>"


def test_health_and_info(client, translator, defaults):
    health = client.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json()["workers"] == {"ready": 1, "total": 1}
    info = client.get("/info").json()
    assert info["backend"] == "torch" and info["models"] == 1 and info["parameters"] > 0
    assert info["vocabulary"]["tgt"] == translator.tokenizer.tgt_vocab_size
    assert info["decoding"] == asdict(defaults) and info["limits"] == asdict(LIMITS)
    page = client.get("/")
    assert (
        page.status_code == 200
        and "Attention is not Explanation" in page.text
        and "cdn" not in page.text.lower()
    )


def test_the_shortlist_is_named_by_its_file_name_and_digest_never_its_path(
    translator, toy_run, sentences, tmp_path
):
    """/info and every /translate and /score answer show the shortlist decoded over as its file name
    and sha256, not the server's path to it (which tells clients about the server's disk)."""
    data = toy_run.cfg.data
    tokenizer = translator.tokenizer
    refs = read_lines(prepare_text(data, progress=False) / "test.tgt")[:40]
    pairs = tokenizer.encode_src(sentences), tokenizer.encode_tgt(refs)
    shortlist = build_shortlist(*pairs, tokenizer, k=3, frequent=2, direction=(data.src_lang, data.tgt_lang))
    path = tmp_path / "secret-folder" / shortlist.filename()
    path.parent.mkdir()
    shortlist.save(path)
    defaults = translator.decoding_with(DecodingOverrides(shortlist=str(path)))
    named = {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    with TestClient(create_app(translator, LIMITS, defaults)) as client:
        answers = [
            client.get("/info"),
            client.post("/translate", json={"text": sentences[:2]}),
            client.post("/score", json={"text": sentences[:1], "target": refs[:1]}),
        ]
    for answer in answers:
        assert answer.status_code == 200 and answer.json()["decoding"]["shortlist"] == named, answer.text
        assert "secret-folder" not in answer.text


def metric(client, name: str, **labels: str) -> float:
    """A sample of GET /metrics (Prometheus text format), 0 when absent."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def test_metrics_count_requests_sentences_tokens_and_batches(client, sentences, caplog):
    ok = {"name": "nmt_requests_total", "path": "/translate", "status": "200"}
    names = ("nmt_sentences_total", "nmt_target_tokens_total", "nmt_request_seconds_count")
    before = {name: metric(client, name) for name in (*names, "nmt_batch_sentences_sum")}
    requests_before, refused_before = metric(client, **ok), metric(client, **{**ok, "status": "422"})
    with caplog.at_level("INFO", logger="nmt.serve.access"):
        assert client.post("/translate", json={"text": sentences[:3]}).status_code == 200
        assert client.post("/translate", json={"text": ["a"], "beam": 2}).status_code == 422
    assert metric(client, **ok) == requests_before + 1
    assert metric(client, **{**ok, "status": "422"}) == refused_before + 1
    assert metric(client, "nmt_sentences_total") == before["nmt_sentences_total"] + 3
    assert metric(client, "nmt_target_tokens_total") > before["nmt_target_tokens_total"]
    assert metric(client, "nmt_request_seconds_count") == before["nmt_request_seconds_count"] + 2
    assert metric(client, "nmt_batch_sentences_sum") == before["nmt_batch_sentences_sum"] + 3
    assert metric(client, "nmt_workers_ready") == 1 and "nmt_queue_depth" in client.get("/metrics").text
    assert "nmt_worker_restarts" in client.get("/metrics").text
    lines = [r.getMessage() for r in caplog.records if r.name == "nmt.serve.access"]
    assert lines[-2].startswith("/translate 200 sentences=3 ms=") and lines[-1].startswith("/translate 422")


def nested(levels: int) -> bytes:
    return b'{"text": ["a"], "x": ' + b"[" * levels + b"]" * levels + b"}"


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"{not json", 400, "body"),
        (b'{"text": ["caf\xe9"]}', 400, "body"),  # Latin-1, not UTF-8
        (b'["a", "b"]', 400, "body"),
        (nested(5000), 400, "body"),  # deeper than Python's recursion limit
        (json.dumps({"text": "one string"}).encode(), 422, "text"),
        (json.dumps({"text": ["ok", 5]}).encode(), 422, "text.1"),
        (json.dumps({}).encode(), 422, "text"),
        (json.dumps({"text": ["a"], "beam": 5}).encode(), 422, "beam"),
        (json.dumps({"text": ["a"], "max_tokens": 5}).encode(), 422, "max_tokens"),
        (json.dumps({"text": ["a"], "beam_size": "5"}).encode(), 422, "beam_size"),
        (json.dumps({"text": ["a"], "beam_size": 0}).encode(), 422, "beam_size"),
        (json.dumps({"text": ["a"], "beam_size": 7}).encode(), 422, "beam_size"),
        (json.dumps({"text": ["a"], "beam_size": 2, "nbest": 3}).encode(), 422, "nbest"),
        (json.dumps({"text": ["a"], "attention": "yes"}).encode(), 422, "attention"),
        (json.dumps({"text": ["a"] * 9}).encode(), 413, "text"),
        (json.dumps({"text": ["a" * 401]}).encode(), 413, "text"),
        # numbers that pass a type check but not arithmetic
        (b'{"text": ["a"], "word_reward": NaN}', 422, "word_reward"),
        (b'{"text": ["a"], "word_reward": Infinity}', 422, "word_reward"),
        (b'{"text": ["a"], "word_reward": -1e999}', 422, "word_reward"),
        (b'{"text": ["a"], "word_reward": 1e308}', 422, "word_reward"),
        (b'{"text": ["a"], "alpha": 1000}', 422, "alpha"),
        (b'{"text": ["a"], "max_len_a": Infinity}', 422, "max_len_a"),
        (b'{"text": ["a"], "max_len_a": 1e308}', 422, "max_len_a"),
        (b'{"text": ["a"], "max_len_b": 1000000}', 422, "max_len_b"),
        (b'{"text": ["a"], "no_repeat_ngram": 1000000000000}', 422, "no_repeat_ngram"),
        (b'{"text": ["a", "b\\ud800"]}', 422, "text.1"),  # a lone surrogate: no UTF-8 for it
    ],
)
def test_bad_requests_get_a_4xx_naming_the_field_and_the_next_is_answered(client, good, body, status, field):
    response = client.post("/translate", content=body, headers=JSON)
    assert response.status_code == status, response.text
    error = response.json()
    assert error["field"] == field and error["error"].startswith(f"{field}: ")
    good()


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
    ],
)
def test_a_body_that_is_not_declared_json_is_a_415(client, good, content_type):
    """What a page on another site can make a browser send without asking (no CORS preflight)."""
    headers = {"Content-Type": content_type} if content_type else {}
    response = client.post("/translate", content=b'{"text": ["ka lo"]}', headers=headers)
    assert response.status_code == 415 and response.json()["field"] == "content-type", response.text
    good()
    assert (
        client.post(
            "/translate", content=b'{"text": []}', headers={"Content-Type": "application/json; charset=UTF-8"}
        ).status_code
        == 200
    )


def test_a_body_over_the_limit_is_a_413_declared_or_streamed(client, good):
    big = json.dumps({"text": ["ka " * 6000]}).encode()  # 18 KB > serve.max_body_kb=16
    response = client.post("/translate", content=big, headers=JSON)
    assert response.status_code == 413 and response.json()["field"] == "body"
    assert "16384" in response.json()["error"]
    good()
    streamed = client.post(
        "/translate", content=(big[i : i + 1000] for i in range(0, len(big), 1000)), headers=JSON
    )
    assert streamed.status_code == 413 and streamed.json()["field"] == "body"  # chunked: no Content-Length
    good()


def test_output_length_is_bounded_before_decoding(client, good, translator, sentences):
    """max_len_a/max_len_b that would allow a sentence more than serve.max_output_tokens are refused;
    the server's own defaults are not, for sentences they keep within it."""
    line = next(
        line for k in range(1, 40) if len(translator.encode([line := " ".join(sentences[:k])])[0]) > 24
    )
    n = len(translator.encode([line])[0])
    assert n <= 40
    over = client.post("/translate", json={"text": [line], "max_len_a": 2.0, "max_len_b": 0})
    assert over.status_code == 422 and over.json()["field"] == "max_len_a", over.text
    assert f"sentence of {n}" in over.json()["error"] and "serve.max_output_tokens" in over.json()["error"]
    fits = client.post("/translate", json={"text": [line], "max_len_a": 1.0, "max_len_b": 48 - n - 1})
    assert fits.status_code == 200, fits.text
    good()


@pytest.fixture(scope="module")
def slow(translator):
    """A Translator over the toy model whose backend sleeps ``delay`` seconds for requests with
    word_reward=SLOW, and records every source it decodes (a Translator made in code: the service
    decodes it in a thread)."""

    class SlowBackend:
        name = "torch-slow"

        def __init__(self, inner, delay: float = 1.5):
            self.inner, self.delay, self.decoded = inner, delay, []

        def translate_ids(self, sources, cfg, progress=False, **kwargs):
            self.decoded.extend(list(s) for s in sources)
            if sources and cfg.word_reward == SLOW:
                time.sleep(self.delay)
            return self.inner.translate_ids(sources, cfg, progress, **kwargs)

        def check_shortlist(self, path):
            self.inner.check_shortlist(path)

    backend = SlowBackend(translator.backend)
    return Translator(translator.model, translator.tokenizer, translator.cfg, backend), backend


def test_attention_and_answers_larger_than_the_response_limit_are_refused(translator, defaults, sentences):
    limits = replace(LIMITS, max_response_mb=0.002)  # 2 KB
    with TestClient(create_app(translator, limits, defaults)) as client:
        attention = client.post("/translate", json={"text": sentences[:1], "attention": True})
        assert attention.status_code == 422 and attention.json()["field"] == "attention", attention.text
        assert "serve.max_response_mb=0.002" in attention.json()["error"]
        large = client.post("/translate", json={"text": sentences[:8], "beam_size": 6, "nbest": 6})
        assert large.status_code == 422 and large.json()["field"] == "text", large.text
        assert client.post("/translate", json={"text": sentences[:1]}).status_code == 200


def test_search_memory_is_bounded_a_request_at_a_time_and_a_search_at_a_time(translator, defaults, sentences):
    """serve.max_search_mb: a sentence whose search alone is over it gets 422 naming beam_size; a request
    whose sentences are over it only together is searched in parts (the same translations); and a limit
    too small for the default settings is refused at start."""
    greedy = replace(defaults, beam_size=1, nbest=1)
    (longest,) = translator.search_bytes([[0] * translator.max_source], greedy)
    limits = replace(LIMITS, max_search_mb=2 * longest / 2**20)
    with pytest.raises(NMTError, match=r"serve.max_search_mb=\S+: searching one sentence of \d+ subwords"):
        create_app(translator, replace(limits, max_search_mb=0.5 * longest / 2**20), greedy)
    beam4 = replace(greedy, beam_size=4)
    sizes = translator.search_bytes(translator.encode(sentences[:8]), beam4)
    assert sum(sizes) > limits.max_search_mb * 2**20 >= max(sizes)  # over it together only
    with TestClient(create_app(translator, limits, greedy)) as client:
        parts = client.post("/translate", json={"text": sentences[:8], "beam_size": 4})
        assert parts.status_code == 200, parts.text
        texts = [t["text"] for t in parts.json()["translations"]]
        assert texts == translator.translate(sentences[:8], beam4)
        long = max(sentences, key=lambda s: len(translator.encode([s])[0]))
        over = client.post("/translate", json={"text": [long], "beam_size": 6, "max_len_a": 3.0})
        assert over.status_code == 422 and over.json()["field"] == "beam_size", over.text
        assert "serve.max_search_mb=" in over.json()["error"]
        assert client.post("/translate", json={"text": sentences[:1]}).status_code == 200


def post(url: str, payload: dict, timeout: float = 120) -> tuple[int, dict, dict]:
    request = urllib.request.Request(f"{url}/translate", json.dumps(payload).encode(), JSON)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def test_a_request_past_the_timeout_gets_a_504_on_time(slow, defaults, sentences):
    translator, _ = slow
    with serve_in_thread(create_app(translator, replace(LIMITS, timeout_s=0.5), defaults)) as url:
        started = time.monotonic()
        status, body, _ = post(url, {"text": sentences[:1], "word_reward": SLOW})
        assert status == 504 and "serve.timeout_s=0.5" in body["error"]
        assert time.monotonic() - started < 1.4  # the decode takes 1.5 s


def test_a_request_whose_client_left_is_not_decoded(slow, defaults, sentences):
    """The worker is busy; a second client sends a request and hangs up: it leaves the queue at once
    and is never decoded."""
    translator, backend = slow
    backend.decoded.clear()
    app = create_app(translator, LIMITS, defaults)
    with serve_in_thread(app) as url:
        busy = ThreadPoolExecutor(1).submit(post, url, {"text": sentences[:1], "word_reward": SLOW})
        time.sleep(0.5)
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps({"text": [sentences[5]]}).encode()
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
            s.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            time.sleep(0.3)  # queued behind the slow request
        assert busy.result()[0] == 200
        time.sleep(0.5)
        dropped = app.state.service.metrics.registry.get_sample_value(
            "nmt_requests_dropped_total", {"reason": "disconnected"}
        )
    assert dropped == 1
    assert translator.encode([sentences[5]])[0] not in backend.decoded


def test_an_app_served_twice_still_translates(slow, defaults, sentences):
    """A second lifespan (a second server or test client, a notebook re-run) gets a working queue."""
    translator, _ = slow
    app = create_app(translator, LIMITS, defaults)
    for _ in range(2):
        with serve_in_thread(app) as url:
            assert post(url, {"text": sentences[:1]}, timeout=30)[0] == 200
            health = urllib.request.urlopen(f"{url}/health", timeout=30)
            assert health.status == 200


def test_a_dead_worker_is_reported_and_started_again(client, good):
    batcher = client.app.state.service.batcher
    restarts = metric(client, "nmt_worker_restarts_total", reason="crash")
    os.kill(batcher.workers[0].process.pid, signal.SIGKILL)
    time.sleep(0.2)
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "unavailable"
    for _ in range(600):
        if client.get("/health").status_code == 200:
            break
        time.sleep(0.1)
    assert client.get("/health").json()["workers"] == {"ready": 1, "total": 1}
    assert metric(client, "nmt_worker_restarts_total", reason="crash") == restarts + 1
    good()


def test_a_16kb_request_cannot_hold_a_worker_past_the_timeout(translator, checkpoint, defaults, sentences):
    """The most work 16 KB may ask within the limits (64 sentences, the widest beam, the longest outputs)
    is answered or stopped by serve.timeout_s, however fast the machine; the other worker answers the
    next request meanwhile."""
    limits = ServerLimits(max_chars=16_000, max_body_kb=16, max_output_tokens=63, timeout_s=1.0, workers=2)
    app = create_app(translator, limits, defaults, TranslatorSpec(checkpoint, "cpu"))
    line = " ".join(sentences)[:240]
    heavy = {"text": [line] * 64, "beam_size": 16, "nbest": 16, "max_len_a": 3.0, "max_len_b": 40}
    assert len(json.dumps(heavy)) <= 16 * 1024
    with TestClient(app) as client:
        started = time.monotonic()
        response = client.post("/translate", json=heavy)
        elapsed = time.monotonic() - started
        assert response.status_code in (200, 504), response.text
        assert elapsed < limits.timeout_s + 2.0
        assert len(response.content) <= limits.max_response_mb * 2**20
        answered = client.post("/translate", json={"text": sentences[:2]})
        assert answered.status_code == 200, answered.text


# ------------------------------------------------------------------------------ a server in a process
def peak_rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))


def send_large_body(port: int, size: int, chunked: bool) -> int:
    """POST ``size`` bytes (declared, or chunked without a length) until the server answers; its status."""
    head = b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += b"Transfer-Encoding: chunked\r\n\r\n" if chunked else b"Content-Length: %d\r\n\r\n" % size
    block = b"[" * (1 << 20)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(head)
        sent = 0
        while sent < size and not select.select([s], [], [], 0)[0]:
            try:
                s.sendall(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(block)
        response = s.recv(65536)
    return int(response.split(b" ", 2)[1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads peak memory from /proc")
def test_a_100mb_post_is_refused_before_it_is_held(toy, checkpoint, sentences, tmp_path):
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "serve.py")]
        + [f"checkpoint={checkpoint}", f"port={port}", "serve.workers=1", "device=cpu"],
        cwd=tmp_path,
        env=toy.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            try:
                if urllib.request.urlopen(f"{url}/health", timeout=5).status == 200:
                    break
            except OSError:  # not up yet (503, or waiting in the backlog past the timeout)
                time.sleep(0.1)
        for _ in range(5):  # warm: the peak a good request makes
            assert post(url, {"text": sentences[:8]})[0] == 200
        before = peak_rss_kb(server.pid)
        assert send_large_body(port, 100 << 20, chunked=False) == 413
        assert post(url, {"text": sentences[:2]})[0] == 200
        assert send_large_body(port, 100 << 20, chunked=True) == 413
        assert post(url, {"text": sentences[:2]})[0] == 200
        growth_mb = (peak_rss_kb(server.pid) - before) / 1024
        assert growth_mb < 20, growth_mb
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


# ------------------------------------------------------------------------------ many clients
def post_until_answered(url: str, payload: dict, tries: int = 1000) -> tuple[int, dict, list[dict]]:
    """POST again after each 503, as a client honouring Retry-After does (waiting less, to be quick);
    returns the final status and body, and the headers of the 503s."""
    busy = []
    for _ in range(tries):
        status, body, headers = post(url, payload)
        if status != 503:
            return status, body, busy
        busy.append(headers)
        time.sleep(0.02)
    raise AssertionError(f"still 503 after {tries} tries")


def test_concurrent_clients_are_all_answered_once_and_batching_changes_nothing(
    translator, sentences, defaults
):
    """200 requests from 20 clients at once, with a queue of 8: a request gets a 503 with Retry-After
    while the queue is full, and every request is answered in the end with its own sentence's
    translation (as decoded alone); none is lost, none hangs, however fast the machine decodes."""
    alone = translator.translate(sentences, defaults)
    app = create_app(translator, replace(LIMITS, queue_size=8, max_tokens=256), defaults)
    with serve_in_thread(app) as url, ThreadPoolExecutor(max_workers=20) as pool:
        started = time.monotonic()
        answers = list(
            pool.map(lambda i: (i, *post_until_answered(url, {"text": [sentences[i % 40]]})), range(200))
        )
        assert time.monotonic() - started < 300
        health = json.loads(urllib.request.urlopen(f"{url}/health", timeout=30).read())
    assert len(answers) == 200 and all(status == 200 for _, status, _, _ in answers)
    assert all(body["translations"][0]["text"] == alone[i % 40] for i, _, body, _ in answers)
    refused = [headers for *_, busy in answers for headers in busy]
    assert refused and all(headers.get("retry-after") == "1" for headers in refused)  # the queue filled
    assert health["batches"] < len(answers)  # some requests shared a search


# ------------------------------------------------------------------------------ CTranslate2
@pytest.fixture(scope="module")
def exported(toy_ct2) -> Path:
    """The session's toy model exported by scripts/export_ct2.py (skipped without ctranslate2)."""
    return toy_ct2


def test_settings_the_ct2_backend_cannot_decode_are_refused_at_start_and_per_request(
    toy, checkpoint, exported, tmp_path
):
    translator = Translator.from_checkpoint(checkpoint, torch.device("cpu"), "ct2", str(exported))
    blocking = translator.decoding_with(DecodingOverrides(beam_size=4, no_repeat_ngram=2))
    with pytest.raises(NMTError, match=r"^decoding\.no_repeat_ngram: backend=ct2 cannot block"):
        create_app(translator, LIMITS, blocking)
    args = [f"checkpoint={checkpoint}", "backend=ct2", f"ct2_model={exported}", "decoding.no_repeat_ngram=2"]
    proc = toy.script("serve.py", *args, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith(
        "error: decoding.no_repeat_ngram: backend=ct2 cannot block"
    ), proc.stderr
    with TestClient(create_app(translator, LIMITS, translator.decoding_with(DecodingOverrides()))) as client:
        refused = client.post("/translate", json={"text": ["ka lo"], "beam_size": 4, "no_repeat_ngram": 2})
        assert refused.status_code == 422 and refused.json()["field"] == "no_repeat_ngram", refused.text
        assert (
            client.post(
                "/translate", json={"text": ["ka lo"], "beam_size": 1, "no_repeat_ngram": 2}
            ).status_code
            == 200
        )


# ------------------------------------------------------------------------------ the page in a browser
@pytest.mark.skipif(chromium() is None, reason=NO_BROWSER)
def test_the_page_translates_and_draws_the_attention_in_a_browser(translator, sentences, defaults, tmp_path):
    pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    app = create_app(translator, LIMITS, defaults)
    with serve_in_thread(app) as url, headless_chromium(tmp_path / "profile") as driver:
        driver.get(f"{url}/")
        WebDriverWait(driver, 30).until(lambda d: "parameters" in d.find_element(By.ID, "model").text)
        driver.find_element(By.ID, "source").send_keys(sentences[0])
        driver.find_element(By.ID, "submit").click()
        WebDriverWait(driver, 60).until(lambda d: d.find_element(By.ID, "translation").text.strip())
        translation = driver.find_element(By.ID, "translation").text
        rows = driver.find_elements(By.CSS_SELECTOR, "#heatmap tbody tr")
        nbest = driver.find_elements(By.CSS_SELECTOR, "#nbest li")
        driver.save_screenshot(str(tmp_path / "page.png"))
    expected = translator.translate([sentences[0]], translator.cfg.decoding)[0]
    assert translation == expected
    target_tokens = len(translator.tokenizer.encode_tgt([expected])[0]) + 1  # + </s>
    assert len(rows) == target_tokens and len(nbest) == min(3, translator.cfg.decoding.beam_size)
    assert (tmp_path / "page.png").stat().st_size > 10_000


# ------------------------------------------------------------------------------ the scripts
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("port=70000", "error: port=70000: must be a TCP port"),
        ("serve.queue_size=0", "error: serve.queue_size=0"),
        ("serve.timeout_s=0", "error: serve.timeout_s=0"),
        ("serve.workers=-1", "error: serve.workers=-1: must be >= 0"),
        ("serve.max_output_tokens=8", "error: decoding.max_len_b=10 allows longer outputs"),
    ],
)
def test_serve_script_refuses_bad_settings_in_one_line(toy, checkpoint, tmp_path, override, message):
    proc = toy.script("serve.py", f"checkpoint={checkpoint}", override, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith(message), proc.stderr


def test_the_server_benchmark_measures_a_server_in_another_process(toy, checkpoint, tmp_path):
    args = [f"checkpoint={checkpoint}", "clients=[1,3]", "sentences=[1,2]", "requests=12", "serve.workers=1"]
    proc = toy.script("benchmark_server.py", *args, f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "serve_bench.json").read_text())
    rows = [(r["sentences_per_request"], r["clients"], r["requests"], r["ok"]) for r in results["rows"]]
    assert rows == [(1, 1, 12, 12), (1, 3, 12, 12), (2, 1, 12, 12), (2, 3, 12, 12)]
    assert all(0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] for r in results["rows"])
    assert results["serve"]["workers"] == 1 and "p99 ms" in proc.stdout
