"""Hugging Face transformers export on tiny random models: every exportable variant loads in stock
transformers as the class it maps to and computes what ours computes (logits within fp32 rounding, the
same greedy output), what no class holds is refused in one line, the tokenizer gives our ids, and the
output folder is replaced only when it is an earlier export. Trained toy models:
tests/system/test_export_hf.py."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import random_model, sentencepiece_model

from nmt.checkpoint import FORMAT_VERSION, atomic_save, weights_digest
from nmt.config import (
    DecodingConfig,
    ExportHFConfig,
    HFCheckConfig,
    HFDataConfig,
    LocalDataConfig,
    MultiDataConfig,
    RNNSearchConfig,
    ToyDataConfig,
    TrainConfig,
    TransformerConfig,
    to_container,
)
from nmt.decoding import pad_batch
from nmt.errors import NMTError
from nmt.evaluation.evaluate import own_reports
from nmt.models import count_parameters
from nmt.text.special import BOS_ID, EOS_ID, PAD_ID
from nmt.text.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")
# MarianTokenizer recommends sacremoses for a normalisation that its tokenization never calls.
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

from huggingface_hub import ModelCard  # noqa: E402

from nmt.hf.card import CardFacts, model_card  # noqa: E402
from nmt.hf.convert import BLENDERBOT, MARIAN, hf_class  # noqa: E402
from nmt.hf.exporter import RECORD, check_sentences, export_checkpoint, export_model  # noqa: E402
from nmt.hf.parity import Parity, special_texts  # noqa: E402
from nmt.hf.tokenizer_files import write_tokenizer  # noqa: E402

TINY = TransformerConfig(
    d_model=32, ff_dim=64, heads=4, encoder_layers=2, decoder_layers=2, max_positions=48, dropout=0.0
)
# A random model never ends early: every sentence runs to this budget, where EOS is forced.
DECODING = DecodingConfig(beam_size=3, max_len_a=1.0, max_len_b=2)


@pytest.fixture(scope="module")
def spm_models() -> dict:
    src, text = sentencepiece_model(0, 90)
    tgt, _ = sentencepiece_model(1, 70)
    return {"joint": Tokenizer(src), "separate": Tokenizer(src, tgt), "text": text}


def train_config(model_cfg, decoding: DecodingConfig = DECODING) -> TrainConfig:
    return TrainConfig(data=ToyDataConfig(), model=model_cfg, decoding=decoding)


def check_text(spm_models) -> list[str]:
    """Sentences of different lengths (padded batches), one long enough for positions far from 0."""
    text = spm_models["text"]
    return [*text[:8], " ".join(text[20:30])]


def export(spm_models, tmp_path: Path, cfg=TINY, vocab: str = "joint", **kwargs):
    tokenizer = spm_models[vocab]
    model = random_model(cfg, tokenizer)
    kwargs = {"check": HFCheckConfig(), "sentences": check_text(spm_models), **kwargs}
    output = kwargs.pop("output", tmp_path / "hf")
    parity = export_model(model, tokenizer, train_config(cfg), output, **kwargs)
    return model, tokenizer, output, parity


# --------------------------------------------------------------------------------------- variants
VARIANTS = {
    "pre-norm-sinusoidal": ({}, "joint", BLENDERBOT),
    "pre-norm-learned": ({"positional": "learned"}, "joint", BLENDERBOT),
    "pre-norm-gqa": ({"kv_heads": 2}, "joint", BLENDERBOT),
    "post-norm-sinusoidal": ({"norm_first": False}, "joint", MARIAN),
    "post-norm-separate-vocabularies": ({"norm_first": False}, "separate", MARIAN),
    "post-norm-mqa": ({"norm_first": False, "kv_heads": 1}, "joint", MARIAN),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_exported_variant_loads_as_its_class_and_computes_what_ours_computes(spm_models, tmp_path, variant):
    settings, vocab, class_name = VARIANTS[variant]
    cfg = replace(TINY, **settings)
    model, tokenizer, output, parity = export(spm_models, tmp_path, cfg, vocab)

    assert parity.max_abs_diff < 1e-4
    assert parity.identical == len(parity.sentences) and not parity.differences
    assert not parity.tokenizer_mismatches and not parity.text_mismatches
    assert json.loads((output / "config.json").read_text())["architectures"] == [class_name]
    # Independently of the exporter's own check: the stock class, loaded from the folder.
    hf_model = transformers.AutoModelForSeq2SeqLM.from_pretrained(output).eval()
    assert type(hf_model).__name__ == class_name
    text = check_text(spm_models)
    limit = cfg.max_positions - 1
    src = pad_batch([s[:limit] for s in tokenizer.encode_src(text)], "cpu")
    targets = [t[:limit] for t in tokenizer.encode_tgt(text[::-1])]
    tgt_in = pad_batch([[BOS_ID, *t[:-1]] for t in targets], "cpu")  # BOS, the target, padding
    with torch.no_grad():
        ours = model(src, tgt_in)
        theirs = hf_model(input_ids=src, attention_mask=src.ne(PAD_ID), decoder_input_ids=tgt_in).logits
    real = tgt_in.ne(PAD_ID) & tgt_in.ne(EOS_ID)
    assert torch.allclose(ours[real], theirs[real], atol=1e-4)


# -------------------------------------------------------------------------------------- refusals
REFUSED = {
    "rope": (replace(TINY, positional="rope"), True, "model.positional='rope'"),
    "additive-self": (replace(TINY, self_attention="additive"), True, "model.self_attention='additive'"),
    "additive-cross": (replace(TINY, cross_attention="additive"), True, "model.cross_attention='additive'"),
    "rnnsearch": (RNNSearchConfig(), True, "model.arch='rnnsearch'"),
    "untied": (replace(TINY, share_embeddings=False), True, "model.share_embeddings=false"),
    "pre-norm-separate": (TINY, False, "tokenizer.joint=false with model.norm_first=true"),
    "post-norm-learned": (
        replace(TINY, norm_first=False, positional="learned"),
        True,
        "model.positional='learned' with model.norm_first=false",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_no_stock_class_holds_is_refused_in_one_line(case):
    cfg, joint, setting = REFUSED[case]
    with pytest.raises(NMTError) as e:
        hf_class(cfg, joint)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{setting} cannot be exported to transformers: ")
    assert "train with" in message or "exports" in message  # and says which settings would export


@pytest.mark.parametrize(
    "preset", ["multi30k_cpu", "multi30k_distill_cpu", "multi30k_multi_cpu", "multi30k_many_cpu"]
)
def test_the_main_job_and_its_followers_export(compose_train_cfg, preset):
    """The model a user trains first goes to the Hub: its preset's architecture has a stock class."""
    cfg = compose_train_cfg(f"experiment={preset}")
    assert hf_class(cfg.model, cfg.tokenizer.joint) == BLENDERBOT  # pre-norm, one vocabulary


