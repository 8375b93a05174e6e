"""Several corpora in one prepared corpus (data.source=multi): their checks, the held-out pairs kept
out of every direction's training, the tags, and the temperature draw of the training sampler."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from nmt.config import TokenizerConfig, check_train_config, directions_of
from nmt.data import prepare_text
from nmt.data.batching import TokenBatchSampler
from nmt.data.multilingual import TemperatureBatchSampler, epoch_counts, temperature_shares
from nmt.errors import NMTError
from nmt.text.tags import choose_target, tagged, untagged

TOY = ["data=toy_multi", "data.cache_dir=unused"]


# ------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize("value", ["0", "-1.5"])
def test_temperature_must_be_positive(compose_train_cfg, value):
    cfg = compose_train_cfg(*TOY, f"data.temperature={value}")
    with pytest.raises(NMTError, match=rf"^data\.temperature={float(value)}: must be > 0$"):
        check_train_config(cfg)


def test_a_direction_given_twice_is_refused(compose_train_cfg):
    three = ",".join(f"{{source: toy, src_lang: src, tgt_lang: {lang}}}" for lang in ("de", "fr", "cs", "fr"))
    cfg = compose_train_cfg(*TOY, f"data.corpora=[{three}]")
    with pytest.raises(
        NMTError, match=r"^data\.corpora\[3\]: the direction src->fr repeats data\.corpora\[1\]'s"
    ):
        check_train_config(cfg)


def test_corpora_with_other_tokenizer_settings_are_refused(compose_train_cfg):
    cfg = compose_train_cfg(*TOY, "+data.corpora.0.tokenizer={vocab_size: 300}")
    with pytest.raises(
        NMTError, match=r"^data\.corpora\[0\]\.tokenizer\.vocab_size=300 differs from tokenizer"
    ):
        check_train_config(cfg)
    cfg = compose_train_cfg(
        *TOY, "+data.corpora.0.tokenizer={vocab_size: 300}", "+data.corpora.2.tokenizer={vocab_size: 400}"
    )
    with pytest.raises(NMTError, match=r"^data\.corpora\[2\]\.tokenizer=\{'vocab_size': 400\} differs from"):
        check_train_config(cfg)


def test_a_corpus_of_an_unknown_source_is_refused(compose_train_cfg):
    cfg = compose_train_cfg(*TOY, "data.corpora.1.source=hub")
    with pytest.raises(
        NMTError, match=r"^data\.corpora\[1\]\.source=hub: must be one of hf, local, multi30k, toy$"
    ):
        check_train_config(cfg)


# ------------------------------------------------------------------------------------------- text


def _write(folder: Path, split: str, pairs: dict[str, list[str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for lang, lines in pairs.items():
        (folder / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines))


def test_held_out_sentences_leave_every_direction_and_tags_follow_cleaning(
    compose_train_cfg, tmp_path, caplog
):
    """en->fr's training has en->de's test sentence: it is dropped, and counted, though no en->fr valid
    or test pair has it; the tag is put on after cleaning, so it counts in no length filter."""
    de, fr = tmp_path / "de", tmp_path / "fr"
    _write(de, "train", {"en": ["a dog runs", "one two"], "de": ["ein hund rennt", "eins zwei"]})
    _write(de, "valid", {"en": ["the sun"], "de": ["die sonne"]})
    _write(de, "test", {"en": ["a cat sits"], "de": ["eine katze sitzt"]})
    _write(fr, "train", {"en": ["a cat sits", "a bird", "x"], "fr": ["un chat", "un oiseau", "y z w v"]})
    _write(fr, "valid", {"en": ["the moon"], "fr": ["la lune"]})
    _write(fr, "test", {"en": ["the sea"], "fr": ["la mer"]})
    corpora = ",".join(f"{{source: local, dir: '{d}', src_lang: en, tgt_lang: {d.name}}}" for d in (de, fr))
    cfg = compose_train_cfg(
        "data=toy_multi", f"data.cache_dir={tmp_path / 'cache'}", f"data.corpora=[{corpora}]"
    )
    check_train_config(cfg)
    caplog.set_level(logging.INFO)
    root = prepare_text(cfg.data, progress=False)
    meta = json.loads((root / "meta.json").read_text())
    assert meta["directions"] == [["en", "de"], ["en", "fr"]]
    assert meta["group_pairs"] == {"train": [2, 1], "valid": [1, 1], "test": [1, 1]}
    assert meta["dropped"]["train"]["in_valid_test"] == 1 and meta["dropped"]["train"]["ratio"] == 1
    assert "in_valid_test 1" in caplog.text
    assert (root / "valid.src").read_text() == ">>de<< the sun\n>>fr<< the moon\n"
    assert (root / "test.tgt").read_text() == "eine katze sitzt\nla mer\n"


def test_tags():
    assert tagged("de", ["a b"]) == [">>de<< a b"] and untagged(">>de<< a b") == "a b"
    assert untagged("a >>de<< b") == "a >>de<< b"
    directions = [("en", "de"), ("en", "fr")]
    assert choose_target(directions, "DEU") == "de" and choose_target([("en", "de")], None) == "de"


# ----------------------------------------------------------------------------------------- sampling


def test_temperature_shares():
    assert temperature_shares([100, 300], 1.0) == pytest.approx([0.25, 0.75])
    assert temperature_shares([100, 10000], 2.0) == pytest.approx([10 / 110, 100 / 110])
    assert temperature_shares([100, 10000], 1e9) == pytest.approx([0.5, 0.5])
    assert list(epoch_counts([100, 10000], 2.0)) == [918, 9182]


def _lengths(n: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, 40, n), rng.integers(1, 40, n)


def test_the_bilingual_sampler_draws_as_before():
    """The batches of a seed are those of the sampler before corpora could be mixed (their digest)."""
    sampler = TokenBatchSampler(*_lengths(300), 400, seed=3)
    batches = [b for _ in range(2) for b in sampler]
    assert (len(batches), hashlib.sha1(repr(batches).encode()).hexdigest()[:16]) == (92, "c86c8e9f43fc4b97")


def test_the_temperature_sampler_upsamples_the_small_corpus_reproducibly_and_resumes():
    sizes, lengths = [20, 280], _lengths(300)

    def sampler() -> TemperatureBatchSampler:
        return TemperatureBatchSampler(*lengths, 400, seed=5, sizes=sizes, temperature=5.0)

    epoch = [i for batch in sampler() for i in batch]
    counts = np.bincount(np.asarray(epoch) >= 20, minlength=2)
    assert list(counts) == list(epoch_counts(sizes, 5.0)) and counts[0] > 20  # every small pair, and more
    assert set(range(20)) <= set(epoch)
    interrupted = sampler()
    first = next(iter(interrupted))
    resumed = sampler()
    resumed.load_state_dict(interrupted.state_dict())
    assert [first, *resumed] == list(sampler())
    other = sampler()
    other.set_epoch(1)
    assert [i for b in other for i in b] != epoch  # another draw each epoch


def test_tokenizer_settings_are_unchanged_without_tags(tmp_path):
    """A bilingual corpus trains the tokenizer it did before tags existed (same settings, same cache)."""
    from nmt.text.tokenizer import train_tokenizer

    text = tmp_path / "train.txt"
    text.write_text("".join(f"w{i % 50} w{i % 7} w{i % 11}\n" for i in range(500)))
    cfg = TokenizerConfig(vocab_size=50)
    plain = train_tokenizer(cfg, text, text, tmp_path)
    assert "user_defined_symbols" not in json.loads(
        next(tmp_path.glob("tokenizer-*/config.json")).read_text()
    )
    tagged_tok = train_tokenizer(cfg, text, text, tmp_path, user_symbols=(">>de<<",))
    first, inside = (
        tagged_tok.src_pieces(ids) for ids in tagged_tok.encode_src([">>de<< w1", "w1 >>de<< w1"])
    )
    assert first[0] == ">>de<<" and first[1].startswith("\u2581")  # a leading tag first, as Marian's
    assert inside[inside.index(">>de<<") - 1] == "\u2581"  # elsewhere, as SentencePiece segments it
    assert plain.fingerprint != tagged_tok.fingerprint


@pytest.mark.parametrize(
    ("preset", "directions"),
    [
        ("multi30k_multi_cpu", ["en-de", "en-fr", "en-cs"]),
        ("multi30k_many_cpu", ["en-de", "en-fr", "en-cs", "de-en", "fr-en", "cs-en"]),
    ],
)
def test_the_multilingual_presets_compose_and_pass_the_checks(compose_train_cfg, preset, directions):
    cfg = compose_train_cfg(f"experiment={preset}")
    check_train_config(cfg)
    assert ["-".join(d) for d in directions_of(cfg.data)] == directions
    assert cfg.data.temperature == 5.0 and cfg.trainer.max_minutes == 60


def test_the_summary_counts_each_directions_pairs(compose_train_cfg, tmp_path):
    from nmt.data import format_summary, prepare_corpus

    cfg = compose_train_cfg(
        "data=toy_multi", f"data.cache_dir={tmp_path}", "tokenizer.vocab_size=300", "data.workers=1"
    )
    cfg.data.corpora = [{**c, "train_size": 300, "valid_size": 20, "test_size": 10} for c in cfg.data.corpora]
    data = prepare_corpus(cfg.data, cfg.tokenizer, progress=False)
    assert data.summary["directions"]["src-fr"] == {"train": 300, "valid": 20, "test": 10}
    assert "  src->cs      train 300, valid 20, test 10" in format_summary(data.summary).splitlines()
    assert data.group_ranges("test") == [range(0, 10), range(10, 20), range(20, 30)]
