"""Trained toy models of every exportable variant, exported to Hugging Face transformers: stock
``generate`` on the toy test set, called as a user calls it (``AutoTokenizer``, a padded batch), gives
our greedy output token for token; scripts/export_hf.py checks the same on the test split itself and
prints both models' BLEU."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from nmt.checkpoint import load_checkpoint, model_from_checkpoint
from nmt.config import ExportHFConfig, HFCheckConfig
from nmt.data import read_lines
from nmt.decoding import translate_ids
from nmt.decoding.common import length_budget
from nmt.errors import NMTError
from nmt.text.special import EOS_ID, PAD_ID
from nmt.text.tags import tagged

transformers = pytest.importorskip("transformers")

from nmt.hf.exporter import export_checkpoint  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")]

# Short runs of the toy task for what the toy preset (pre-norm, learned positions, multi-head attention:
# Blenderbot) is not: sinusoidal positions in Blenderbot, here with grouped-query attention (its key/value
# heads repeated), and Marian's post-norm layers with their permuted features.
SHORT = ("trainer.max_steps=150", "trainer.valid_every=150", "model.d_model=64", "model.ff_dim=128")
VARIANTS = {
    "pre-norm-sinusoidal-gqa": ("model.positional=sinusoidal", "model.kv_heads=2"),
    "post-norm-sinusoidal": ("model.positional=sinusoidal", "model.norm_first=false"),
}


def hf_greedy_as_a_user_calls_it(folder: Path, sentences: list[str], budgets: list[int]) -> list[list[int]]:
    """``generate`` on ``AutoTokenizer``'s ids, a sentence at a time with our length budget for it (the
    start token, at most ``budget`` tokens, EOS: generate's ``max_length``)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    out = []
    with torch.inference_mode():
        for sentence, budget in zip(sentences, budgets):
            row = model.generate(
                **tokenizer([sentence], return_tensors="pt"), num_beams=1, max_length=budget + 2
            )
            row = row[0, 1:].tolist()  # after the decoder's start token
            out.append([t for t in (row[: row.index(EOS_ID)] if EOS_ID in row else row) if t != PAD_ID])
    return out


def assert_same_greedy_output(checkpoint: Path, folder: Path, sentences: list[str]) -> None:
    model, tokenizer, cfg = model_from_checkpoint(load_checkpoint(checkpoint))
    greedy = replace(cfg.decoding, beam_size=1)
    sources = tokenizer.encode_src(sentences)
    ours = translate_ids(model, sources, greedy, "cpu", cfg.model.max_positions)
    limit = cfg.model.max_positions - 1
    budgets = [length_budget(len(s) + 1, greedy.max_len_a, greedy.max_len_b, limit) for s in sources]
    assert [h[0].tokens for h in ours] == hf_greedy_as_a_user_calls_it(folder, sentences, budgets)


def test_the_toy_model_exported_by_the_script(toy, toy_run, toy_text, tmp_path):
    checkpoint, output = toy_run.checkpoints / "last.pt", tmp_path / "hf"
    test_src, test_ref = toy_text / "test.src", toy_text / "test.tgt"
    proc = toy.script(
        "export_hf.py",
        f"checkpoint={checkpoint}",
        f"output={output}",
        f"check.src={test_src}",
        f"check.ref={test_ref}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    sentences = read_lines(test_src)
    assert f"greedy: identical token ids on {len(sentences)} of {len(sentences)} sentences" in proc.stdout
    assert "nmt: BLEU = " in proc.stdout and "transformers: BLEU = " in proc.stdout
    assert_same_greedy_output(checkpoint, output, sentences)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_exportable_variant_trained_and_exported(toy, toy_text, tmp_path, variant):
    run = toy.train(tmp_path / "run", *toy.short, *SHORT, *VARIANTS[variant])
    checkpoint, output = run.checkpoints / "last.pt", tmp_path / "hf"
    export_checkpoint(ExportHFConfig(checkpoint=str(checkpoint), output=str(output)))
    assert_same_greedy_output(checkpoint, output, read_lines(toy_text / "test.src"))


def test_a_multilingual_model_exported_translates_with_its_tags(toy, toy_text, tmp_path):
    """A tagged model (three target lexicons of the toy task), post-norm with sinusoidal positions, goes
    to stock MarianMTModel: MarianTokenizer reads ``>>fr<<`` as the one token ours has, and greedy output
    into every target language is ours; references are refused, as one check covers every language."""
    multi = ("data=toy_multi", "data.workers=1", "optim.lr=3e-3")
    run = toy.train(tmp_path / "run", *toy.short, *SHORT, *VARIANTS["post-norm-sinusoidal"], *multi)
    checkpoint, output = run.checkpoints / "last.pt", tmp_path / "hf"
    sentences = read_lines(toy_text / "test.src")[:20]
    with pytest.raises(NMTError, match=r"^check\.ref: a multilingual model is checked into each"):
        export_checkpoint(
            ExportHFConfig(checkpoint=str(checkpoint), output=str(output), check=_check(toy_text, True))
        )
    assert not output.exists()
    parity = export_checkpoint(
        ExportHFConfig(checkpoint=str(checkpoint), output=str(output), check=_check(toy_text, False))
    )
    assert len(parity.sentences) == 3 * len(read_lines(toy_text / "test.src"))
    # Marian's recomputed sinusoid moves the logits by about 1e-6: only a greedy tie closer than that
    # may go the other way
    assert parity.identical >= 0.99 * len(parity.sentences)
    assert all(difference.margin < 1e-5 for difference in parity.differences)
    tokenizer = transformers.AutoTokenizer.from_pretrained(output)
    assert type(tokenizer).__name__ == "MarianTokenizer"
    assert sorted(tokenizer.supported_language_codes) == [">>cs<<", ">>de<<", ">>fr<<"]
    assert type(transformers.AutoModelForSeq2SeqLM.from_pretrained(output)).__name__ == "MarianMTModel"
    for lang in ("de", "fr", "cs"):
        assert_same_greedy_output(checkpoint, output, tagged(lang, sentences))
    card = (output / "README.md").read_text()
    assert "# src->de, src->fr, src->cs translation" in card and "`>>fr<<`" in card


def _check(toy_text: Path, refs: bool) -> HFCheckConfig:
    src = str(toy_text / "test.src")
    return HFCheckConfig(src=src, ref=str(toy_text / "test.tgt") if refs else None)