@pytest.mark.parametrize(
    "cfg", [replace(TINY, positional="rope"), RNNSearchConfig()], ids=["rope", "rnnsearch"]
)
def test_script_refuses_before_loading_the_weights(spm_models, tmp_path, cfg):
    """The checkpoint holds no weights at all: the refusal comes first, and nothing is written."""
    path = tmp_path / "ckpt.pt"
    atomic_save(
        {
            "format": FORMAT_VERSION,
            "model": {},
            "config": to_container(TrainConfig(data=ToyDataConfig(), model=cfg)),
            "tokenizer": spm_models["joint"].state_dict(),
            "progress": {"step": 7},
        },
        path,
    )
    with pytest.raises(NMTError, match="cannot be exported to transformers"):
        export_checkpoint(ExportHFConfig(checkpoint=str(path), output=str(tmp_path / "hf")))
    assert not (tmp_path / "hf").exists()


# ------------------------------------------------------------------------------------- tokenizer
@pytest.mark.parametrize("vocab", ["joint", "separate"])
def test_auto_tokenizer_gives_our_ids_and_text(spm_models, tmp_path, vocab):
    tokenizer = spm_models[vocab]
    write_tokenizer(tokenizer, tmp_path, ("src", "tgt"), max_positions=48)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = spm_models["text"][:20]
    assert hf_tokenizer(text).input_ids == [[*ids, EOS_ID] for ids in tokenizer.encode_src(text)]
    targets = tokenizer.encode_tgt(text)
    assert hf_tokenizer(text_target=text).input_ids == [[*ids, EOS_ID] for ids in targets]
    assert hf_tokenizer.batch_decode(targets, skip_special_tokens=True) == tokenizer.decode_tgt(targets)


