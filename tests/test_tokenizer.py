"""SentencePiece: fixed special ids, lossless round trips, training cached by config and data."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from itertools import product
from pathlib import Path

import pytest
import sentencepiece as spm

import nmt.text.tokenizer as tokenizer_module
from nmt.config import TokenizerConfig
from nmt.errors import NMTError
from nmt.text.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt.text.tokenizer import Tokenizer, train_tokenizer

EN_WORDS = (("cat", "dog", "bird", "horse"), ("a tree", "it", "us", "the sea"), ("old", "red", "big", "new"))
DE_WORDS = (
    ("Katze", "Hund", "Vogel", "Pferd"),
    ("einen Baum", "es", "uns", "das Meer"),
    ("alten", "roten", "großen", "neuen"),
)
EN = [f"the {a} sees {b} near the {c} house" for a, b, c in product(*EN_WORDS)]
DE = [f"die {a} sieht {b} am {c} Haus" for a, b, c in product(*DE_WORDS)]
CFG = TokenizerConfig(vocab_size=60, seed=1)


@pytest.fixture
def texts(tmp_path) -> tuple[Path, Path]:
    (tmp_path / "train.en").write_text("\n".join(EN) + "\n", encoding="utf-8")
    (tmp_path / "train.de").write_text("\n".join(DE) + "\n", encoding="utf-8")
    return tmp_path / "train.en", tmp_path / "train.de"


def test_special_ids_are_fixed(texts, tmp_path):
    tok = train_tokenizer(CFG, *texts, tmp_path)
    sp = spm.SentencePieceProcessor(model_proto=tok.protos[0])
    ids = [sp.piece_to_id(p) for p in ("<pad>", "<unk>", "<s>", "</s>")]
    assert ids == [PAD_ID, UNK_ID, BOS_ID, EOS_ID] == [0, 1, 2, 3]
    assert tok.src_pieces([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]


@pytest.mark.parametrize(("model_type", "vocab_size"), [("bpe", 60), ("unigram", 40)])
def test_round_trip(texts, tmp_path, model_type, vocab_size):
    tok = train_tokenizer(replace(CFG, model_type=model_type, vocab_size=vocab_size), *texts, tmp_path)
    assert tok.joint and tok.src_vocab_size == tok.tgt_vocab_size == vocab_size
    ids = tok.encode_src(EN)
    assert all(BOS_ID not in seq and EOS_ID not in seq for seq in ids)
    assert tok.decode_src(ids) == EN
    assert tok.decode_tgt(tok.encode_tgt(DE)) == DE


def test_decode_tgt_skips_pad_and_bos_and_stops_at_eos(texts, tmp_path):
    tok = train_tokenizer(CFG, *texts, tmp_path)
    ids = tok.encode_tgt(["die Katze", "es"])
    model_output = [[BOS_ID, *ids[0], EOS_ID, *ids[1], PAD_ID], [*ids[1], PAD_ID, PAD_ID]]
    assert tok.decode_tgt(model_output) == ["die Katze", "es"]


def test_second_call_reuses_the_cached_model(texts, tmp_path, monkeypatch):
    first = train_tokenizer(CFG, *texts, tmp_path)

    def no_training(*args, **kwargs):
        raise AssertionError("retrained although cached")

    monkeypatch.setattr(tokenizer_module, "_train", no_training)
    second = train_tokenizer(CFG, *texts, tmp_path)
    assert second.protos == first.protos
    with pytest.raises(AssertionError, match="retrained"):  # other settings are another model
        train_tokenizer(replace(CFG, vocab_size=50), *texts, tmp_path)
    texts[0].write_text("\n".join(EN[:-1]) + "\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="retrained"):  # so is other data
        train_tokenizer(CFG, *texts, tmp_path)


def test_joint_model_is_shared_by_both_directions(texts, tmp_path):
    forward = train_tokenizer(CFG, *texts, tmp_path)
    backward = train_tokenizer(CFG, *reversed(texts), tmp_path)
    assert forward.fingerprint == backward.fingerprint
    assert len(list(tmp_path.glob("tokenizer-*"))) == 1


def test_separate_models(texts, tmp_path):
    tok = train_tokenizer(replace(CFG, joint=False, vocab_size=40), *texts, tmp_path)
    assert not tok.joint and tok.state_dict()["tgt"] is not None
    assert tok.decode_src(tok.encode_src(EN)) == EN and tok.decode_tgt(tok.encode_tgt(DE)) == DE
    assert tok.encode_src(["ß"])[0][-1] == UNK_ID  # German only in the target model
    assert UNK_ID not in tok.encode_tgt(["ß"])[0]


def test_state_dict_round_trip(texts, tmp_path):
    tok = train_tokenizer(replace(CFG, joint=False, vocab_size=40), *texts, tmp_path)
    restored = Tokenizer.from_state_dict(tok.state_dict())
    assert (
        Tokenizer.from_state_dict({"src": tok.protos[0], "tgt": tok.protos[1]}).fingerprint == tok.fingerprint
    )
    assert restored.encode_tgt(DE) == tok.encode_tgt(DE) and restored.fingerprint == tok.fingerprint


def test_too_large_vocabulary_says_how_to_fix(texts, tmp_path):
    with pytest.raises(NMTError, match=r"lower tokenizer\.vocab_size to <= \d+") as e:
        train_tokenizer(replace(CFG, vocab_size=5000), *texts, tmp_path)
    assert str(texts[0]) in str(e.value)
    assert not list(tmp_path.glob("*tokenizer-*"))  # nothing half-written left behind


def test_the_same_vocabulary_trained_from_text_elsewhere_has_the_same_fingerprint(texts, tmp_path):
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    for path in texts:
        (moved / path.name).write_bytes(path.read_bytes())
    here = train_tokenizer(CFG, *texts, tmp_path / "a")
    there = train_tokenizer(CFG, moved / "train.en", moved / "train.de", tmp_path / "b")
    assert here.protos == there.protos  # the trainer reads lines, so nothing records where they were
    assert here.fingerprint == there.fingerprint
    other = train_tokenizer(replace(CFG, vocab_size=50), *texts, tmp_path / "c")
    assert other.fingerprint != here.fingerprint


# Trains on named pipes written once: the parent's digest of them reads them, the trainer's process then
# waits for ever to read them again, as a trainer busy for minutes on a big corpus would keep it.
STUCK_TRAINER = """
import os, signal, sys, threading
from pathlib import Path
# Ctrl-C as in a program started from a terminal: a background job of a shell without job control (a CI
# script's `cmd &`) starts with SIGINT ignored, and Python then installs no KeyboardInterrupt for it
signal.signal(signal.SIGINT, signal.default_int_handler)
from nmt.config import TokenizerConfig
from nmt.errors import NMTError
from nmt.text.tokenizer import train_tokenizer

