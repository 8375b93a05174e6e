"""Corpora prepared in chunks: the ids of the whole-corpus encoder, the same cache from one process or
several, compact ids, and faults (a killed preparation, a full disk, an unreadable file, an old cache)."""

import errno
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import nmt.data.corpus as corpus_module
import nmt.data.writers as writers_module
from nmt.cache import atomic_dir
from nmt.config import HFDataConfig, LocalDataConfig, TokenizerConfig, ToyDataConfig
from nmt.data import prepare_corpus, prepare_text, read_lines, read_text
from nmt.data.writers import CHUNK_PAIRS, NpyWriter
from nmt.errors import NMTError
from nmt.text.spm_workers import ids_dtype

REPO = Path(__file__).resolve().parents[1]
MULTI30K = REPO / "../shared/data/multi30k-de-en"
TOY = TokenizerConfig(vocab_size=150)


def ids_digest(data) -> str:
    """A digest of every split's ids as int32, sentence by sentence (what the former cache held)."""
    h = hashlib.sha256()
    for split in ("train", "valid", "test"):
        s = data.splits[split]
        for i in range(len(s)):
            h.update(np.asarray(s.src(i), dtype=np.int32).tobytes() + b"|")
            h.update(np.asarray(s.tgt(i), dtype=np.int32).tobytes() + b"#")
    return h.hexdigest()


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_chunks_give_the_ids_and_tokenizer_of_the_whole_corpus_encoder(tmp_path):
    """Digests of the pipeline that read, trained and encoded everything at once (int32 ids), on a toy
    corpus of three chunks: the streamed preparation gives the same subwords, ids and order."""
    cfg = ToyDataConfig(cache_dir=str(tmp_path), train_size=25_000)
    data = prepare_corpus(cfg, TOY, progress=False)
    assert len(data.splits["train"]) == 25_000 > 2 * CHUNK_PAIRS
    assert data.tokenizer.fingerprint == "bd0b48db8198"
    assert ids_digest(data) == "246e6ea120874ceb66ef6b4c27376565d1030502b24ca0daae697335485eb87f"
    src, tgt = data.raw("train")
    assert data.tokenizer.encode_src(src[:50]) == [data.splits["train"].src(i).tolist() for i in range(50)]
    assert tgt[-1] == read_text(data.root, "train", "tgt")[-1]


@pytest.mark.slow
@pytest.mark.skipif(not (MULTI30K / "train.en").is_file(), reason="../shared/data not available")
def test_multi30k_has_the_ids_of_the_whole_corpus_encoder(tmp_path):
    cfg = LocalDataConfig(dir=str(MULTI30K), name="m", cache_dir=str(tmp_path))
    data = prepare_corpus(cfg, TokenizerConfig(vocab_size=8000), progress=False)
    assert data.tokenizer.fingerprint == "555f8e7cbdeb"
    assert ids_digest(data) == "29718cfaee91171b871e52caffbcaf5b64e8abb1cb2a54d8f7d6d6b030cf2c77"


def test_one_process_and_two_make_the_same_cache(tmp_path):
    made = {}
    for workers in (1, 2):
        cfg = ToyDataConfig(cache_dir=str(tmp_path / str(workers)), train_size=25_000, workers=workers)
        data = prepare_corpus(cfg, TOY, progress=False)
        ids = data.root / f"ids-{data.tokenizer.fingerprint}"
        made[workers] = (data.root.name, folder_bytes(data.root / "."), folder_bytes(ids))
    one, two = made[1], made[2]
    assert one[0] == two[0]  # the same text key: workers is not a setting of the text
    assert {k: v for k, v in one[1].items() if k.endswith((".gz", ".src", ".tgt", ".json"))} == {
        k: v for k, v in two[1].items() if k.endswith((".gz", ".src", ".tgt", ".json"))
    }
    assert one[2] == two[2] and len(one[2]) == 12


def test_ids_are_as_compact_as_the_vocabulary_allows(tmp_path):
    assert ids_dtype(150) == ids_dtype(65_536) == np.uint16 and ids_dtype(65_537) == np.uint32
    data = prepare_corpus(ToyDataConfig(cache_dir=str(tmp_path)), TOY, progress=False)
    ids = data.root / f"ids-{data.tokenizer.fingerprint}"
    assert np.load(ids / "train.src.ids.npy", mmap_mode="r").dtype == np.uint16
    assert np.load(ids / "train.src.offsets.npy", mmap_mode="r").dtype == np.int64
    big = np.array([0, 70_000, 2**32 - 1], dtype=np.uint32)
    writer = NpyWriter(tmp_path / "big.npy", np.uint32)
    writer.add(big[:1])
    writer.add(big[1:])
    writer.close()
    assert np.array_equal(np.load(tmp_path / "big.npy", mmap_mode="r"), big)