@pytest.mark.parametrize("vocab", ["joint", "separate"])
def test_the_special_tokens_text_in_a_sentence_is_text_as_ours_reads_it(spm_models, tmp_path, vocab):
    """``</s>``, ``<unk>``, ``<pad>``, ``<s>`` written in a sentence: AutoTokenizer gives our ids (the
    model never sees an EOS the user did not mean), on both sides, also in a vocabulary that has none of
    their characters (where SentencePiece names such text by the special piece, with the unknown id)."""
    tokenizer = spm_models[vocab]
    write_tokenizer(tokenizer, tmp_path, ("src", "tgt"), max_positions=48)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    texts = special_texts(tokenizer, spm_models["text"]) + ["ab</s>cd <pad> x", "é</s>é"]
    assert hf_tokenizer(texts).input_ids == [[*ids, EOS_ID] for ids in tokenizer.encode_src(texts)]
    targets = tokenizer.encode_tgt(texts)
    assert hf_tokenizer(text_target=texts).input_ids == [[*ids, EOS_ID] for ids in targets]


def test_an_export_whose_tokenizer_reads_special_text_as_special_fails(spm_models, tmp_path, monkeypatch):
    """The check compares tokenizations of such text: a tokenizer that reads ``</s>`` as EOS (as
    transformers does by default) fails the export in one line, and nothing is written."""

    def as_by_default(tokenizer, folder, direction, max_positions):
        write_tokenizer(tokenizer, folder, direction, max_positions)
        config = json.loads((folder / "tokenizer_config.json").read_text())
        del config["split_special_tokens"]
        (folder / "tokenizer_config.json").write_text(json.dumps(config))

    monkeypatch.setattr("nmt.hf.exporter.write_tokenizer", as_by_default)
    with pytest.raises(NMTError, match="the exported tokenizer encodes .* to other ids than ours"):
        export(spm_models, tmp_path)
    assert not (tmp_path / "hf").exists()


# ------------------------------------------------------------------------------ files and the card
SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3"


def scored(test_set: str, bleu: float, chrf: float | None = None) -> dict:
    """A report of scripts/evaluate.py, as the card reads it."""
    scores = {"bleu": bleu} if chrf is None else {"bleu": bleu, "chrf": chrf}
    return {
        "test_set": test_set,
        "sentences": 1000,
        "decoding": {"beam_size": 5, "alpha": 1.5},
        "scores": {n: {"name": n, "score": v, "signature": SIGNATURE} for n, v in scores.items()},
    }


def test_generation_config_holds_our_ids_and_decoding_settings(spm_models, tmp_path):
    decoding = replace(DECODING, beam_size=4, no_unk=True, no_repeat_ngram=3)
    tokenizer = spm_models["joint"]
    export_model(
        random_model(TINY, tokenizer),
        tokenizer,
        train_config(TINY, decoding),
        tmp_path / "hf",
        HFCheckConfig(),
        check_text(spm_models),
    )
    generation = transformers.GenerationConfig.from_pretrained(tmp_path / "hf")
    assert (generation.decoder_start_token_id, generation.eos_token_id, generation.pad_token_id) == (2, 3, 0)
    assert sorted(generation.suppress_tokens) == [0, 1, 2]  # PAD, BOS, and UNK with no_unk
    assert (generation.num_beams, generation.no_repeat_ngram_size) == (4, 3)
    assert generation.max_length == TINY.max_positions + 1 and generation.forced_eos_token_id == EOS_ID


def test_card_and_record_describe_the_model_and_its_scores(spm_models, tmp_path):
    report = scored("test", 40.81)
    meta = {"checkpoint": str(tmp_path / "final.pt"), "step": 15298}
    model, tokenizer, output, _ = export(spm_models, tmp_path, meta=meta, test_reports=[report])
    card = (output / "README.md").read_text()
    assert card.startswith("---\nlanguage:\n- src\n- tgt\n")
    assert "exported from nmt" in card and BLENDERBOT in card
    assert f"{count_parameters(model):,} parameters" in card
    assert f"BLEU **40.81** (`{SIGNATURE}`)" in card and "step 15,298" in card
    (result,) = ModelCard(card).data.eval_results
    assert (result.metric_type, result.metric_value, result.metric_config) == ("bleu", 40.81, SIGNATURE)
    record = json.loads((output / RECORD).read_text())
    assert record["weights_sha256"] == weights_digest(model) and record["step"] == 15298
    assert record["tokenizer_fingerprint"] == tokenizer.fingerprint
    assert record["checkpoint"] == "final.pt"  # the folder is published: its name, not the path here


