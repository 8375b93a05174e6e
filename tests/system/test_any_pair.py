"""Any language pair, any corpus: the presets and data=hf as a user types them, each against the hub
stand-in serving a small copy of the real dataset's layout (tests/hub_datasets.py), prepared and
trained for a few updates."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from hub_datasets import flat_jsonl, flores_plus, iwslt2017, opus100, opus_books, wmt
from hub_standin import standin_hub

from nmt.data import prepare_text, read_text
from nmt.training.loop import train

FEW_UPDATES = (
    "experiment=toy", "tokenizer.vocab_size=120", "model.d_model=32", "model.ff_dim=64", "model.heads=2",
    "trainer.max_steps=3", "trainer.valid_every=3", "trainer.valid_bleu_sentences=4",
    "trainer.attention_image=false", "trainer.progress=false", "trainer.precision=fp32",
    "trainer.device=cpu", "data.workers=1", "data.train_size=100",
)  # fmt: skip


@pytest.fixture
def hub(tmp_path, monkeypatch):
    for standin in standin_hub(tmp_path, monkeypatch):
        standin.add_repo("wmt/wmt16", wmt("16", ["de-en", "ro-en"]))
        main, converted = iwslt2017(["de-en", "en-de"])
        standin.add_repo("IWSLT/iwslt2017", main, converted)
        standin.add_repo("Helsinki-NLP/opus-100", opus100(["de-en", "en-fr"]))
        flores = flores_plus({"de": "deu_Latn", "en": "eng_Latn", "fr": "fra_Latn"})
        standin.add_repo("openlanguagedata/flores_plus", flores, gated=True)
        standin.add_repo("Helsinki-NLP/opus_books", opus_books(["de-en", "en-fr"]))
        main, converted = flat_jsonl()
        standin.add_repo("bentrevett/multi30k", main, converted)
        yield standin


def trained(compose_train_cfg, tmp_path, *overrides: str):
    """The config as train.py gets it, trained a few updates: (config, the last checkpoint)."""
    cfg = compose_train_cfg(*FEW_UPDATES, f"data.cache_dir={tmp_path / 'data'}", *overrides)
    train(cfg, tmp_path / "run")
    return cfg, torch.load(tmp_path / "run/checkpoints/last.pt", map_location="cpu", weights_only=False)


def test_wmt16_ro_en_with_three_keys_trains_on_main_resolved_to_its_commit(
    hub, compose_train_cfg, tmp_path, caplog
):
    caplog.set_level(logging.INFO)
    overrides = ("data=hf", "data.path=wmt/wmt16", "data.config_name=ro-en", "data.tgt_lang=ro")
    cfg, ckpt = trained(compose_train_cfg, tmp_path, *overrides)
    commit = hub.commit_of("main", "wmt/wmt16")
    assert f"data.revision=main of wmt/wmt16 is commit {commit}" in caplog.text
    assert ckpt["config"]["data"]["revision"] == commit  # the checkpoint names the data it saw
    assert all(
        commit in r.path for r in hub.dataset_requests if "wmt16" in r.path and "/revision/" not in r.path
    )
    root = prepare_text(cfg.data, progress=False)
    assert read_text(root, "test", "en")[0] == "en " + read_text(root, "test", "ro")[0]  # ro-en's struct


def test_the_wmt16_preset_is_the_same_corpus_either_way_round(hub, compose_train_cfg, tmp_path):
    forward = prepare_text(compose_train_cfg("data=wmt16", f"data.cache_dir={tmp_path}").data, progress=False)
    back = compose_train_cfg(
        "data=wmt16", "data.src_lang=ro", "data.tgt_lang=en", f"data.cache_dir={tmp_path}"
    )
    assert back.data.config_name == "ro-en" and prepare_text(back.data, progress=False) == forward


def test_opus100_is_validated_and_tested_on_flores_with_a_token(
    hub, compose_train_cfg, tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_stand_in_token")
    cfg, ckpt = trained(compose_train_cfg, tmp_path, "data=opus100")
    root = prepare_text(cfg.data, progress=False)
    assert read_text(root, "valid", "de")[:2] == ["flores dev 0 de", "flores dev 1 de"]
    assert read_text(root, "valid", "en")[:2] == ["flores dev 0 en", "flores dev 1 en"]  # joined by id
    assert len(read_text(root, "test", "en")) == 18
    data = ckpt["config"]["data"]
    assert data["valid_revision"] == hub.commit_of("main", "openlanguagedata/flores_plus")
    assert "hf_secret_stand_in_token" not in caplog.text


def test_a_gated_dataset_without_a_token_says_how_to_log_in(hub, compose_train_cfg, tmp_path):
    from nmt.errors import NMTError

    data = compose_train_cfg("data=opus100", f"data.cache_dir={tmp_path}").data
    with pytest.raises(NMTError) as e:
        prepare_text(data, progress=False)
    message = str(e.value)
    assert "\n" not in message and "openlanguagedata/flores_plus is gated" in message
    assert "`hf auth login`" in message
    assert not (tmp_path / data.name).exists() or not list((tmp_path / data.name).glob("text-*"))


def test_opus_books_has_train_only_and_draws_valid_and_test_from_it(hub, compose_train_cfg, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    overrides = ("data=hf", "data.path=Helsinki-NLP/opus_books", "data.config_name=de-en",
                 "data.valid_split=null", "data.test_split=null",
                 "data.valid_size=20", "data.test_size=30")  # fmt: skip
    cfg, _ = trained(compose_train_cfg, tmp_path, *overrides)
    root = prepare_text(cfg.data, progress=False)
    valid, test, train_text = (set(read_text(root, s, "en")) for s in ("valid", "test", "train"))
    assert len(valid) == 20 and len(test) == 30 and len(train_text) == 100
    assert not (valid & test) and not (valid & train_text) and not (test & train_text)
    assert "valid: 20 pairs drawn from train (seed 1), kept out of training" in caplog.text
    again = prepare_text(cfg.data, progress=False)
    assert again == root  # seeded: the same draw is the same corpus


def test_a_flat_column_dataset_without_parquet_is_read_from_its_conversion(
    hub, compose_train_cfg, tmp_path, caplog
):
    caplog.set_level(logging.INFO)
    overrides = ("data=hf", "data.path=bentrevett/multi30k", "data.tgt_lang=de")
    cfg, ckpt = trained(compose_train_cfg, tmp_path, *overrides)
    converted = hub.repos["bentrevett/multi30k"].converted_commit
    assert "reading the hub's parquet conversion (refs/convert/parquet, commit " + converted in caplog.text
    assert ckpt["config"]["data"]["revision"] == converted
    root = prepare_text(cfg.data, progress=False)
    assert read_text(root, "test", "de")[0] == "de " + read_text(root, "test", "en")[0]


def test_iwslt2017_is_read_from_the_parquet_conversion(hub, compose_train_cfg, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    cfg, _ = trained(compose_train_cfg, tmp_path, "data=iwslt2017")
    assert "IWSLT/iwslt2017 (iwslt2017-de-en) has no parquet files at data.revision=main" in caplog.text
    paths = [r.path for r in hub.dataset_requests if r.path.endswith(".parquet")]
    assert paths and all("/iwslt2017-de-en/" in p for p in paths)


def test_the_test_report_names_the_dataset_and_commit(hub, compose_train_cfg, tmp_path):
    from nmt.data import describe_source
    from nmt.data.sources import pin_source

    data = pin_source(compose_train_cfg("data=wmt16").data)
    line = describe_source(data)
    assert f"test hf://datasets/wmt/wmt16@{hub.commit_of('main', 'wmt/wmt16')} (ro-en, test)" in line
    json.dumps(line)


@pytest.mark.parametrize(
    ("src", "tgt"), [("en", "fr"), ("cs", "en"), ("en", "ru"), ("hi", "en"), ("de", "en")]
)
def test_the_wmt14_preset_reads_each_pair_at_its_pinned_commit(hub, compose_train_cfg, tmp_path, src, tgt):
    from hub_standin import PINNED, Repo

    hub.repos["wmt/wmt14"] = Repo(wmt("14", ["cs-en", "de-en", "fr-en", "hi-en", "ru-en"]), (PINNED,), {})
    data = compose_train_cfg("data=wmt14", f"data.src_lang={src}", f"data.tgt_lang={tgt}",
                             f"data.cache_dir={tmp_path}").data  # fmt: skip
    other = tgt if src == "en" else src
    assert data.config_name == f"{other}-en" and data.revision == PINNED
    root = prepare_text(data, progress=False)
    assert read_text(root, "test", "en")[0] == "en " + read_text(root, "test", other)[0]
    assert all(PINNED in r.path for r in hub.dataset_requests)