def test_an_interrupted_encoding_leaves_nothing_that_looks_complete_and_a_rerun_finishes(
    tmp_path, monkeypatch
):
    cfg = ToyDataConfig(cache_dir=str(tmp_path), train_size=25_000, workers=1)
    calls = []

    def interrupted(task):
        calls.append(task)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return encode(task)

    encode = corpus_module.encode_chunk
    monkeypatch.setattr(corpus_module, "encode_chunk", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare_corpus(cfg, TOY, progress=False)
    (root,) = (tmp_path / "toy").glob("text-*")
    assert not list(root.glob("ids-*")) and not list(root.glob(".ids-*"))
    monkeypatch.undo()
    data = prepare_corpus(cfg, TOY, progress=False)
    assert ids_digest(data) == "246e6ea120874ceb66ef6b4c27376565d1030502b24ca0daae697335485eb87f"


@pytest.mark.slow
def test_a_preparation_killed_at_any_moment_is_finished_by_the_next_run(tmp_path):
    """SIGKILL (no clean-up runs) at several moments of a real prepare_data.py; the next run finishes,
    and what a killed process left is removed then."""
    lines = {
        lang: [f"{lang} {i} " + " ".join(f"w{(i * j) % 997}" for j in range(12)) for i in range(60_100)]
        for lang in ("en", "de")
    }
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split, (start, end) in (
        ("train", (0, 60_000)),
        ("valid", (60_000, 60_050)),
        ("test", (60_050, 60_100)),
    ):
        for lang in ("en", "de"):
            (corpus / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines[lang][start:end]))
    command = [
        sys.executable, str(REPO / "scripts/prepare_data.py"), "data=local", f"data.dir={corpus}",
        f"data.cache_dir={tmp_path / 'cache'}", "tokenizer.vocab_size=500", "data.workers=2",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]  # fmt: skip
    for delay in (4.0, 7.0):
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        time.sleep(delay)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        for folder in (tmp_path / "cache" / "corpus").rglob("*"):
            if folder.is_dir() and not folder.name.startswith("."):  # a complete folder is whole
                if folder.name.startswith("text-"):
                    assert (folder / "meta.json").is_file() and (folder / "test.en").is_file()
                if folder.name.startswith("ids-"):
                    assert len(list(folder.iterdir())) == 12
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "60,000" in result.stdout
    leftovers = [p for p in (tmp_path / "cache").rglob(".*tmp-*")]
    assert leftovers == []


def test_a_full_disk_is_one_line_naming_the_file_and_keeps_nothing(tmp_path, monkeypatch):
    real_open = writers_module._open_for_writing

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def close(self):
            self.f.close()

    monkeypatch.setattr(writers_module, "_open_for_writing", lambda path: Full(real_open(path)))
    with pytest.raises(NMTError) as e:
        prepare_text(ToyDataConfig(cache_dir=str(tmp_path)), progress=False)
    message = str(e.value)
    assert "\n" not in message and "No space left on device" in message
    assert (
        message.startswith(str(tmp_path / "toy")) and "valid.src: cannot write it" in message
    )  # written first
    assert list((tmp_path / "toy").iterdir()) == []