def test_card_header_is_yaml_that_reads_back_and_publishes_no_local_path(tmp_path):
    """Languages that YAML would misread (``no`` is false) or that would break the header (``: ``, ``#``,
    a newline, ``---``) read back as written; local data is named by its corpus, hub data by its
    revision, and neither the data folder nor the checkpoint's path (nor a path in the training
    command) is published."""
    run = tmp_path / "home" / "secret" / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(
        f"- data=local\n- data.dir={tmp_path}/home/secret/corpus\n"
    )
    checkpoint = run / "checkpoints" / "final.pt"
    parity = Parity(["a b"], 0.0, ["x"], ["x"], [], [], [], [])
    facts = CardFacts(BLENDERBOT, 10, {"src": 90, "tgt": 90}, checkpoint, 3, parity, [])
    languages = ["no", "de: x #y\n---\nz"]
    data = LocalDataConfig(
        name="corpus", dir=f"{tmp_path}/home/secret/corpus", src_lang="no", tgt_lang=languages[1]
    )
    card = model_card(TrainConfig(data=data, model=TINY), facts, "hf")
    assert ModelCard(card).data.language == languages
    assert "the corpus corpus" in card and "data.dir=.../corpus" in card and "secret" not in card
    assert "python scripts/train.py data=local" in card
    (run / ".hydra" / "hydra.yaml").write_text("hydra:\n  job:\n    name: pipeline\n")  # scripts/run.sh's run
    assert "python scripts/pipeline.py data=local" in model_card(
        TrainConfig(data=data, model=TINY), facts, "hf"
    )
    hub = HFDataConfig(path="wmt/wmt14", config_name="de-en", src_lang="de", tgt_lang="en")
    card = model_card(TrainConfig(data=hub, model=TINY), facts, "hf")
    assert f"wmt/wmt14 (de-en, revision {hub.revision})" in card
    header = ModelCard(card).data
    assert (header.license, header.license_name) == ("other", "wmt-wmt14") and header.datasets == [
        "wmt/wmt14"
    ]
    assert header.license_link == "https://huggingface.co/datasets/wmt/wmt14" and header.eval_results is None


def test_card_header_has_the_datas_terms_and_each_directions_test_scores_in_a_model_index(tmp_path):
    """A multilingual model's card: one license and dataset for its Multi30k corpora, and each direction's
    BLEU and chrF with sacrebleu's signature, in the order of training, as the Hub reads the header."""
    corpora = [{"source": "multi30k", "src_lang": "en", "tgt_lang": t} for t in ("de", "fr")]
    data = MultiDataConfig(name="m30k", corpora=corpora)
    parity = Parity(["a b"], 0.0, ["x"], ["x"], [], [], [], [])
    reports = [scored("test.en-fr", 61.2, 76.5), scored("test.en-de", 40.3, 64.7)]
    facts = CardFacts(MARIAN, 10, {"src": 90, "tgt": 90}, tmp_path / "final.pt", 3, parity, reports)
    card = ModelCard(model_card(TrainConfig(data=data, model=TINY), facts, "hf"))
    assert card.data.language == ["en", "de", "fr"] and card.data.datasets == ["multi30k"]
    assert (card.data.license, card.data.license_link) == ("other", "https://github.com/multi30k/dataset")
    assert card.data.metrics == ["bleu", "chrf"] and card.data.model_name == "hf"
    assert [
        (r.dataset_config, r.dataset_split, r.metric_type, r.metric_value) for r in card.data.eval_results
    ] == [
        ("en-de", "test", "bleu", 40.3),
        ("en-de", "test", "chrf", 64.7),
        ("en-fr", "test", "bleu", 61.2),
        ("en-fr", "test", "chrf", 76.5),
    ]
    assert {r.metric_config for r in card.data.eval_results} == {SIGNATURE}
    assert "en->de, on `test.en-de`" in card.text and "- chrF **76.50**" in card.text


