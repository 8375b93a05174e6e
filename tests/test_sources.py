"""Raw text sources: local files (and every way they can be wrong), datasets on local parquet, toy."""

import hashlib
from pathlib import Path

import pytest

from nmt.config import HFDataConfig, LocalDataConfig, ToyDataConfig
from nmt.data.sources import load_source, make_toy
from nmt.errors import NMTError

CORPUS = {
    "train": (["a house", "the cat", "one two three"], ["ein Haus", "die Katze", "eins zwei drei"]),
    "valid": (["good day"], ["guten Tag"]),
    "test": (["thanks", "bye"], ["danke", "tschüss"]),
    "extra": (["more text"], ["mehr Text"]),
}


def write_corpus(folder: Path, corpus: dict = CORPUS) -> Path:
    for prefix, (en, de) in corpus.items():
        (folder / f"{prefix}.en").write_text("".join(line + "\n" for line in en), encoding="utf-8")
        (folder / f"{prefix}.de").write_text("".join(line + "\n" for line in de), encoding="utf-8")
    return folder


def local_cfg(folder: Path, **kwargs) -> LocalDataConfig:
    return LocalDataConfig(dir=str(folder), name="tiny", **kwargs)


def test_local_reads_every_split_and_appends_extra_train(tmp_path):
    corpus = load_source(local_cfg(write_corpus(tmp_path), extra_train=["extra"]))
    assert corpus["train"]["en"] == ["a house", "the cat", "one two three", "more text"]
    assert corpus["train"]["de"] == ["ein Haus", "die Katze", "eins zwei drei", "mehr Text"]
    assert corpus["valid"] == {"en": ["good day"], "de": ["guten Tag"]}
    assert corpus["test"]["de"] == ["danke", "tschüss"]


def test_missing_files_are_named_in_one_line_that_says_what_to_do(tmp_path):
    write_corpus(tmp_path)
    (tmp_path / "valid.de").unlink()
    cfg = local_cfg(tmp_path, extra_train=["nope"])
    cfg.origin = "the folder scripts/distill.py prints"
    with pytest.raises(NMTError) as e:
        load_source(cfg)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"data.dir={tmp_path}: 3 of 8 files missing (nope.en, nope.de, valid.de); ")
    assert "train.en, train.de, nope.en, nope.de, valid.en, valid.de, test.en, test.de" in message
    assert "these files are the folder scripts/distill.py prints" in message
    assert "point data.dir=... at a folder that holds them" in message
    with pytest.raises(NMTError, match=r"^data.dir=/no/such/corpus: no such folder; data=local reads"):
        load_source(local_cfg(Path("/no/such/corpus")))


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    write_corpus(tmp_path)
    (tmp_path / "test.de").write_text("danke\ntschüss\nextra\n", encoding="utf-8")
    with pytest.raises(NMTError) as e:
        load_source(local_cfg(tmp_path))
    message = str(e.value)
    assert str(tmp_path / "test.en") in message and str(tmp_path / "test.de") in message
    assert "2 lines" in message and "has 3" in message


def test_invalid_utf8_names_file_and_line(tmp_path):
    write_corpus(tmp_path)
    (tmp_path / "train.de").write_bytes(b"ein Haus\ndie Katze \xff\neins zwei drei\n")
    with pytest.raises(NMTError, match=rf"{tmp_path / 'train.de'}:2: invalid UTF-8"):
        load_source(local_cfg(tmp_path))


def test_u0085_inside_a_line_keeps_sides_aligned(tmp_path):
    write_corpus(tmp_path)
    (tmp_path / "train.de").write_text(
        "ein Haus\u0085 oder so\ndie Katze\neins zwei drei\n", encoding="utf-8"
    )
    corpus = load_source(local_cfg(tmp_path))
    assert corpus["train"]["de"] == ["ein Haus\u0085 oder so", "die Katze", "eins zwei drei"]
    assert len(corpus["train"]["en"]) == 3


def test_crlf_and_missing_final_newline(tmp_path):
    write_corpus(tmp_path)
    (tmp_path / "valid.en").write_bytes(b"good day\r")
    assert load_source(local_cfg(tmp_path))["valid"]["en"] == ["good day"]


# ------------------------------------------------------------------------------------- datasets


