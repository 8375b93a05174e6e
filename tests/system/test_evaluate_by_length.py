"""scripts/evaluate.py eval.by_length=true: the by-length table in the printout, the JSON report and
TensorBoard, on the session's toy model."""

from __future__ import annotations

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from nmt.checkpoint import load_checkpoint, model_from_checkpoint
from nmt.data import prepare_text

pytestmark = pytest.mark.slow


def test_evaluate_reports_scores_by_source_length(toy, toy_run, tmp_path):
    """Toy sentences joined into lines of at least 1, 11, 21 and 35 words (toy words are one subword, the
    sentences 3-10 words), so that every bucket but the last fills."""
    root = prepare_text(toy_run.cfg.data, progress=False)
    sources = (root / "test.src").read_text(encoding="utf-8").splitlines()
    refs = (root / "test.tgt").read_text(encoding="utf-8").splitlines()
    src_lines, ref_lines, i = [], [], 0
    for at_least in [1, 11, 21, 35] * 5:
        src, ref = [], []
        while sum(len(s.split()) for s in src) < at_least:
            src.append(sources[i])
            ref.append(refs[i])
            i += 1
        src_lines.append(" ".join(src))
        ref_lines.append(" ".join(ref))
    (tmp_path / "joined.src").write_text("\n".join(src_lines) + "\n", encoding="utf-8")
    (tmp_path / "joined.ref").write_text("\n".join(ref_lines) + "\n", encoding="utf-8")
    checkpoint = toy_run.checkpoints / "last.pt"
    args = [
        f"checkpoint={checkpoint}",
        f"eval.src={tmp_path / 'joined.src'}",
        f"eval.ref={tmp_path / 'joined.ref'}",
    ]
    out = [f"eval.out={tmp_path / 'joined.hyp'}", f"eval.tb_dir={tmp_path / 'run'}", "eval.by_length=true"]
    proc = toy.script("evaluate.py", *args, *out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr

    report = json.loads((tmp_path / "joined.json").read_text())
    rows = {row["bucket"]: row for row in report["by_length"]}
    assert list(rows) == ["1-10", "11-20", "21-30", "31-50", "51+"]
    _, tokenizer, _ = model_from_checkpoint(load_checkpoint(checkpoint))
    lengths = [len(ids) for ids in tokenizer.encode_src(src_lines)]  # source subwords
    for label, low, high in [("1-10", 1, 10), ("11-20", 11, 20), ("21-30", 21, 30), ("31-50", 31, 50)]:
        assert rows[label]["sentences"] == sum(low <= n <= high for n in lengths) > 0
    assert rows["51+"]["sentences"] == 0 and rows["51+"]["bleu"] is None
    assert sum(row["sentences"] for row in rows.values()) == report["sentences"] == 20
    assert 0 <= rows["1-10"]["bleu"] <= 100 and 0 <= rows["31-50"]["chrf"] <= 100

    printed = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.strip()}
    assert printed["11-20"] == [
        "11-20",
        str(rows["11-20"]["sentences"]),
        f"{rows['11-20']['bleu']:.2f}",
        f"{rows['11-20']['chrf']:.2f}",
    ]
    assert printed["51+"] == ["51+", "0", "-", "-"]

    events = EventAccumulator(str(tmp_path / "run" / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"eval_joined/bleu_len_1-10", "eval_joined/chrf_len_31-50", "eval_joined/bleu"} <= tags
    assert "eval_joined/bleu_len_51+" not in tags  # an empty bucket has no score
    assert events.Scalars("eval_joined/bleu_len_21-30")[0].value == pytest.approx(rows["21-30"]["bleu"])