def test_an_unreadable_input_file_is_named(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            (corpus / f"{split}.{lang}").write_text("a b\n")
    (corpus / "train.de").unlink()
    (corpus / "train.de").mkdir()  # exists, cannot be read as a file (root ignores permission bits)
    with pytest.raises(NMTError, match=rf"^{corpus / 'train.de'}: cannot read it \(Is a directory\)$"):
        prepare_text(
            LocalDataConfig(dir=str(corpus), name="c", cache_dir=str(tmp_path / "cache")), progress=False
        )


def test_a_cache_of_the_former_layout_is_rebuilt_after_one_line_saying_why(tmp_path, caplog):
    cfg = ToyDataConfig(cache_dir=str(tmp_path))
    older = tmp_path / "toy" / f"text-{corpus_module.hash_key(corpus_module._text_settings(cfg, version=2))}"
    older.mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        root = prepare_text(cfg, progress=False)
    assert root != older and (root / "train.src.gz").is_file()
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert line.startswith(f"{older} was prepared by an older version (plain training text, int32 ids)")


def test_abandoned_temporary_folders_are_removed(tmp_path):
    target = tmp_path / "ids-x"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket

    stale = tmp_path / f".ids-x.tmp-{socket.gethostname()}-{dead.pid}"
    other_host = tmp_path / f".ids-x.tmp-elsewhere.example-{dead.pid}"
    live = tmp_path / f".ids-x.tmp-{socket.gethostname()}-{os.getppid()}"
    for folder in (stale, other_host, live):
        folder.mkdir()
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("x")
    assert not stale.exists() and other_host.exists() and live.exists() and (target / "a").is_file()


def test_the_hub_path_draws_and_cleans_a_large_split_a_row_group_at_a_time(tmp_path, monkeypatch):
    """300k rows of local parquet, 200k drawn: Python holds a row group's pairs at a time, not the split."""
    datasets = pytest.importorskip("datasets")
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    n = 300_000
    de = pa.array([f"wort{i % 5000} " * 6 + str(i) for i in range(n)])
    en = pa.array([f"word{i % 5000} " * 6 + str(i) for i in range(n)])
    table = pa.table({"translation": pa.StructArray.from_arrays([de, en], names=["de", "en"])})
    del de, en
    pq.write_table(table, tmp_path / "train-00000-of-00001.parquet", row_group_size=10_000)
    for split in ("validation", "test"):
        pq.write_table(table.slice(0, 10), tmp_path / f"{split}-00000-of-00001.parquet")
    del table
    cfg = HFDataConfig(
        path="parquet",
        data_files=str(tmp_path / "{split}-*.parquet"),
        train_size=200_000,
        cache_dir=str(tmp_path / "cache"),
    )
    tracemalloc.start()
    root = prepare_text(cfg, progress=False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert sum(1 for _ in read_text(root, "train", "en")) == 200_000
    assert len(read_lines(root / "valid.de")) == 10
    assert peak < 25e6, f"{peak / 1e6:.0f} MB of Python objects for 200k pairs of ~60 characters a side"


# A preparation whose encoder workers die while they start (as the OOM killer may have it), with
# SentencePiece models far over a pipe's 64 kB: the parent must not wait for ever to hand them over.
DYING_WORKERS = """
import os, signal, sys
if __name__ == "__mp_main__":  # a spawned worker, importing this script
    os.kill(os.getpid(), signal.SIGKILL)
from pathlib import Path
import nmt.data.corpus as corpus
import nmt.data.writers as writers
from nmt.config import TokenizerConfig, ToyDataConfig
from nmt.errors import NMTError
from nmt.text.tokenizer import Tokenizer

folder = Path(sys.argv[1])
writers.CHUNK_PAIRS = 100  # a few chunks: the workers are used
proto = (folder / "big.model").read_bytes()
corpus.train_tokenizer = lambda *args: Tokenizer(proto)  # no trainer process (it would die too)
try:
    corpus.prepare_corpus(ToyDataConfig(cache_dir=str(folder / "data"), train_size=400, workers=2),
                          TokenizerConfig(), progress=False)
except NMTError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
"""


def big_model(tmp_path: Path) -> bytes:
    """A toy SentencePiece model grown past 64 kB with pieces the toy text never uses."""
    from sentencepiece import sentencepiece_model_pb2

    tokenizer = prepare_corpus(ToyDataConfig(cache_dir=str(tmp_path), train_size=300), TOY, False).tokenizer
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(tokenizer.protos[0])
    for i in range(8000):
        piece = model.pieces.add()
        piece.piece, piece.score = f"\u2581unused{i}", -1000.0 - i
    return model.SerializeToString()


def test_a_worker_that_dies_starting_is_one_line_naming_the_stage_and_data_workers(tmp_path):
    proto = big_model(tmp_path / "tok")
    assert len(proto) > 4 * (64 << 10)
    (tmp_path / "big.model").write_bytes(proto)
    (tmp_path / "prepare.py").write_text(DYING_WORKERS)  # a file: spawned workers import it as __mp_main__
    result = subprocess.run(
        [sys.executable, str(tmp_path / "prepare.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=60, start_new_session=True,
    )  # fmt: skip
    assert result.returncode == 1 and result.stderr.splitlines() == [
        "error: encoding train: a worker process died (killed, most likely for memory); nothing was cached: "
        "set data.workers lower than 2 (each holds a chunk and the SentencePiece models) or free memory, "
        "then run again"
    ]
    (root,) = (tmp_path / "data" / "toy").glob("text-*")
    assert not [p for p in root.iterdir() if "ids-" in p.name]


@pytest.mark.parametrize("damage", ["ids cut short", "ids shorter than the offsets", "a sentence fewer"])
def test_damaged_prepared_ids_are_one_line_naming_the_folder_to_delete(tmp_path, damage):
    cfg = ToyDataConfig(cache_dir=str(tmp_path), train_size=300, workers=1)
    (ids_dir,) = prepare_corpus(cfg, TOY, progress=False).root.glob("ids-*")
    ids, offsets = ids_dir / "train.src.ids.npy", ids_dir / "train.src.offsets.npy"
    if damage == "ids cut short":
        os.truncate(ids, ids.stat().st_size - 10)
        why = "train.src.ids.npy: mmap length is greater than file size"
    elif damage == "ids shorter than the offsets":
        end = int(np.load(offsets)[-1])
        np.save(ids, np.load(ids)[:-1])
        why = f"train.src: offsets end at {end}, the ids hold {end - 1}"
    else:
        np.save(offsets, np.load(offsets)[:-1])
        np.save(ids, np.load(ids)[: int(np.load(offsets)[-1])])
        why = "train.src: 299 sentences, meta.json counts 300"
    with pytest.raises(NMTError) as e:
        prepare_corpus(cfg, TOY, progress=False)
    assert str(e.value) == (
        f"{ids_dir}: prepared data damaged ({why}), as an interrupted copy or a full disk leaves it; "
        "delete this folder and run again to prepare it anew"
    )
    shutil.rmtree(ids_dir)
    assert len(prepare_corpus(cfg, TOY, progress=False).splits["train"]) == 300
