"""The service's prefixes, word alignments and ``POST /score`` on the session's toy model, and the page
that uses them in headless Chromium: the translation continues what the user typed, hovering a word
highlights its partners, an edited translation gets its score."""

from __future__ import annotations

import pytest
import torch

from nmt.config import DecodingOverrides, ServerLimits
from nmt.data import prepare_text, read_lines

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from live_service import NO_BROWSER, chromium, headless_chromium, serve_in_thread  # noqa: E402

from nmt.inference.translator import Translator  # noqa: E402
from nmt.serve import create_app  # noqa: E402

pytestmark = pytest.mark.slow
LIMITS = ServerLimits(max_sentences=8, max_chars=400, max_beam_size=6)


@pytest.fixture(scope="module")
def translator(toy_run) -> Translator:
    return Translator.from_checkpoint(str(toy_run.checkpoints / "last.pt"), torch.device("cpu"))


@pytest.fixture(scope="module")
def pairs(toy_run) -> tuple[list[str], list[str]]:
    text = prepare_text(toy_run.cfg.data, progress=False)
    return read_lines(text / "test.src")[:6], read_lines(text / "test.tgt")[:6]


@pytest.fixture(scope="module")
def client(translator):
    with TestClient(create_app(translator, LIMITS, translator.decoding_with(DecodingOverrides()))) as client:
        yield client


def test_translate_with_prefixes_and_alignments(client, translator, pairs):
    sources, refs = pairs
    prefixes = ["", refs[1].split()[2], "", "", "", ""]
    body = client.post("/translate", json={"text": sources, "prefix": prefixes, "alignments": True}).json()
    decoding = translator.decoding_with(DecodingOverrides())
    expected = translator.translate(sources, decoding, prefixes=prefixes)
    got = body["translations"]
    assert [t["text"] for t in got] == expected and got[1]["text"].startswith(prefixes[1] + " ")
    hyps = translator.translations(sources, decoding, prefixes=prefixes).nbest
    aligned = translator.align(translator.encode(sources), [h[0].tokens for h in hyps], None, 4000)
    for t, a in zip(got, aligned):
        assert t["alignment"]["links"] == [list(link) for link in a.links]
        assert t["alignment"]["target_words"] == t["text"].split() == a.target_words


def test_score_answers_what_the_translator_scores(client, translator, pairs):
    sources, refs = pairs[0][:3], pairs[1][:3]  # within serve.max_chars over both sides
    response = client.post("/score", json={"text": sources, "target": refs, "alignments": True})
    assert response.status_code == 200, response.text
    body = response.json()
    expected = translator.score(sources, refs, translator.decoding_with(DecodingOverrides()))
    for got, s in zip(body["scores"], expected, strict=True):
        assert got["log_prob"] == pytest.approx(s.log_prob, abs=1e-6) and got["tokens"] == s.tokens
        assert got["score"] == pytest.approx(s.score, abs=1e-6) and got["pieces"] == s.pieces
        assert len(got["alignment"]["links"]) == len(got["alignment"]["target_words"])


@pytest.mark.parametrize(
    ("path", "payload", "status", "field"),
    [
        ("/score", {"text": ["a", "b"], "target": ["x"]}, 422, "target"),
        ("/score", {"text": ["a"]}, 422, "target"),
        ("/score", {"text": ["a"], "target": ["x"], "beam_size": 2}, 422, "beam_size"),
        ("/score", {"text": ["a"] * 9, "target": ["x"] * 9}, 413, "text"),
        ("/score", {"text": ["a"], "target": ["x" * 400]}, 413, "text"),
        ("/score", {"text": ["a"], "target": ["x " * 70]}, 422, "target"),
        ("/translate", {"text": ["a", "b"], "prefix": ["x"]}, 422, "prefix"),
        ("/translate", {"text": ["ka"], "prefix": ["x " * 30]}, 422, "prefix"),
        ("/translate", {"text": ["a"], "prefix": "x"}, 422, "prefix"),
        ("/translate", {"text": ["a"], "alignments": "yes"}, 422, "alignments"),
    ],
)
def test_bad_requests_get_a_4xx_naming_the_field(client, path, payload, status, field):
    response = client.post(path, json=payload)
    assert response.status_code == status, response.text
    assert response.json()["field"] == field and response.json()["error"].startswith(field)
    assert "line" not in response.json()["error"]  # a request has no lines: its lists have elements


def test_a_refused_prefix_or_target_is_named_by_its_place_in_the_request(client):
    body = client.post("/translate", json={"text": ["a", "ka"], "prefix": ["", "x " * 30]}).json()
    assert body["error"].startswith("prefix: prefix[1]: the target prefix has ")
    body = client.post("/score", json={"text": ["a", "b"], "target": ["x", "x " * 70]}).json()
    assert body["error"].startswith("target: target[1]: the translation has ")


