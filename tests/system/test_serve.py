"""The translation service on the session's toy model: the API answers what the Translator answers, bad
requests get a 4xx naming the field, concurrent clients are all answered, and the page works in a real
(headless) browser."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace

import pytest
import torch

from nmt.config import DecodingOverrides, ServerLimits
from nmt.data import prepare_text, read_lines

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from nmt.serve import create_app  # noqa: E402
from nmt.serve.live import serve_in_thread  # noqa: E402
from nmt.translator import Translator  # noqa: E402

pytestmark = pytest.mark.slow
LIMITS = ServerLimits(max_sentences=8, max_chars=400, max_beam_size=6)


@pytest.fixture(scope="module")
def translator(toy_run) -> Translator:
    return Translator.from_checkpoint(str(toy_run.checkpoints / "last.pt"), torch.device("cpu"))


@pytest.fixture(scope="module")
def sentences(toy_run) -> list[str]:
    return read_lines(prepare_text(toy_run.cfg.data, progress=False) / "test.src")[:40]


@pytest.fixture(scope="module")
def client(translator):
    app = create_app(translator, LIMITS, translator.decoding_with(DecodingOverrides()))
    with TestClient(app) as client:
        yield client


def test_translate_answers_what_the_translator_answers(client, translator, sentences):
    for settings in ({}, {"beam_size": 2, "nbest": 2, "alpha": 1.0}, {"beam_size": 1}):
        response = client.post("/translate", json={"text": [*sentences[:5], ""], **settings})
        assert response.status_code == 200, response.text
        body = response.json()
        decoding = translator.decoding_with(DecodingOverrides(**settings))
        assert body["decoding"] == asdict(decoding) and body["backend"] == "torch"
        expected = translator.hypotheses([*sentences[:5], ""], decoding)
        for got, nbest in zip(body["translations"], expected):
            texts = translator.tokenizer.decode_tgt([h.tokens for h in nbest])
            assert [h["text"] for h in got["nbest"]] == texts and len(texts) == decoding.nbest * bool(nbest)
            assert [h["score"] for h in got["nbest"]] == [h.score for h in nbest]
            assert got["text"] == (texts[0] if nbest else "")
        assert "attention" not in body["translations"][0]


def test_translations_equal_the_translate_script(toy, toy_run, client, sentences, tmp_path):
    stdin = "".join(line + "\n" for line in sentences[:8])
    proc = toy.script(
        "translate.py", f"checkpoint={toy_run.checkpoints / 'last.pt'}", cwd=tmp_path, stdin=stdin
    )
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


def test_health_and_info(client, translator):
    assert client.get("/health").json()["status"] == "ok"
    info = client.get("/info").json()
    assert info["backend"] == "torch" and info["models"] == 1 and info["parameters"] > 0
    assert info["vocabulary"]["tgt"] == translator.tokenizer.tgt_vocab_size
    assert info["decoding"] == asdict(translator.cfg.decoding) and info["limits"] == asdict(LIMITS)
    page = client.get("/")
    assert (
        page.status_code == 200
        and "Attention is not Explanation" in page.text
        and "cdn" not in page.text.lower()
    )


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"{not json", 400, "body"),
        (b'{"text": ["caf\xe9"]}', 400, "body"),  # Latin-1, not UTF-8
        (b'["a", "b"]', 400, "body"),
        (json.dumps({"text": "one string"}).encode(), 422, "text"),
        (json.dumps({"text": ["ok", 5]}).encode(), 422, "text.1"),
        (json.dumps({}).encode(), 422, "text"),
        (json.dumps({"text": ["a"], "beam": 5}).encode(), 422, "beam"),
        (json.dumps({"text": ["a"], "max_tokens": 5}).encode(), 422, "max_tokens"),
        (json.dumps({"text": ["a"], "beam_size": "5"}).encode(), 422, "beam_size"),
        (json.dumps({"text": ["a"], "beam_size": 0}).encode(), 422, "beam_size"),
        (json.dumps({"text": ["a"], "beam_size": 7}).encode(), 422, "beam_size"),
        (json.dumps({"text": ["a"], "beam_size": 2, "nbest": 3}).encode(), 422, "decoding"),
        (json.dumps({"text": ["a"], "attention": "yes"}).encode(), 422, "attention"),
        (json.dumps({"text": ["a"] * 9}).encode(), 413, "text"),
        (json.dumps({"text": ["a" * 401]}).encode(), 413, "text"),
    ],
)
def test_bad_requests_get_a_4xx_naming_the_field(client, body, status, field):
    response = client.post("/translate", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()
    assert error["field"] == field and error["error"].startswith(
        field if field != "decoding" else "decoding.nbest"
    )


# ------------------------------------------------------------------------------ a live server
def post(url: str, payload: dict) -> tuple[int, dict, dict]:
    request = urllib.request.Request(
        f"{url}/translate", json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


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


def test_concurrent_clients_are_all_answered_once_and_batching_changes_nothing(translator, sentences):
    """200 requests from 20 clients at once, with a queue of 8: a request gets a 503 with Retry-After
    while the queue is full, and every request is answered in the end with its own sentence's
    translation (as decoded alone); none is lost, none hangs, however fast the machine decodes."""
    decoding = translator.decoding_with(DecodingOverrides())
    alone = translator.translate(sentences, decoding)
    app = create_app(translator, replace(LIMITS, queue_size=8, max_tokens=256), decoding)
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


# ------------------------------------------------------------------------------ the page in a browser
def chromium() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.mark.skipif(
    chromium() is None,
    reason="no chromium and chromedriver (Debian: apt-get install chromium chromium-driver)",
)
def test_the_page_translates_and_draws_the_attention_in_a_browser(translator, sentences, tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser, driver_path = chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1100,1000",
    ):
        options.add_argument(flag)
    app = create_app(translator, LIMITS, translator.decoding_with(DecodingOverrides()))
    with serve_in_thread(app) as url:
        driver = webdriver.Chrome(
            service=webdriver.ChromeService(executable_path=driver_path), options=options
        )
        try:
            driver.get(f"{url}/")
            WebDriverWait(driver, 30).until(lambda d: "parameters" in d.find_element(By.ID, "model").text)
            driver.find_element(By.ID, "source").send_keys(sentences[0])
            driver.find_element(By.ID, "submit").click()
            WebDriverWait(driver, 60).until(lambda d: d.find_element(By.ID, "translation").text.strip())
            translation = driver.find_element(By.ID, "translation").text
            rows = driver.find_elements(By.CSS_SELECTOR, "#heatmap tbody tr")
            nbest = driver.find_elements(By.CSS_SELECTOR, "#nbest li")
            driver.save_screenshot(str(tmp_path / "page.png"))
        finally:
            driver.quit()
    expected = translator.translate([sentences[0]], translator.cfg.decoding)[0]
    assert translation == expected
    target_tokens = len(translator.tokenizer.encode_tgt([expected])[0]) + 1  # + </s>
    assert len(rows) == target_tokens and len(nbest) == min(3, translator.cfg.decoding.beam_size)
    assert (tmp_path / "page.png").stat().st_size > 10_000


# ------------------------------------------------------------------------------ the scripts
def test_the_server_benchmark_script_measures_each_client_count(toy, toy_run, tmp_path):
    args = [f"checkpoint={toy_run.checkpoints / 'last.pt'}", "clients=[1,3]", "requests=12"]
    proc = toy.script("benchmark_server.py", *args, f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "serve_bench.json").read_text())["rows"]
    assert [(r["clients"], r["requests"], r["ok"]) for r in rows] == [(1, 12, 12), (3, 12, 12)]
    assert all(0 < r["p50_ms"] <= r["p95_ms"] for r in rows) and "p95 ms" in proc.stdout


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("port=70000", "error: port=70000: must be a TCP port"),
        ("serve.queue_size=0", "error: serve.queue_size=0"),
    ],
)
def test_serve_script_refuses_bad_settings_in_one_line(toy, toy_run, tmp_path, override, message):
    proc = toy.script("serve.py", f"checkpoint={toy_run.checkpoints / 'last.pt'}", override, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith(message), proc.stderr