folder = Path(sys.argv[1])
pipes = sorted([folder / "train.en", folder / "train.de"])
for pipe in pipes:
    os.mkfifo(pipe)

def write_once():
    for pipe in pipes:
        with open(pipe, "w") as f:
            f.write("a b c\\n")

threading.Thread(target=write_once, daemon=True).start()
try:
    train_tokenizer(TokenizerConfig(vocab_size=60), pipes[1], pipes[0], folder / "out")
except NMTError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
"""


def trainer_pid(parent: int, timeout: float = 60) -> int:
    """The pid of the spawned trainer process of ``parent``, once it runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        for child in children:
            if "spawn_main" in Path(f"/proc/{child}/cmdline").read_text():
                return int(child)
        time.sleep(0.1)
    raise AssertionError("the trainer's process did not start")


def group_gone(pgid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
@pytest.mark.parametrize("event", ["ctrl-c", "trainer killed"])
def test_ctrl_c_stops_the_sentencepiece_trainer_at_once_and_its_death_is_one_line(tmp_path, event):
    script = subprocess.Popen(
        [sys.executable, "-c", STUCK_TRAINER, str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        trainer = trainer_pid(script.pid)
        time.sleep(1)  # it reads the pipe: stuck
        if event == "ctrl-c":
            os.kill(script.pid, signal.SIGINT)
        else:  # as the OOM killer would
            os.kill(trainer, signal.SIGKILL)
        _, stderr = script.communicate(timeout=15)
        assert group_gone(script.pid)  # the trainer too
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(script.pid, signal.SIGKILL)
    if event == "ctrl-c":
        assert script.returncode != 0 and stderr.rstrip().endswith("KeyboardInterrupt")
    else:
        assert script.returncode == 1 and stderr.splitlines() == [
            "error: the SentencePiece trainer's process ended without an answer (killed, signal 9): most "
            "likely for memory; lower tokenizer.input_sentence_size (now 2000000) and run again"
        ]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