def test_score_refuses_a_body_that_is_not_json(client):
    response = client.post("/score", content=b"{no", headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["field"] == "body"


# ------------------------------------------------------------------------------ the page in a browser
@pytest.mark.skipif(chromium() is None, reason=NO_BROWSER)
def test_the_page_continues_a_prefix_links_words_and_rescores(translator, pairs, tmp_path):
    pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    sources, refs = pairs
    decoding = translator.decoding_with(DecodingOverrides())
    app = create_app(translator, LIMITS, decoding)
    with serve_in_thread(app) as url, headless_chromium(tmp_path / "profile") as driver:
        wait = WebDriverWait(driver, 60)
        driver.get(f"{url}/")
        wait.until(lambda d: "parameters" in d.find_element(By.ID, "model").text)
        driver.find_element(By.ID, "source").send_keys(sources[0])
        driver.find_element(By.ID, "submit").click()
        wait.until(lambda d: d.find_element(By.ID, "translation").text.strip())
        free = driver.find_element(By.ID, "translation").text

        # the word alignment: one link per target word; hovering a word highlights its partners
        targets = driver.find_elements(By.CSS_SELECTOR, "#target-words .word")
        lines = driver.find_elements(By.CSS_SELECTOR, "#links line")
        assert [w.text for w in targets] == free.split() and len(lines) == len(targets)
        ActionChains(driver).move_to_element(targets[0]).perform()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#source-words .word.partner"))
        partners = [w.text for w in driver.find_elements(By.CSS_SELECTOR, "#source-words .word.partner")]
        active = driver.find_elements(By.CSS_SELECTOR, "#links line.active")
        assert len(partners) == len(active) == 1 and "active" in targets[0].get_attribute("class")

        # the prefix box: the translation continues what is typed (debounced)
        prefix = refs[1].split()[0]
        driver.find_element(By.ID, "prefix").send_keys(prefix)
        wait.until(lambda d: d.find_element(By.ID, "translation").text.startswith(prefix + " "))
        continued = driver.find_element(By.ID, "translation").text

        # the edited translation gets its score
        edited = driver.find_element(By.ID, "edited")
        edited.clear()
        edited.send_keys(refs[0])
        wait.until(lambda d: "subwords" in d.find_element(By.ID, "edited-score").text)
        shown = driver.find_element(By.ID, "edited-score").text
        driver.save_screenshot(str(tmp_path / "page.png"))
    aligned = translator.align(
        translator.encode(sources[:1]),
        [translator.translations(sources[:1], decoding).nbest[0][0].tokens],
        None,
        4000,
    )[0]
    assert free == translator.translate(sources[:1], decoding)[0]
    assert partners == [aligned.source_words[i] for i, j in aligned.links if j == 0]
    assert continued == translator.translate(sources[:1], decoding, prefixes=[prefix])[0]
    score = translator.score(sources[:1], refs[:1], decoding)[0]
    assert shown.startswith(f"score {score.score:.3f}, log P {score.log_prob:.3f}, {score.tokens} subwords")
    assert (tmp_path / "page.png").stat().st_size > 10_000


def test_the_service_aligns_with_its_alignment_layer(translator, toy_text):
    # Which pairs the two layers align differently depends on how the toy model trained (and on the
    # CPU's kernels), so the test looks for them among the test split's pairs and their reversals.
    sources, refs = read_lines(toy_text / "test.src"), read_lines(toy_text / "test.tgt")
    refs += [" ".join(reversed(r.split())) for r in refs]
    sources += sources
    src_ids, tgt_ids = translator.encode(sources), translator.encode_targets(refs)
    last = translator.align(src_ids, tgt_ids, -1, 4000)
    default = translator.align(src_ids, tgt_ids, None, 4000)
    differ = [i for i, (a, b) in enumerate(zip(last, default)) if a.links != b.links]
    assert differ, "the toy model's last and penultimate layers align every test pair alike"
    texts, targets = [sources[i] for i in differ[:2]], [refs[i] for i in differ[:2]]
    defaults = translator.decoding_with(DecodingOverrides())
    with TestClient(create_app(translator, LIMITS, defaults, alignment_layer=-1)) as client:
        body = client.post("/score", json={"text": texts, "target": targets, "alignments": True}).json()
    expected = [[list(x) for x in last[i].links] for i in differ[:2]]
    assert [s["alignment"]["links"] for s in body["scores"]] == expected
