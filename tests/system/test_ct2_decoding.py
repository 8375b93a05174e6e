"""The session's trained toy model, exported with scripts/export_ct2.py, decodes like PyTorch through
the CTranslate2 backend: greedy output tokens equal, beam search agreeing on >= 99 % of sentences, and
the same translations from scripts/translate.py and evaluation with ``backend=ct2``."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nmt.config import EvaluateConfig, ExportCT2Config
from nmt.data import prepare_text, read_lines
from nmt.decoding import translate_ids
from nmt.evaluation.evaluate import evaluate_checkpoint
from nmt.inference.translator import Translator

pytest.importorskip("ctranslate2")

from nmt.ct2.backend import CT2Backend  # noqa: E402
from nmt.ct2.export import export_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exported(toy_ct2) -> Path:
    return toy_ct2


@pytest.fixture(scope="module")
def setup(toy_run, exported):
    """The PyTorch translator, the CTranslate2 backend and the tokenised test + valid sources."""
    translator = Translator.from_checkpoint(str(toy_run.checkpoints / "last.pt"), torch.device("cpu"))
    backend = CT2Backend(exported, translator.tokenizer, inter_threads=1, intra_threads=1)
    text = prepare_text(toy_run.cfg.data, progress=False)
    sources = translator.tokenizer.encode_src(read_lines(text / "test.src") + read_lines(text / "valid.src"))
    return translator, backend, sources


@pytest.fixture(scope="module")
def torch_evaluation(toy_run, tmp_path_factory):
    """The PyTorch backend's evaluation of the checkpoint (its config and report), which the CTranslate2
    ones are compared with, in a folder of its own that an evaluation may write beside it."""
    cfg = EvaluateConfig(checkpoint=str(toy_run.checkpoints / "last.pt"), device="cpu")
    out_dir = tmp_path_factory.mktemp("evaluation")
    return cfg, out_dir, evaluate_checkpoint(cfg, out_dir)


def decode_both(setup, **decoding):
    translator, backend, sources = setup
    cfg = replace(translator.cfg.decoding, **decoding)
    ours = translate_ids(translator.model, sources, cfg, "cpu", translator.cfg.model.max_positions)
    return ours, backend.translate_ids(sources, cfg)


def test_greedy_output_tokens_are_the_same(setup):
    ours, theirs = decode_both(setup, beam_size=1)
    assert len(ours) == 400
    for a, b in zip(ours, theirs):
        assert a[0].tokens == b[0].tokens
        # Equal up to the probability of PAD and BOS, which CTranslate2 removes before its softmax.
        assert b[0].log_prob == pytest.approx(a[0].log_prob, abs=5e-3)


def test_beam_search_agrees_on_almost_every_sentence(setup):
    ours, theirs = decode_both(setup)  # the toy experiment's beam 5, alpha 0.6
    same = sum(a[0].tokens == b[0].tokens for a, b in zip(ours, theirs))
    assert same >= 0.99 * len(ours)


def test_a_sentence_decodes_alike_alone_and_among_others(setup, monkeypatch):
    """CTranslate2 takes one length penalty and one length budget per call, and both follow from the
    source length: each call holds sources of one length, so a sentence's n-best list is the same
    alone as among all 400 test sentences."""
    translator, backend, sources = setup
    calls: list[set[int]] = []
    ct2 = backend.translator

    def translate_batch(batch, **kwargs):
        calls.append({len(s) for s in batch})
        return ct2.translate_batch(batch, **kwargs)

    monkeypatch.setattr(
        backend, "translator", SimpleNamespace(translate_batch=translate_batch, score_batch=ct2.score_batch)
    )
    cfg = replace(translator.cfg.decoding, nbest=3)
    together = backend.translate_ids(sources, cfg)
    assert len(calls) == len({len(s) for s in sources}) and all(len(lengths) == 1 for lengths in calls)
    for i in range(0, len(sources), 10):
        alone = backend.translate_ids([sources[i]], cfg)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[i]]
        # CTranslate2's sums of log-probabilities, whose rounding depends on the batch: about 1e-5
        assert [h.score for h in alone] == pytest.approx([h.score for h in together[i]], abs=1e-4)


def test_translate_script_with_the_ct2_backend(toy, toy_run, exported, setup, tmp_path):
    translator, _, _ = setup
    text = prepare_text(toy_run.cfg.data, progress=False)
    inputs = [*read_lines(text / "test.src")[:20], ""]
    checkpoint = toy_run.checkpoints / "last.pt"
    stdin = "".join(line + "\n" for line in inputs)
    proc = toy.script(
        "translate.py",
        f"checkpoint={checkpoint}",
        "backend=ct2",
        f"ct2_model={exported}",
        cwd=tmp_path,
        stdin=stdin,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:-1] == translator.translate(inputs, translator.cfg.decoding)

    refused = toy.script("translate.py", f"checkpoint={checkpoint}", "backend=ct2", cwd=tmp_path, stdin=stdin)
    assert refused.returncode == 1 and refused.stderr.startswith("error: backend=ct2 needs ct2_model=DIR")


def test_benchmark_script_compares_with_ctranslate2_directly(toy, toy_run, exported, tmp_path):
    proc = toy.script(
        "benchmark_ct2.py",
        f"checkpoint={toy_run.checkpoints / 'last.pt'}",
        f"ct2_model={exported}",
        "sentences=30",
        "repeats=1",
        "layouts=[1x1]",
        f"hydra.run.dir={tmp_path}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "ct2_speed.json").read_text())
    assert result["sentences"] == 30 and [row["layout"] for row in result["rows"]] == ["1x1"]
    assert "backend=ct2 against CTranslate2 called directly" in proc.stdout


def test_decoders_benchmark_times_every_row_and_scores_its_output(toy, toy_run, exported, tmp_path):
    """PyTorch per thread count, as processes and over a shortlist; CTranslate2 direct; backend=ct2 with
    and without its vocabulary map: each row timed, with its BLEU; the same search gives the same BLEU."""
    checkpoint = toy_run.checkpoints / "last.pt"
    shortlist = toy.script(
        "build_shortlist.py", f"checkpoint={checkpoint}", f"output={tmp_path / 's.json'}", cwd=tmp_path
    )
    assert shortlist.returncode == 0, shortlist.stderr
    vmap = toy.script(
        "export_ct2.py",
        f"checkpoint={checkpoint}",
        f"output={tmp_path / 'vmap'}",
        f"shortlist={tmp_path / 's.json'}",
        cwd=tmp_path,
    )
    assert vmap.returncode == 0, vmap.stderr
    proc = toy.script(
        "benchmark_decoders.py",
        f"checkpoint={checkpoint}",
        f"ct2_model={exported}",
        f"shortlist={tmp_path / 's.json'}",
        f"ct2_vmap_model={tmp_path / 'vmap'}",
        "sentences=40",
        "repeats=2",
        "torch_threads=[1]",
        "ct2_layouts=[1x1]",
        "decoding.beam_size=1",
        f"hydra.run.dir={tmp_path}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "decoders_speed.json").read_text())
    rows = {row["decoder"]: row for row in result["rows"]}
    names = [re.sub(r"backend=ct2, \d+x\d+", "backend=ct2, AUTO", name) for name in rows]
    assert names == [
        "PyTorch, 1 thread(s)",
        "PyTorch, 2 processes x 1 thread",
        "PyTorch, 1 thread(s), shortlist",
        "PyTorch, 2 processes x 1 thread, shortlist",
        "CTranslate2 direct, 1x1",
        "backend=ct2, AUTO",
        "backend=ct2, AUTO, vocabulary map",
    ]
    assert result["sentences"] == 40 and all(len(row["seconds_all"]) == 2 for row in rows.values())
    assert rows["PyTorch, 1 thread(s)"]["bleu"] == rows["PyTorch, 2 processes x 1 thread"]["bleu"] > 10
    assert rows["CTranslate2 direct, 1x1"]["over_fastest_ct2_direct"] == 1.0
    assert "vs fastest CT2" in proc.stdout


def test_evaluation_with_the_ct2_backend(exported, torch_evaluation):
    torch_cfg, out_dir, ours = torch_evaluation
    ct2 = evaluate_checkpoint(replace(torch_cfg, backend="ct2", ct2_model=str(exported)), out_dir)
    # named after the export's directory ("model"), so that two exports (e.g. int8) keep their own files
    assert ct2.backend == "ct2" and Path(ct2.hypotheses).name.endswith(".ct2-model.hyp")
    assert ct2.ct2_model == str(exported.resolve())
    assert ct2.hypotheses != ours.hypotheses
    assert abs(ct2.scores["bleu"].score - ours.scores["bleu"].score) < 1.0


@pytest.mark.parametrize("quantization", ["int8", "float16"])
def test_a_quantized_model_translates_like_the_full_precision_one(
    toy_run, setup, torch_evaluation, tmp_path, quantization
):
    """What quantization promises, on any x86 CPU (whose int8 kernels round differently): a trained
    model's translations and BLEU stay close to full precision (on AVX2 int8 kernels one toy model
    scored 93.4 against 95.5, and another kept 88 % of its greedy outputs token for token)."""
    translator, full, sources = setup
    output = tmp_path / quantization
    # in this process: the export script itself is the ``toy_ct2`` fixture's
    export_checkpoint(
        ExportCT2Config(
            checkpoint=str(toy_run.checkpoints / "last.pt"), output=str(output), quantization=quantization
        )
    )
    quantized = CT2Backend(output, translator.tokenizer, inter_threads=1, intra_threads=1)
    cfg = replace(translator.cfg.decoding, beam_size=1)
    exact, close = full.translate_ids(sources, cfg), quantized.translate_ids(sources, cfg)
    same = sum(a[0].tokens == b[0].tokens for a, b in zip(exact, close))
    assert same >= 0.85 * len(sources)
    torch_cfg, _, ours = torch_evaluation
    report = evaluate_checkpoint(replace(torch_cfg, backend="ct2", ct2_model=str(output)), tmp_path / "ct2")
    # 200 short toy sentences: one changed word moves BLEU by about a point, so relative, not absolute
    assert report.scores["bleu"].score >= 0.95 * ours.scores["bleu"].score