def test_own_reports_are_the_checkpoints_plain_test_evaluations(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "eval").mkdir()
    checkpoint = run / "checkpoints" / "final.pt"
    mine = {"checkpoint": str(checkpoint.resolve()), "step": 3, "scores": {}}
    (run / "eval" / "final.test.beam5.alpha1.json").write_text(json.dumps({**mine, "step": 1}))
    (run / "eval" / "final.test.beam5.ct2.json").write_text(json.dumps({**mine, "step": 2}))
    assert own_reports(checkpoint, "test") == []  # other settings, another backend: not its own
    (run / "eval" / "final.test.beam5.json").write_text(json.dumps(mine))
    assert own_reports(checkpoint, "test") == [mine]
    assert own_reports(run / "checkpoints" / "best.pt", "test") == []
    # a multilingual model's, per direction; not the summary of them all, nor a pivot's
    (run / "eval" / "final.test.beam5.json").unlink()
    fr = {**mine, "test_set": "test.en-fr"}
    (run / "eval" / "final.test.en-fr.beam5.json").write_text(json.dumps(fr))
    (run / "eval" / "final.test.en-fr.beam5.pivot-de.json").write_text(json.dumps(fr))
    (run / "eval" / "final.test.directions.beam5.json").write_text(
        json.dumps({"checkpoint": mine["checkpoint"]})
    )
    assert own_reports(checkpoint, "test") == [fr]


def test_check_sentences_are_validated():
    assert check_sentences(HFCheckConfig(text=["a b"])) == (["a b"], None)
    with pytest.raises(NMTError, match="check.ref needs check.src"):
        check_sentences(HFCheckConfig(ref="refs.txt"))
    with pytest.raises(NMTError, match="check.text is empty"):
        check_sentences(HFCheckConfig(text=[]))


# ----------------------------------------------------------------------------- the output folder
FEW = ["abc def", "ghi"]  # what these tests check is the folder, not the translations


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_output_is_replaced_only_when_it_is_an_earlier_export(spm_models, tmp_path, sentences=FEW):
    output = tmp_path / "hf"
    output.mkdir()
    (output / "notes.txt").write_text("mine")
    for force in (False, True):  # a folder the exporter did not write is never replaced
        with pytest.raises(NMTError, match=f"did not write \\(no {RECORD}\\)"):
            export(spm_models, tmp_path, force=force, sentences=FEW)
    assert [p.name for p in output.iterdir()] == ["notes.txt"]

    (output / "notes.txt").unlink()  # an empty folder is filled
    export(spm_models, tmp_path, sentences=FEW)
    (output / "stale.bin").write_text("from the earlier export")
    with pytest.raises(NMTError, match="add force=true"):
        export(spm_models, tmp_path, sentences=FEW)
    export(spm_models, tmp_path, force=True, sentences=FEW)
    assert not (output / "stale.bin").exists() and (output / RECORD).is_file()
    assert leftovers(tmp_path) == []
    assert oct(output.stat().st_mode & 0o777) == oct(0o777 & ~_umask())


def test_output_dot_inside_an_earlier_export_is_refused_before_the_work(spm_models, tmp_path, monkeypatch):
    """``output=. force=true`` run inside an earlier export would rename the directory it runs in: refused
    at start, in one line, with the export whole and nothing left beside it."""
    output = tmp_path / "hf"
    export(spm_models, tmp_path, sentences=FEW)
    written = sorted(p.name for p in output.iterdir())
    monkeypatch.chdir(output)
    with pytest.raises(NMTError, match="output=. holds the current directory"):
        export(spm_models, tmp_path, output=".", force=True, sentences=FEW)
    assert sorted(p.name for p in output.iterdir()) == written and leftovers(tmp_path) == []


def test_a_symbolic_link_is_never_followed(spm_models, tmp_path):
    target = tmp_path / "elsewhere"
    export(spm_models, tmp_path, output=target, sentences=FEW)
    (tmp_path / "hf").symlink_to(target, target_is_directory=True)
    before = sorted(p.name for p in target.iterdir())
    with pytest.raises(NMTError, match="symbolic link"):
        export(spm_models, tmp_path, force=True, sentences=FEW)
    assert sorted(p.name for p in target.iterdir()) == before


def test_a_failed_check_leaves_the_earlier_export_and_no_temporary_folder(spm_models, tmp_path):
    """Marian's recomputed table rounds differently from ours (about 1e-6): a tolerance below that fails."""
    post_norm = replace(TINY, norm_first=False)
    export(spm_models, tmp_path, post_norm, sentences=FEW)
    record = (tmp_path / "hf" / RECORD).read_text()
    with pytest.raises(NMTError, match="logits differ from ours"):
        export(
            spm_models, tmp_path, post_norm, check=HFCheckConfig(tolerance=1e-12), force=True, sentences=FEW
        )
    assert (tmp_path / "hf" / RECORD).read_text() == record
    assert leftovers(tmp_path) == []


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask
