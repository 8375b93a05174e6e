"""Checkpoints: atomic writes, no code execution on load, clear mismatch errors, averaging."""

import functools
import os
import pickle
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import sentencepiece_model

from nmt.checkpoint import (
    FORMAT_VERSION,
    atomic_save,
    load_checkpoint,
    load_model_state,
    make_checkpoint,
    model_from_checkpoint,
    prune_step_checkpoints,
    step_checkpoints,
)
from nmt.config import ToyDataConfig, TrainConfig, TransformerConfig, to_container
from nmt.errors import NMTError
from nmt.models import Transformer
from nmt.text.tokenizer import Tokenizer
from nmt.tooling.average import average_checkpoints, last_checkpoints

TINY = TransformerConfig(d_model=16, ff_dim=32, heads=2, encoder_layers=1, decoder_layers=1, max_positions=32)
VOCAB = 40


def tiny(cfg: TransformerConfig = TINY, vocab: int = VOCAB, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg, vocab, vocab, joint_vocab=True)


@functools.cache
def sentencepiece(seed: int = 0) -> Tokenizer:
    """A joint BPE model of VOCAB pieces; another ``seed``, another model of the same size."""
    return Tokenizer(sentencepiece_model(seed, VOCAB)[0])


def checkpoint(
    model: Transformer, step: int = 1, data: ToyDataConfig | None = None, tokenizer: int = 0
) -> dict:
    """The fields ``save_checkpoints`` writes that loading, averaging and translation read (``tokenizer``:
    the seed of its SentencePiece model)."""
    config = to_container(TrainConfig(data=data or ToyDataConfig(), model=model.cfg))
    spm_state = sentencepiece(tokenizer).state_dict()
    return make_checkpoint(model.state_dict(), config, spm_state, model.vocab_sizes, {"step": step})


def no_temp_files(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


# ------------------------------------------------------------------------------------- atomic save


def test_atomic_save_round_trip(tmp_path):
    ckpt = checkpoint(tiny())
    atomic_save(ckpt, tmp_path / "sub" / "last.pt")
    loaded = load_checkpoint(tmp_path / "sub" / "last.pt")
    assert loaded["progress"] == {"step": 1} and torch.equal(
        loaded["tokenizer"]["src"], ckpt["tokenizer"]["src"]
    )
    assert all(torch.equal(loaded["model"][k], v) for k, v in ckpt["model"].items())
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["last.pt"]


def test_a_checkpoint_is_as_readable_as_any_new_file(tmp_path):
    """Not mkstemp's 0600: a group-shared outputs/ lets the group read its checkpoints."""
    umask = os.umask(0o022)
    os.umask(umask)
    atomic_save(checkpoint(tiny()), tmp_path / "last.pt")
    assert oct((tmp_path / "last.pt").stat().st_mode & 0o777) == oct(0o666 & ~umask)


@pytest.mark.parametrize("crash", [OSError("No space left on device"), KeyboardInterrupt()])
def test_a_crash_while_writing_keeps_the_previous_file(tmp_path, monkeypatch, crash):
    path = tmp_path / "last.pt"
    atomic_save(checkpoint(tiny(), step=1), path)
    written = []

    def torn_save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a zip file")  # some bytes hit the disk, then the process dies
        written.append(getattr(f, "name", None))
        raise crash

    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(type(crash)):
        atomic_save(checkpoint(tiny(seed=1), step=2), path)
    assert written  # the crash did happen during writing
    monkeypatch.undo()
    assert load_checkpoint(path)["progress"] == {"step": 1}
    assert torch.equal(load_checkpoint(path)["model"]["output.weight"], tiny().output.weight)
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"] and no_temp_files(tmp_path)


def test_a_crash_before_the_first_checkpoint_leaves_nothing(tmp_path, monkeypatch):
    def failing_save(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError):
        atomic_save(checkpoint(tiny()), tmp_path / "last.pt")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------- safe load


class Payload:
    """Unpickling this runs a shell command (what a malicious checkpoint would do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_a_malicious_pickle_is_refused_and_not_executed(tmp_path, writer):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    evil = {"format": FORMAT_VERSION, "model": Payload(marker)}
    if writer == "torch.save":
        torch.save(evil, path)
    else:
        path.write_bytes(pickle.dumps(evil, protocol=2))  # the legacy (non-zip) format
    with pytest.raises(NMTError, match="refused to load") as e:
        load_checkpoint(path)
    assert str(path) in str(e.value)
    assert not marker.exists()
    if writer == "torch.save":  # the control: an unsafe load really would have run it
        torch.load(path, weights_only=False)
        assert marker.exists()


def test_files_that_are_not_checkpoints(tmp_path):
    with pytest.raises(NMTError, match="checkpoint not found"):
        load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(NMTError, match="text.pt"):
        load_checkpoint(tmp_path / "text.pt")
    atomic_save(checkpoint(tiny()), tmp_path / "good.pt")
    data = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(NMTError, match="truncated.pt"):
        load_checkpoint(tmp_path / "truncated.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(NMTError, match="not an nmt checkpoint"):
        load_checkpoint(tmp_path / "other.pt")


def test_vocabulary_mismatch_is_a_clear_error(tmp_path):
    atomic_save(checkpoint(tiny(vocab=VOCAB)), tmp_path / "last.pt")
    ckpt = load_checkpoint(tmp_path / "last.pt")
    with pytest.raises(NMTError, match=rf"trainer.resume=x: vocabulary mismatch.* {VOCAB}/{VOCAB}.* 60/60"):
        load_model_state(tiny(vocab=60), ckpt, where="trainer.resume=x")


@pytest.mark.parametrize(
    "other",
    [replace(TINY, d_model=32), replace(TINY, decoder_layers=2), replace(TINY, positional="learned")],
    ids=["d_model", "layers", "positions"],
)
def test_architecture_mismatch_is_a_clear_error(tmp_path, other):
    atomic_save(checkpoint(tiny()), tmp_path / "last.pt")
    with pytest.raises(NMTError, match="checkpoint: architecture does not match the configured model"):
        load_model_state(tiny(other), load_checkpoint(tmp_path / "last.pt"), where="checkpoint")


def test_matching_model_loads_exactly(tmp_path):
    atomic_save(checkpoint(tiny(seed=3)), tmp_path / "last.pt")
    model = tiny(seed=4)
    load_model_state(model, load_checkpoint(tmp_path / "last.pt"), where="checkpoint")
    reference = tiny(seed=3)
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values())
    )
    assert model.output.weight is model.src_embed.tokens.weight  # still tied after loading


# --------------------------------------------------------------------------------------- averaging


def test_average_of_two_checkpoints_is_the_mean(tmp_path):
    a, b = tiny(seed=1), tiny(seed=2)
    atomic_save(checkpoint(a, step=10), tmp_path / "step_10.pt")
    atomic_save(checkpoint(b, step=20), tmp_path / "step_20.pt")
    avg = average_checkpoints([tmp_path / "step_10.pt", tmp_path / "step_20.pt"])
    for name, value in a.state_dict().items():
        expected = (value.double() + b.state_dict()[name].double()) / 2
        assert avg["model"][name].dtype == value.dtype
        torch.testing.assert_close(avg["model"][name], expected.float(), rtol=0, atol=1e-7)
    assert not torch.equal(avg["model"]["output.weight"], a.output.weight)
    assert avg["progress"] == {"step": 20} and "optimizer" not in avg
    assert avg["averaged_from"] == [str(tmp_path / "step_10.pt"), str(tmp_path / "step_20.pt")]
    atomic_save(avg, tmp_path / "averaged.pt")  # a checkpoint that loads into the same architecture
    model = tiny(seed=5)
    load_model_state(model, load_checkpoint(tmp_path / "averaged.pt"), where="averaged")
    torch.testing.assert_close(model.output.weight, (a.output.weight + b.output.weight) / 2)


def test_average_of_one_checkpoint_is_itself(tmp_path):
    a = tiny(seed=1)
    atomic_save(checkpoint(a), tmp_path / "step_1.pt")
    avg = average_checkpoints([tmp_path / "step_1.pt"])
    assert all(torch.equal(avg["model"][k], v) for k, v in a.state_dict().items())


@pytest.mark.parametrize(
    ("other", "vocab"), [(replace(TINY, d_model=32), VOCAB), (TINY, 60), (replace(TINY, heads=4), VOCAB)]
)
def test_averaging_different_architectures_is_refused(tmp_path, other, vocab):
    atomic_save(checkpoint(tiny()), tmp_path / "step_1.pt")
    atomic_save(checkpoint(tiny(other, vocab=vocab)), tmp_path / "step_2.pt")
    with pytest.raises(NMTError, match="cannot average .*step_2.pt with .*step_1.pt"):
        average_checkpoints([tmp_path / "step_1.pt", tmp_path / "step_2.pt"])
    with pytest.raises(NMTError, match="nothing to average"):
        average_checkpoints([])


def test_averaging_checkpoints_of_another_sentencepiece_model_or_direction_is_refused(tmp_path):
    """The ensemble's check: the same vocabulary size and architecture let both through before."""
    first, same, other = (tmp_path / name for name in ("step_1.pt", "step_2.pt", "other.pt"))
    atomic_save(checkpoint(tiny(seed=1)), first)
    atomic_save(checkpoint(tiny(seed=2)), same)
    assert average_checkpoints([first, same])["progress"] == {"step": 1}
    atomic_save(checkpoint(tiny(seed=2), tokenizer=1), other)
    assert sentencepiece(1).src_vocab_size == sentencepiece(0).src_vocab_size == VOCAB
    with pytest.raises(NMTError) as e:
        average_checkpoints([first, other])
    assert str(e.value) == (
        f"{other} has another vocabulary (SentencePiece model) than {first}: the checkpoints averaged "
        "must share it"
    )
    atomic_save(checkpoint(tiny(seed=2), data=ToyDataConfig(src_lang="tgt", tgt_lang="src")), other)
    with pytest.raises(NMTError) as e:
        average_checkpoints([first, other])
    assert str(e.value) == (
        f"{other} translates tgt->src, {first} src->tgt: the checkpoints averaged must translate in one "
        "direction"
    )


def test_a_config_with_interpolations_is_not_a_plain_data_checkpoint(tmp_path, monkeypatch):
    """A checkpoint's config is stored resolved: one that holds ``${...}`` would read the environment of
    whoever loads it (and the service shows data.src_lang to every client) or fail with a traceback."""
    monkeypatch.setenv("NMT_TEST_SECRET", "hunter2")
    for key, value in [("src_lang", "${oc.env:NMT_TEST_SECRET}"), ("tgt_lang", "x${data.src_lang}")]:
        ckpt = checkpoint(tiny())
        ckpt["config"]["data"][key] = value
        atomic_save(ckpt, tmp_path / "evil.pt")
        with pytest.raises(NMTError) as e:
            model_from_checkpoint(load_checkpoint(tmp_path / "evil.pt"))
        assert str(e.value) == (
            f"{tmp_path / 'evil.pt'}: refused to load (not a plain-data checkpoint): its config holds an "
            f"interpolation at data.{key}"
        )
    ckpt = checkpoint(tiny())
    ckpt["config"]["model"]["${oc.env:NMT_TEST_SECRET}"] = 1  # in a key, too
    atomic_save(ckpt, tmp_path / "evil.pt")
    with pytest.raises(NMTError, match=r"interpolation at model\.\$\{oc\.env:NMT_TEST_SECRET\}$"):
        load_checkpoint(tmp_path / "evil.pt")


def test_a_config_that_is_no_training_config_is_one_line(tmp_path):
    ckpt = checkpoint(tiny())
    ckpt["config"]["model"]["d_model"] = "wide"
    with pytest.raises(
        NMTError, match=r"^the checkpoint's config is not a training config \(ValidationError: "
    ):
        model_from_checkpoint(ckpt)


def test_step_checkpoints_are_ordered_numerically_and_pruned(tmp_path):
    for step in (5, 100, 20, 7):
        (tmp_path / f"step_{step}.pt").write_bytes(b"")
    (tmp_path / "step_x.pt").write_bytes(b"")
    (tmp_path / "last.pt").write_bytes(b"")
    assert [p.name for p in step_checkpoints(tmp_path)] == [
        "step_5.pt",
        "step_7.pt",
        "step_20.pt",
        "step_100.pt",
    ]
    assert [p.name for p in last_checkpoints(tmp_path, 2)] == ["step_20.pt", "step_100.pt"]
    prune_step_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step_100.pt", "step_20.pt", "step_x.pt"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(NMTError, match="no step_N.pt"):
        last_checkpoints(tmp_path / "empty", 2)


def test_a_window_keeps_only_the_step_checkpoints_of_the_end_of_the_run(tmp_path):
    for step in (500, 1000, 1500, 1700, 1800, 1900, 2000):
        (tmp_path / f"step_{step}.pt").write_bytes(b"")
    names = [p.name for p in last_checkpoints(tmp_path, 5, window=0.2)]  # steps >= 1600
    assert names == ["step_1700.pt", "step_1800.pt", "step_1900.pt", "step_2000.pt"]
    assert [p.name for p in last_checkpoints(tmp_path, 2, window=0.2)] == ["step_1900.pt", "step_2000.pt"]
    assert len(last_checkpoints(tmp_path, 10)) == 7  # no window: the newest `count`
