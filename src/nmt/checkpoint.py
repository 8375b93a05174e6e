"""Checkpoints: written atomically, loaded without running code, complete enough to translate alone.

A checkpoint is a dict of tensors and plain Python values (see :func:`make_checkpoint`), saved with
``torch.save`` and read back with ``torch.load(weights_only=True)``, which refuses pickled code.
"""

from __future__ import annotations

import hashlib
import pickle
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf.errors import OmegaConfBaseException

from nmt.cache import atomic_write
from nmt.config import TrainConfig, to_train_config
from nmt.errors import NMTError
from nmt.models import Seq2Seq, build_model
from nmt.text.tokenizer import Tokenizer

FORMAT_VERSION = 1


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(x: Any) -> Any:
    return tuple(_as_tuple(v) for v in x) if isinstance(x, list | tuple) else x


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` through :func:`nmt.cache.atomic_write`: a crash at any point leaves either the old
    checkpoint or the new one, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: torch.save(obj, f))


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint on the CPU; refuse anything that is not plain data."""
    path = Path(path)
    if not path.is_file():
        raise NMTError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise NMTError(
            f"{path}: refused to load (not a plain-data checkpoint): {str(e).splitlines()[0]}"
        ) from e
    except Exception as e:  # torn or foreign files fail in many ways (EOFError, KeyError on garbage, ...)
        raise NMTError(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from e
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT_VERSION:
        raise NMTError(f"{path}: not an nmt checkpoint (format {FORMAT_VERSION} expected)")
    interpolation = _interpolation(ckpt.get("config"))
    if interpolation:
        raise NMTError(
            f"{path}: refused to load (not a plain-data checkpoint): its config holds an interpolation "
            f"at {interpolation}"
        )
    return ckpt


def _interpolation(node: Any, where: str = "") -> str:
    """The first key of a checkpoint's config whose value (or name) holds ``${``, "" if none. Configs are
    saved resolved, so one is foreign, and rebuilding the config would resolve it: ``${oc.env:...}``
    would read the environment of whoever loads the checkpoint (and the service shows ``data.*``)."""
    if isinstance(node, str):
        return (where or "config") if "${" in node else ""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        name = f"{where}.{key}" if where else str(key)
        found = name if "${" in str(key) else _interpolation(value, name)
        if found:
            return found
    return ""


def make_checkpoint(
    model: dict[str, torch.Tensor],
    config: dict[str, Any],
    tokenizer: dict[str, Any],
    vocab: dict[str, int],
    progress: dict[str, Any],
    **extra: Any,
) -> dict[str, Any]:
    """The checkpoint: the weights, the resolved training config (:func:`nmt.config.to_container`), the
    SentencePiece models (``Tokenizer.state_dict``), the vocabulary sizes and the training progress,
    enough to translate without the run dir. ``extra`` holds what only some checkpoints have: the
    training state to resume (``optimizer``, ``scaler``, ``sampler``, ``rng``) or where weights come
    from (``averaged_from``; a fine-tune's ``parent``: path, step and weights digest)."""
    return {
        "format": FORMAT_VERSION,
        "model": model,
        "config": config,
        "tokenizer": tokenizer,
        "vocab": dict(vocab),
        "progress": progress,
        **extra,
    }


def checkpoint_config(ckpt: dict[str, Any]) -> TrainConfig:
    try:
        return to_train_config(ckpt["config"])
    except (KeyError, TypeError, AttributeError, OmegaConfBaseException) as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise NMTError(
            f"the checkpoint's config is not a training config ({type(e).__name__}: {first})"
        ) from e


@dataclass(frozen=True)
class Task:
    """What a model translates: its direction and its vocabulary (the tokenizer's fingerprint). Models
    combined (an ensemble, an average) or continued (a resumed run) must share all three: a joint
    vocabulary serves both directions, and two SentencePiece models of one size number other pieces."""

    src_lang: str
    tgt_lang: str
    vocabulary: str  # Tokenizer.fingerprint

    @classmethod
    def of(cls, src_lang: str, tgt_lang: str, tokenizer: Tokenizer) -> Task:
        return cls(src_lang, tgt_lang, tokenizer.fingerprint)


def checkpoint_task(ckpt: dict[str, Any]) -> Task:
    data = ckpt["config"]["data"]
    return Task.of(data["src_lang"], data["tgt_lang"], Tokenizer.from_state_dict(ckpt["tokenizer"]))


def check_same_task(name: str, task: Task, reference: str, expected: Task, members: str) -> None:
    """Refuse ``name`` (translating ``task``) beside ``reference`` (``expected``), in one line that names
    both; ``members`` says what they are (``the models of an ensemble``)."""
    if (task.src_lang, task.tgt_lang) != (expected.src_lang, expected.tgt_lang):
        raise NMTError(
            f"{name} translates {task.src_lang}->{task.tgt_lang}, {reference} "
            f"{expected.src_lang}->{expected.tgt_lang}: {members} must translate in one direction"
        )
    if task.vocabulary != expected.vocabulary:
        raise NMTError(
            f"{name} has another vocabulary (SentencePiece model) than {reference}: {members} must share it"
        )


def model_from_checkpoint(
    ckpt: dict[str, Any], device: torch.device | str = "cpu"
) -> tuple[Seq2Seq, Tokenizer, TrainConfig]:
    """Rebuild model, tokenizer and config from a checkpoint alone (no run dir, no data needed)."""
    cfg = checkpoint_config(ckpt)
    tokenizer = Tokenizer.from_state_dict(ckpt["tokenizer"])
    model = build_model(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.joint)
    load_model_state(model, ckpt, where="checkpoint")
    return model.to(device).eval(), tokenizer, cfg


def load_model_state(model: Seq2Seq, ckpt: dict[str, Any], where: str) -> None:
    """Load weights, with a clear message when vocabulary or architecture do not match."""
    vocab = ckpt.get("vocab", {})
    expected = model.vocab_sizes
    if vocab and vocab != expected:
        raise NMTError(
            f"{where}: vocabulary mismatch: checkpoint has src/tgt vocab {vocab['src']}/{vocab['tgt']}, "
            f"the configured model has {expected['src']}/{expected['tgt']} (tokenizer.vocab_size?)"
        )
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        why = " ".join(str(e).split())  # torch's lines, one per key: on one line
        raise NMTError(f"{where}: architecture does not match the configured model: {why}") from e


def check_not_training_checkpoint(output: str | Path, key: str = "output") -> None:
    """Refuse (NMTError) to write ``output`` over a checkpoint that training writes and resumes from
    (``last.pt``, ``best.pt``, ``step_N.pt`` that is there): an averaged or final model in its place
    would be trained on, or pruned, as if training had written it."""
    path = Path(output)
    if path.exists() and re.fullmatch(r"last\.pt|best\.pt|step_\d+\.pt", path.name):
        raise NMTError(
            f"{key}={output} is a checkpoint of the training run (training writes and resumes from "
            f"{path.name}); choose another name, e.g. {path.with_name('final.pt')}"
        )


def step_checkpoints(folder: Path) -> list[Path]:
    """``step_N.pt`` files of a run, oldest first."""
    found = [p for p in folder.glob("step_*.pt") if re.fullmatch(r"step_\d+\.pt", p.name)]
    return sorted(found, key=checkpoint_step)


def step_checkpoint(folder: Path, step: int) -> Path:
    """Where the step checkpoint of update ``step`` goes."""
    return folder / f"step_{step}.pt"


def checkpoint_step(path: Path) -> int:
    """N of ``step_N.pt``."""
    return int(path.stem.removeprefix("step_"))


def prune_step_checkpoints(folder: Path, keep: int) -> None:
    for old in step_checkpoints(folder)[: max(0, len(step_checkpoints(folder)) - keep)]:
        old.unlink(missing_ok=True)


def all_finite(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def weights_digest(model: torch.nn.Module) -> str:
    """The SHA-256 of a model's weights (names, dtypes, shapes and values, in name order): what an
    export records of the checkpoint it came from. The weights alone, so a checkpoint saved again with
    other settings (``final.pt`` of ``scripts/select_final.py``) is still the same model."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)}\n".encode())
        h.update(flat.view(torch.uint8).numpy().data)
    return h.hexdigest()
