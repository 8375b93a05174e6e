"""evaluate.py's files: every setting that changes the output has its own, and the n-best file reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_evaluation import TEST_DE, TEST_EN, save_model, tiny_config

from nmt.config import DecodingConfig, DecodingOverrides, EvalFilesConfig, EvaluateConfig
from nmt.data import prepare_corpus, read_lines
from nmt.evaluation.evaluate import EvalReport, evaluate_checkpoint, output_stem


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, compose_train_cfg) -> Path:
    """A random width-16 model (beam 2, alpha 0.6) over a 4-line test split with empty sources."""
    tmp_path = tmp_path_factory.mktemp("eval-outputs")
    cfg = tiny_config(tmp_path, compose_train_cfg)
    data = prepare_corpus(cfg.data, cfg.tokenizer, progress=False)
    return save_model(cfg, data, tmp_path / "run" / "checkpoints" / "model.pt", seed=0)


def evaluate(checkpoint: Path, out_dir: Path, **settings) -> EvalReport:
    decoding = DecodingOverrides(**settings.pop("decoding", {}))
    return evaluate_checkpoint(
        EvaluateConfig(checkpoint=str(checkpoint), device="cpu", decoding=decoding, **settings), out_dir
    )


def test_each_setting_that_changes_the_output_gets_its_own_files(checkpoint, tmp_path):
    runs = {
        "plain": evaluate(checkpoint, tmp_path),
        "alpha": evaluate(checkpoint, tmp_path, decoding={"alpha": 1.0}),
        "alpha, nbest": evaluate(checkpoint, tmp_path, decoding={"alpha": 1.0, "nbest": 2}),
        "no_repeat_ngram": evaluate(checkpoint, tmp_path, decoding={"no_repeat_ngram": 2}),
        "the checkpoint's alpha, said": evaluate(checkpoint, tmp_path, decoding={"alpha": 0.6}),
    }
    names = {what: Path(r.hypotheses).name for what, r in runs.items()}
    assert names == {
        "plain": "model.test.beam2.hyp",  # the checkpoint's own settings keep the plain name
        "alpha": "model.test.beam2.alpha1.hyp",
        "alpha, nbest": "model.test.beam2.alpha1.nbest2.hyp",
        "no_repeat_ngram": "model.test.beam2.no_repeat_ngram2.hyp",
        "the checkpoint's alpha, said": "model.test.beam2.hyp",
    }
    for what in ("alpha", "alpha, nbest", "no_repeat_ngram"):  # each report is its own run's
        written = json.loads(Path(runs[what].report).read_text())
        assert written["decoding"] == json.loads(json.dumps(vars(runs[what].decoding)))
    assert json.loads(Path(runs["plain"].report).read_text())["decoding"]["alpha"] == 0.6


def test_a_prefixed_evaluation_keeps_the_plain_one(checkpoint, tmp_path):
    plain = evaluate(checkpoint, tmp_path)
    before = (Path(plain.hypotheses).read_text(), Path(plain.report).read_text())
    prefixes = tmp_path / "prefixes.txt"
    prefixes.write_text("die\n\n\neine\n", encoding="utf-8")  # words of common letters (a rare one is <unk>)
    prefixed = evaluate(checkpoint, tmp_path, prefix_file=str(prefixes))
    assert Path(prefixed.hypotheses).name.startswith("model.test.beam2.prefix-")
    assert (Path(plain.hypotheses).read_text(), Path(plain.report).read_text()) == before
    assert read_lines(Path(prefixed.hypotheses))[0].startswith("die")
    prefixes.write_text("eine\n\n\ndie\n", encoding="utf-8")  # other prefixes at the same path
    assert evaluate(checkpoint, tmp_path, prefix_file=str(prefixes)).hypotheses != prefixed.hypotheses


def test_files_given_as_eval_src_never_take_a_split_name(checkpoint, tmp_path):
    """eval.src=test.en (here: the test split's own text) must not overwrite data.split=test's files."""
    (tmp_path / "test.en").write_text("".join(f"{line}\n" for line in TEST_EN[:1]), encoding="utf-8")
    (tmp_path / "test.de").write_text("".join(f"{line}\n" for line in TEST_DE[:1]), encoding="utf-8")
    split = evaluate(checkpoint, tmp_path / "eval")
    files = EvalFilesConfig(src=str(tmp_path / "test.en"), ref=str(tmp_path / "test.de"))
    given = evaluate(checkpoint, tmp_path / "eval", eval=files)
    assert Path(given.hypotheses).name.startswith("model.test-") and given.hypotheses != split.hypotheses
    assert (
        len(read_lines(Path(split.hypotheses))) == 4
        and json.loads(Path(split.report).read_text())["sentences"] == 4
    )


def test_the_nbest_file_reads_back_by_sentence_id(checkpoint, tmp_path):
    report = evaluate(checkpoint, tmp_path, decoding={"nbest": 2})
    best = read_lines(Path(report.hypotheses))
    assert report.nbest == str(Path(report.hypotheses).with_suffix(".nbest"))
    lists: dict[int, list[tuple[str, float]]] = {}
    for line in read_lines(Path(report.nbest)):
        head, _, score = line.rpartition(" ||| ")
        sentence, _, text = head.partition(" ||| ")
        lists.setdefault(int(sentence), []).append((text, float(score)))
    # the empty sources (lines 1 and 2) have no hypotheses; the others their 2, best first
    assert sorted(lists) == [0, 3]
    for i, hyps in lists.items():
        assert len(hyps) == 2 and hyps[0][0] == best[i]
        assert hyps[0][1] >= hyps[1][1]


@pytest.mark.parametrize(
    ("model_dir", "tag"),
    [
        ("outputs/RUN/ct2", ".ct2"),
        ("outputs/RUN/ct2-int8", ".ct2-int8"),
        ("outputs/RUN/export", ".ct2-export"),
    ],
)
def test_a_ct2_evaluation_is_named_after_its_model_directory(model_dir, tag):
    cfg = EvaluateConfig(checkpoint="run/checkpoints/best.pt", backend="ct2", ct2_model=model_dir)
    decoding = DecodingConfig()
    stem = output_stem(cfg, ["run/checkpoints/best.pt"], "test", decoding, decoding, ([], []))
    assert stem == f"best.test.beam5{tag}"


def test_alignments_of_another_layer_get_their_own_file(checkpoint, tmp_path):
    default = evaluate(checkpoint, tmp_path, alignments=True)
    first = evaluate(checkpoint, tmp_path, alignments=True, alignment_layer=0)
    assert Path(default.alignments).name == "model.test.beam2.align"
    assert Path(first.alignments).name == "model.test.beam2.layer0.align"
    assert Path(default.alignments).is_file() and Path(first.alignments).is_file()