@pytest.fixture
def parquet_dataset(tmp_path, monkeypatch) -> Path:
    """train/validation/test parquet files with the WMT ``translation`` column; HF cache in tmp."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    splits = {"train": 10, "validation": 2, "test": 3}
    for split, n in splits.items():
        rows = [{"de": f"{split} satz {i}", "en": f"{split} sentence {i}"} for i in range(n)]
        datasets.Dataset.from_dict({"translation": rows}).to_parquet(tmp_path / f"{split}.parquet")
    return tmp_path


def test_hf_source_on_local_parquet_draws_train_size_pairs(parquet_dataset):
    cfg = HFDataConfig(path="parquet", data_files=str(parquet_dataset / "{split}.parquet"), train_size=4)
    corpus = load_source(cfg)
    assert len(corpus["train"]["en"]) == 4 and len(set(corpus["train"]["en"])) == 4
    for en, de in zip(corpus["train"]["en"], corpus["train"]["de"]):  # still pairs
        assert en.replace("sentence", "satz") == de
    assert corpus["valid"]["de"] == ["validation satz 0", "validation satz 1"]
    assert corpus["test"]["en"] == [f"test sentence {i}" for i in range(3)]


# Laid out like the hub's wmt/wmt14 de-en training split: shards written corpus after corpus.
WMT_SHARDS = {"europarl": 1200, "commoncrawl": 1500, "newscommentary": 300}
ROW_GROUP = 50


@pytest.fixture
def wmt_like(tmp_path, monkeypatch) -> Path:
    """Three training shards (one corpus each, in row groups of 50), plus validation and test."""
    datasets = pytest.importorskip("datasets")
    pq = pytest.importorskip("pyarrow.parquet")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    for i, (corpus, n) in enumerate(WMT_SHARDS.items()):
        rows = [{"de": f"{corpus} satz {j}", "en": f"{corpus} sentence {j}"} for j in range(n)]
        table = datasets.Dataset.from_dict({"translation": rows}).data.table
        pq.write_table(table, tmp_path / f"train-{i:05d}-of-00003.parquet", row_group_size=ROW_GROUP)
    for split in ("validation", "test"):
        rows = [{"de": f"{split} satz", "en": f"{split} sentence"}]
        datasets.Dataset.from_dict({"translation": rows}).to_parquet(
            tmp_path / f"{split}-00000-of-00001.parquet"
        )
    return tmp_path


def wmt_subset(folder: Path, size: int, seed: int = 1) -> list[str]:
    cfg = HFDataConfig(
        path="parquet", data_files=str(folder / "{split}-*.parquet"), train_size=size, seed=seed
    )
    return load_source(cfg)["train"]["en"]


def test_wmt_subset_draws_from_every_corpus_in_proportion(wmt_like):
    subset = wmt_subset(wmt_like, 300)
    counts = {corpus: sum(s.startswith(corpus) for s in subset) for corpus in WMT_SHARDS}
    assert counts == {"europarl": 120, "commoncrawl": 150, "newscommentary": 30}  # 300 * size / 3000
    assert len(set(subset)) == 300
    europarl = sorted(int(s.split()[-1]) for s in subset if s.startswith("europarl"))
    assert europarl[-1] >= 100  # not just the first rows of the shard


def test_wmt_subset_is_fixed_by_the_seed(wmt_like):
    assert wmt_subset(wmt_like, 200, seed=1) == wmt_subset(wmt_like, 200, seed=1)
    assert set(wmt_subset(wmt_like, 200, seed=1)) != set(wmt_subset(wmt_like, 200, seed=2))


def test_wmt_subset_reads_only_the_row_groups_it_needs_one_at_a_time(wmt_like, monkeypatch):
    """Memory stays near one row group, and traffic (from the hub: download) near train_size rows: one
    row group more per shard at most."""
    import pyarrow.parquet as pq

    read = []
    original = pq.ParquetFile.read_row_group

    def counting(self, i, *args, **kwargs):
        table = original(self, i, *args, **kwargs)
        read.append(table.num_rows)
        return table

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counting)
    wmt_subset(wmt_like, 300)
    train = read[:-2]  # then validation and test, a row each
    assert read[-2:] == [1, 1] and set(train) == {ROW_GROUP} and sum(train) <= 300 + 3 * ROW_GROUP


@pytest.mark.parametrize(
    ("size", "seed", "digest"),
    [
        (300, 1, "a219ef900e11512fe43c7fe153eb35347fd0ae28178f471877541804afc83117"),
        (1234, 7, "45620ee3b7a044b4d5d73831a744243ab18751df64ed882df72d3e214c39b522"),
    ],
)
def test_wmt_subset_draws_the_rows_it_drew_when_it_read_them_all_at_once(wmt_like, size, seed, digest):
    """The same pairs in the same order as the reader that took every chosen row group at once (these
    digests are its output), so a corpus prepared before keeps its meaning."""
    subset = wmt_subset(wmt_like, size, seed)
    assert hashlib.sha256("\n".join(subset).encode()).hexdigest() == digest


def test_wmt_subset_larger_than_the_corpus_is_all_of_it(wmt_like):
    subset = wmt_subset(wmt_like, 10**6)
    assert len(subset) == len(set(subset)) == sum(WMT_SHARDS.values())


def test_hf_missing_language_is_explained(parquet_dataset):
    cfg = HFDataConfig(path="parquet", data_files=str(parquet_dataset / "{split}.parquet"), tgt_lang="fr")
    with pytest.raises(
        NMTError,
        match="train.parquet: language 'fr' is not in the pair: its translation column holds de, en; ",
    ):
        load_source(cfg)


@pytest.fixture
def flat_dataset(tmp_path) -> Path:
    """Parquet files of two flat text columns, ``en`` and ``de``, plus an ``id``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for split, n in {"train": 6, "validation": 2, "test": 2}.items():
        table = pa.table({"id": list(range(n)), "en": [f"{split} {i}" for i in range(n)],
                          "de": [f"{split} de {i}" for i in range(n)]})  # fmt: skip
        pq.write_table(table, tmp_path / f"{split}.parquet")
    return tmp_path


