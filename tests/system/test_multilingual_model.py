"""Many languages in one model: a tiny Transformer learns the toy task into three target languages
(data=toy_multi: the same source sentences, three invented lexicons), with target-language tags, and
everything after training asks which language it translates into."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from nmt.config import DecodingOverrides
from nmt.data import prepare_corpus
from nmt.errors import NMTError
from nmt.inference.translator import Translator
from nmt.metrics import corpus_scores
from nmt.training.loop import train

LANGS = ("de", "fr", "cs")
# Validation BLEU that says a direction was learnt: chance is near 0 (40 invented words a language); the
# 700 updates below reach 55 to 75, where in that range depends on the CPU's kernels.
LEARNT = 45
TOY_MULTI = (
    "data=toy_multi", "tokenizer.vocab_size=300", "data.workers=1", "model.d_model=64", "model.ff_dim=128",
    "optim.lr=3e-3", "optim.warmup_steps=50", "trainer.max_steps=700", "trainer.valid_every=700",
    "trainer.valid_bleu_sentences=40", "trainer.attention_image=false", "trainer.log_every=100",
)  # fmt: skip


@pytest.fixture(scope="module")
def multi_run(toy, tmp_path_factory):
    """The trained multilingual toy model (three target lexicons, 700 updates, ~30 s): its config, its
    last validation and its checkpoint."""
    cfg = toy.config(*TOY_MULTI)
    run_dir = tmp_path_factory.mktemp("multi") / "run"
    final = train(cfg, run_dir)
    return cfg, final, run_dir / "checkpoints" / "last.pt"


@pytest.fixture
def multi_translator(multi_run):
    return Translator.from_checkpoint(str(multi_run[2]), torch.device("cpu"))


def test_each_direction_learns_and_the_tag_chooses_the_language(multi_run, multi_translator):
    cfg, final, _ = multi_run
    for lang in LANGS:
        assert final[f"bleu/src-{lang}"] > LEARNT, final
    assert final["bleu"] == pytest.approx(sum(final[f"bleu/src-{lang}"] for lang in LANGS) / 3)
    data = prepare_corpus(cfg.data, cfg.tokenizer, progress=False)
    sources, refs = data.raw("valid")
    rows = data.group_ranges("valid")
    first = [sources[i] for i in rows[0][:20]]
    sentences = [line.split(" ", 1)[1] for line in first]  # untagged: the same in every direction
    references = {lang: [refs[i] for i in group[:20]] for lang, group in zip(LANGS, rows)}
    decoding = multi_translator.decoding_with(DecodingOverrides())
    for lang, group in zip(LANGS, rows):
        assert [sources[i] for i in group[:20]] == [f">>{lang}<< {s}" for s in sentences]
        multi_translator.choose_target(lang)
        hyps = multi_translator.translations(sentences, decoding).texts
        for other in LANGS:  # the same sources: into the language asked for, not another
            bleu = corpus_scores(hyps, references[other])["bleu"].score
            assert bleu > LEARNT if other == lang else bleu < 5, (lang, other, bleu)


def test_info_lists_the_directions(multi_translator):
    info = multi_translator.info()
    assert info["multilingual"] and info["directions"] == ["src-de", "src-fr", "src-cs"]


def test_a_target_language_is_required_mapped_or_refused(multi_translator, caplog):
    with pytest.raises(
        NMTError, match=r"^tgt_lang: this model translates into several languages \(de, fr, cs\)"
    ):
        multi_translator.encode(["bumini"])
    with pytest.raises(NMTError, match=r"^tgt_lang=ro: the model translates into de, fr, cs only$"):
        multi_translator.choose_target("ro")
    caplog.set_level(logging.INFO)
    assert multi_translator.choose_target("ces") == "cs" and "'ces' taken as 'cs'" in caplog.text
    assert multi_translator.choose_target("FR") == "fr"
    assert multi_translator.encode(["bumini"]) == multi_translator.encode(["bumini"], tgt_lang="fr")


def test_a_direction_never_trained_needs_zero_shot(multi_translator):
    with pytest.raises(NMTError, match=r"de->fr was never trained .*zero_shot=true translates it anyway"):
        multi_translator.choose_target("fr", src_lang="de")
    assert multi_translator.choose_target("fr", src_lang="de", zero_shot=True) == "fr"


def test_translate_script_asks_for_a_language_and_translates_into_it(toy, multi_run, tmp_path):
    checkpoint = f"checkpoint={multi_run[2]}"
    refused = toy.script("translate.py", checkpoint, cwd=tmp_path, stdin="bumini\n")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1].startswith("error: tgt_lang: this model translates into")
    done = toy.script("translate.py", checkpoint, "tgt_lang=cs", cwd=tmp_path, stdin="bumini papabi\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


def test_a_bilingual_model_refuses_a_tag_and_translates_as_before(toy_run):
    translator = Translator.from_checkpoint(str(toy_run.checkpoints / "last.pt"), torch.device("cpu"))
    with pytest.raises(
        NMTError, match=r"^line 2: >>de<< is a target-language tag, but this model is bilingual"
    ):
        translator.encode(["a b", ">>de<< a b"])
    lines = ["bumini papabi zogofo", "rifi toso"]
    assert translator.encode(lines) == translator.tokenizer.encode_src(lines)  # untagged, as before
    assert translator.info()["directions"] == ["src-tgt"] and not translator.info()["multilingual"]


def test_evaluate_scores_every_trained_direction_in_one_report(toy, multi_run, tmp_path):
    proc = toy.script("evaluate.py", f"checkpoint={multi_run[2]}", "data.split=valid", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.splitlines()
    assert rows[0].split()[:3] == ["direction", "bleu", "chrf"]
    table = {row.split()[0]: float(row.split()[1]) for row in rows[1:5]}
    assert set(table) == {"src-de", "src-fr", "src-cs", "mean"} and min(table.values()) > LEARNT
    report = json.loads(Path(rows[-1].removeprefix("report: ")).read_text())
    assert set(report["directions"]) == {"src-de", "src-fr", "src-cs"}
    assert report["mean"]["bleu"] == pytest.approx(table["mean"], abs=0.01)
    one = toy.script(
        "evaluate.py", f"checkpoint={multi_run[2]}", "data.split=valid", "tgt_lang=fr", cwd=tmp_path
    )
    assert one.returncode == 0, one.stderr
    assert "valid.src-fr" in one.stdout


def test_select_final_chooses_on_the_mean_over_directions(toy, multi_run, tmp_path):
    run_dir = multi_run[2].parent.parent
    proc = toy.script("select_final.py", f"run_dir={run_dir}", "candidates=[best.pt,last.pt]", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    choice = json.loads((run_dir / "eval" / "final_choice.json").read_text())
    hyps = sorted(p.name for p in (run_dir / "eval" / "selection").glob("*.hyp"))
    assert hyps == sorted(f"{c}.valid.src-{lang}.hyp" for c in ("best", "last") for lang in LANGS)
    assert all(c["bleu"] > LEARNT for c in choice["candidates"])


def test_the_service_translates_into_the_language_each_request_names(multi_run, multi_translator):
    fastapi = pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from nmt.config import ServerLimits
    from nmt.serve import create_app

    cfg = multi_run[0]
    sources, _ = prepare_corpus(cfg.data, cfg.tokenizer, progress=False).raw("valid")
    sentence = sources[0].split(" ", 1)[1]
    defaults = multi_translator.decoding_with(DecodingOverrides())
    assert fastapi
    with TestClient(create_app(multi_translator, ServerLimits(), defaults)) as client:
        info = client.get("/info").json()
        assert info["directions"] == ["src-de", "src-fr", "src-cs"]
        got = {}
        for lang in LANGS:
            response = client.post("/translate", json={"text": [sentence], "target_lang": lang})
            assert response.status_code == 200, response.text
            got[lang] = response.json()["translations"][0]["text"]
        assert len(set(got.values())) == 3
        for lang in LANGS:  # as the translator asked for that language translates it
            multi_translator.choose_target(lang)
            assert got[lang] == multi_translator.translations([sentence], defaults).texts[0]
        multi_translator.target_lang = None
        refused = client.post("/translate", json={"text": [sentence]})
        assert refused.status_code == 422 and refused.json()["field"] == "target_lang"
        assert "several languages (de, fr, cs)" in refused.json()["error"]
        unknown = client.post("/translate", json={"text": [sentence], "target_lang": "ro"})
        assert unknown.status_code == 422 and "translates into de, fr, cs only" in unknown.json()["error"]


def _corpora(*langs: str) -> str:
    return "data.corpora=[" + ",".join(f"{{source: toy, src_lang: src, tgt_lang: {t}}}" for t in langs) + "]"


def test_a_fine_tune_takes_a_subset_of_the_parents_directions(toy, multi_run, tmp_path):
    parent = f"trainer.init_from={multi_run[2]}"
    few = ("trainer.max_steps=20", "trainer.valid_every=20", "trainer.valid_bleu_sentences=20")
    subset = toy.config(*TOY_MULTI, parent, _corpora("fr", "cs"), "optim.lr=3e-4", *few)
    final = train(subset, tmp_path / "subset")
    assert final["bleu/src-fr"] > 40 and "bleu/src-de" not in final  # from the parent's weights: ~0 else
    with pytest.raises(
        NMTError, match=r"^data\.corpora\[1\]: src->ro: the tag >>ro<< is not in the vocabulary"
    ):
        train(toy.config(*TOY_MULTI, parent, _corpora("fr", "ro"), *few), tmp_path / "new")
    with pytest.raises(NMTError, match=r"^data\.source=toy: trainer\.init_from=.* is multilingual \(src->de"):
        bilingual = toy.config(
            parent, "tokenizer.vocab_size=300", "model.d_model=64", "model.ff_dim=128", *few
        )
        train(bilingual, tmp_path / "bilingual")
    assert (
        not (tmp_path / "new" / "checkpoints").exists()
        and not (tmp_path / "bilingual" / "checkpoints").exists()
    )


def test_the_ctranslate2_export_translates_with_the_tag(toy, multi_run, multi_translator, tmp_path):
    pytest.importorskip("ctranslate2")
    output = tmp_path / "ct2"
    proc = toy.script("export_ct2.py", f"checkpoint={multi_run[2]}", f"output={output}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ct2 = Translator.from_checkpoint(str(multi_run[2]), torch.device("cpu"), "ct2", str(output))
    cfg = multi_run[0]
    sources, _ = prepare_corpus(cfg.data, cfg.tokenizer, progress=False).raw("valid")
    sentences = [line.split(" ", 1)[1] for line in sources[:10]]
    greedy = multi_translator.decoding_with(DecodingOverrides(beam_size=1))
    for lang in LANGS:
        for translator in (ct2, multi_translator):
            translator.choose_target(lang)
        ours = multi_translator.translations(sentences, greedy).texts
        assert ct2.translations(sentences, ct2.decoding_with(DecodingOverrides(beam_size=1))).texts == ours


def test_the_page_translates_into_the_language_chosen_on_its_selector(multi_run, multi_translator, tmp_path):
    """The page of a multilingual model shows a target-language selector listing its languages;
    choosing another translates the sentence again, into that language, as the translator does."""
    pytest.importorskip("fastapi")
    pytest.importorskip("selenium.webdriver")
    from live_service import NO_BROWSER, chromium, headless_chromium, serve_in_thread
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from nmt.config import ServerLimits
    from nmt.serve import create_app

    if chromium() is None:
        pytest.skip(NO_BROWSER)
    cfg = multi_run[0]
    sources, _ = prepare_corpus(cfg.data, cfg.tokenizer, progress=False).raw("valid")
    sentence = sources[0].split(" ", 1)[1]
    defaults = multi_translator.decoding_with(DecodingOverrides())
    expected = {}
    for lang in LANGS:
        multi_translator.choose_target(lang)
        expected[lang] = multi_translator.translations([sentence], defaults).texts[0]
    multi_translator.target_lang = None  # as served: each request names its language
    assert len(set(expected.values())) == len(LANGS)
    app = create_app(multi_translator, ServerLimits(), defaults)
    with serve_in_thread(app) as url, headless_chromium(tmp_path / "profile", "1100,700") as driver:
        wait = WebDriverWait(driver, 60)
        driver.get(f"{url}/")
        wait.until(lambda d: "parameters" in d.find_element(By.ID, "model").text)
        choice = Select(driver.find_element(By.ID, "target-lang"))
        assert driver.find_element(By.ID, "target-choice").is_displayed()
        assert [o.text for o in choice.options] == list(LANGS)
        driver.find_element(By.ID, "source").send_keys(sentence)
        driver.find_element(By.ID, "submit").click()
        wait.until(lambda d: d.find_element(By.ID, "translation").text == expected[LANGS[0]])
        choice.select_by_value("fr")
        wait.until(lambda d: d.find_element(By.ID, "translation").text == expected["fr"])
        model_line = driver.find_element(By.ID, "model").text
        aligned = [w.text for w in driver.find_elements(By.CSS_SELECTOR, "#source-words .word")]
        driver.save_screenshot(str(tmp_path / "page.png"))
    assert model_line.startswith("src-de, src-fr, src-cs: ")
    assert aligned == sentence.split()  # the words of the input: the tag is none of them
    assert (tmp_path / "page.png").stat().st_size > 10_000


def test_evaluate_through_a_pivot_is_two_searches_of_the_same_model(multi_run, multi_translator, tmp_path):
    """pivot= translates into the pivot, then that into the target, with one model; a leg never trained
    is refused in one line unless zero_shot=true, and the report names the route."""
    from nmt.config import EvalFilesConfig, EvaluateConfig
    from nmt.evaluation.evaluate import evaluate_checkpoint

    cfg = multi_run[0]
    sources, _ = prepare_corpus(cfg.data, cfg.tokenizer, progress=False).raw("valid")
    lines = [line.split(" ", 1)[1] for line in sources[:12]]
    for suffix in (".src", ".ref"):
        (tmp_path / f"in{suffix}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    files = EvalFilesConfig(src=str(tmp_path / "in.src"), ref=str(tmp_path / "in.ref"))

    def evaluate(**settings) -> Any:
        run = EvaluateConfig(checkpoint=str(multi_run[2]), eval=files, device="cpu", **settings)
        return evaluate_checkpoint(run, tmp_path / "eval")

    with pytest.raises(NMTError, match=r"^tgt_lang=fr: de->fr was never trained"):
        evaluate(pivot="de", src_lang="src", tgt_lang="fr")
    with pytest.raises(NMTError, match=r"^pivot=de: name the direction it stands between"):
        evaluate(pivot="de", tgt_lang="fr")
    with pytest.raises(NMTError, match=r"^pivot=de with alignments=true: two searches"):
        evaluate(pivot="de", src_lang="src", tgt_lang="fr", zero_shot=True, alignments=True)
    report = evaluate(pivot="DE", src_lang="src", tgt_lang="fr", zero_shot=True)
    assert report.pivot == "src->de->fr" and ".pivot-de." in report.hypotheses
    defaults = multi_translator.decoding_with(DecodingOverrides())
    multi_translator.choose_target("de")
    middle = multi_translator.translations(lines, defaults).texts
    multi_translator.choose_target("fr", "de", zero_shot=True)
    expected = multi_translator.translations(middle, defaults).texts
    assert Path(report.hypotheses).read_text(encoding="utf-8").splitlines() == expected