def test_two_flat_columns_named_by_the_languages_or_by_the_column_keys(flat_dataset):
    files = str(flat_dataset / "{split}.parquet")
    corpus = load_source(HFDataConfig(path="parquet", data_files=files, src_lang="de", tgt_lang="en"))
    assert corpus["test"] == {"de": ["test de 0", "test de 1"], "en": ["test 0", "test 1"]}
    renamed = HFDataConfig(path="parquet", data_files=files, src_lang="xx", src_column="de", tgt_column="en")
    assert load_source(renamed)["valid"]["xx"] == ["validation de 0", "validation de 1"]


def test_a_missing_column_is_refused_listing_the_splits_columns(flat_dataset):
    cfg = HFDataConfig(path="parquet", data_files=str(flat_dataset / "{split}.parquet"), tgt_lang="fr")
    with pytest.raises(NMTError) as e:
        load_source(cfg)
    assert "train.parquet has no column 'fr': its columns are id, en, de; set data.tgt_column" in str(e.value)


def test_hf_missing_files_suggest_checking_them(tmp_path):
    pytest.importorskip("datasets")
    cfg = HFDataConfig(path="parquet", data_files=str(tmp_path / "none-{split}.parquet"))
    with pytest.raises(NMTError, match="could not load .*none-train.parquet.*check data.data_files"):
        load_source(cfg)


# ------------------------------------------------------------------------------------------ toy


def test_toy_is_deterministic_per_seed():
    cfg = ToyDataConfig(train_size=50, valid_size=5, test_size=5)
    assert make_toy(cfg) == make_toy(cfg)
    assert make_toy(cfg)["train"] != make_toy(ToyDataConfig(train_size=50, seed=7))["train"]


def test_toy_target_is_lexicon_mapping_with_swapped_pairs():
    cfg = ToyDataConfig(train_size=300, valid_size=5, test_size=5, min_len=2, max_len=7)
    corpus = make_toy(cfg)
    lexicon: dict[str, str] = {}
    for src, tgt in zip(corpus["train"]["src"], corpus["train"]["tgt"], strict=True):
        s, t = src.split(), tgt.split()
        assert cfg.min_len <= len(s) <= cfg.max_len and len(t) == len(s)
        unswapped = [t[i ^ 1] if (i ^ 1) < len(t) else t[i] for i in range(len(t))]
        for word, translation in zip(s, unswapped, strict=True):
            assert lexicon.setdefault(word, translation) == translation
    assert len(lexicon) == cfg.vocab_words
    assert not set(lexicon) & set(lexicon.values())


def test_toy_rejects_a_pair_without_src():
    with pytest.raises(NMTError, match=r"data=toy has the language src and one other .* got 'en' and 'tgt'"):
        make_toy(ToyDataConfig(src_lang="en"))


def test_toy_languages_of_other_names_share_the_sources_with_lexicons_of_their_own():
    """The toy languages of a multi-way corpus (data=toy_multi): tgt's task unchanged, de's words apart."""
    tgt, de = make_toy(ToyDataConfig()), make_toy(ToyDataConfig(tgt_lang="de"))
    assert de["valid"]["src"] == tgt["valid"]["src"]
    assert not set(" ".join(de["valid"]["de"]).split()) & set(" ".join(tgt["valid"]["tgt"]).split())
    assert make_toy(ToyDataConfig(src_lang="de", tgt_lang="src"))["train"]["de"] == de["train"]["de"]


def test_every_source_module_is_in_the_registry_with_its_schema_and_corpus_names_none():
    """A new source is one module and one registry line: the modules of nmt/data/sources (but the
    shared one) are the registry's, each with the interface the pipeline calls, its schema the one
    data.source chooses; the pipeline names no source kind."""
    import inspect
    import pkgutil

    import nmt.data.corpus
    from nmt.config import DATA_SCHEMAS
    from nmt.data import sources

    modules = {m.name for m in pkgutil.iter_modules(sources.__path__)} - {"shapes"}
    assert modules == {m.__name__.rsplit(".", 1)[1] for m in sources.SOURCES.values()}
    for kind, module in sources.SOURCES.items():
        interface = ("read", "resolve", "cache_key", "pin", "describe")
        assert all(callable(getattr(module, name)) for name in interface), kind
        rule = module.REMOVE_HELD_OUT  # a constant, or per config (several corpora: any of theirs)
        assert isinstance(rule, bool) or callable(rule), kind
        assert module.SCHEMA is DATA_SCHEMAS[kind] and module.SCHEMA.source == kind
    assert "source ==" not in inspect.getsource(nmt.data.corpus)
    assert "source !=" not in inspect.getsource(nmt.data.corpus)
