"""Fine-tuning: a new run whose weights start from another run's checkpoint (``trainer.init_from``).

The parent fixes what its weights were trained for: the architecture, the tokenizer (the new corpus is
encoded with it, never a SentencePiece model trained on the new text) and the translation direction.
Everything else is the new run's own: data, optimizer, schedule, sampler, step count, best score and
budget. Every conflict is refused before any data is prepared, and the parent's files are only read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nmt import checkpoint as ckpt_io
from nmt.config import TrainConfig, directions_of, to_container
from nmt.data import PreparedData
from nmt.errors import NMTError
from nmt.models import Seq2Seq
from nmt.text.special import UNK_ID
from nmt.text.tokenizer import SAMPLING_KEYS, Tokenizer

log = logging.getLogger(__name__)

# model.* keys a fine-tune may change: regularisation, and how additive attention is chunked (speed only)
FREE_MODEL_KEYS = ("dropout", "attention_dropout", "activation_dropout", "additive_chunk")


@dataclass
class FineTune:
    """A run that starts (or started) from a parent checkpoint."""

    tokenizer: Tokenizer  # the parent's: the run's corpus is encoded with it
    record: dict[str, Any]  # what the run's checkpoints say of the parent: path, weights digest, step
    weights: dict[str, Any] | None  # the parent's checkpoint to start from; None when resuming


def fine_tune(cfg: TrainConfig) -> FineTune | None:
    """The parent of a new ``trainer.init_from`` run, checked against ``cfg`` (None for other runs)."""
    path = cfg.trainer.init_from
    if not path:
        return None
    parent = load_parent(path)
    check_compatible(cfg, parent, path)
    record = {"path": str(Path(path).resolve()), "step": int(parent.get("progress", {}).get("step", 0))}
    return FineTune(Tokenizer.from_state_dict(parent["tokenizer"]), record, parent)


def resumed_fine_tune(cfg: TrainConfig, own: dict[str, Any], resume_from: Path) -> FineTune | None:
    """The parent of a run resumed from its checkpoint ``own`` (read from ``resume_from``), or None when
    it is no fine-tune. It keeps the tokenizer and parent that checkpoint records, with or without
    ``trainer.init_from``, which it no longer reads."""
    path = cfg.trainer.init_from
    if path:
        check_resumes_a_fine_tune_of(own, path, resume_from)
        log.info(
            "trainer.init_from=%s ignored: the run resumes from its own checkpoint %s", path, resume_from
        )
    if "parent" not in own:
        return None
    return FineTune(Tokenizer.from_state_dict(own["tokenizer"]), own["parent"], None)


def check_resumes_a_fine_tune_of(own: dict[str, Any], path: str, resume_from: Path) -> None:
    """Refuse ``trainer.init_from=PATH`` in a run dir whose checkpoint is not a fine-tune of PATH (the
    parent's own run dir, say): resuming it would train on another run and write over its files, PATH
    maybe among them. The parent is named by the path it was read from, which may no longer exist."""
    parent = own.get("parent") or {}
    if parent.get("path") == str(Path(path).resolve()):
        return
    what = f"a fine-tune of {parent['path']}" if parent.get("path") else "not a fine-tune"
    raise NMTError(
        f"trainer.init_from={path}: this hydra.run.dir already holds a run ({resume_from}, {what}) that "
        "the fine-tune would resume and write over; start the fine-tune in another hydra.run.dir"
    )


def load_parent(path: str) -> dict[str, Any]:
    """The checkpoint ``trainer.init_from`` names, refused in one line when it cannot be one."""
    where = f"trainer.init_from={path}"
    if Path(path).is_dir():
        raise NMTError(
            f"{where}: a folder; give a checkpoint file (e.g. {Path(path) / 'checkpoints/final.pt'})"
        )
    try:
        ckpt = ckpt_io.load_checkpoint(path)
    except NMTError as e:
        raise NMTError(f"{where}: {e}") from None
    missing = [key for key in ("model", "config", "tokenizer") if not ckpt.get(key)]
    if missing:
        raise NMTError(f"{where}: the checkpoint lacks {', '.join(missing)}; a fine-tune needs a whole model")
    return ckpt


def parent_tokenizer(cfg: TrainConfig) -> Tokenizer | None:
    """The tokenizer that prepares a fine-tune's corpus (``scripts/prepare_data.py``), checked as the
    training run checks it; None without ``trainer.init_from``."""
    found = fine_tune(cfg)
    return found.tokenizer if found else None


def check_compatible(cfg: TrainConfig, parent: dict[str, Any], path: str) -> None:
    """Refuse a config that does not describe the parent's model: another architecture, vocabulary
    or direction. ``model.*`` and ``tokenizer.*`` must equal the parent's, but for dropout."""
    theirs = ckpt_io.checkpoint_config(parent)
    where = f"trainer.init_from={path}"
    mine, their_all = to_container(cfg), to_container(theirs)
    differences = model_differences(cfg, parent)
    if differences:
        key, value, their_value = differences[0]
        raise NMTError(
            f"model.{key}={value}: {where} has model.{key}={their_value}; a fine-tune "
            f"keeps its parent's architecture (set model.{key}={their_value} or drop the override)"
        )
    tok, their_tok = mine["tokenizer"], their_all["tokenizer"]
    for key in sorted(tok):
        if key in SAMPLING_KEYS or tok[key] == their_tok.get(key):
            continue
        raise NMTError(
            f"tokenizer.{key}={tok[key]}: {where} has tokenizer.{key}={their_tok.get(key)}; a fine-tune "
            f"encodes its corpus with its parent's tokenizer (set tokenizer.{key}={their_tok.get(key)})"
        )
    if cfg.data.source == "multi" or theirs.data.source == "multi":
        check_directions(cfg, theirs, where)
        return
    direction, theirs_dir = (
        (cfg.data.src_lang, cfg.data.tgt_lang),
        (theirs.data.src_lang, theirs.data.tgt_lang),
    )
    if direction != theirs_dir:
        raise NMTError(
            f"data.src_lang={direction[0]} data.tgt_lang={direction[1]}: {where} translates "
            f"{theirs_dir[0]} -> {theirs_dir[1]}; a fine-tune keeps its parent's direction"
        )


def check_directions(cfg: TrainConfig, theirs: TrainConfig, where: str) -> None:
    """A multilingual parent is fine-tuned on any subset of its directions (a multilingual corpus, tagged
    as it was); a direction it never trained, a bilingual corpus or a bilingual parent are refused: the
    tags of the one are not what the other reads."""
    mine, parents = directions_of(cfg.data), directions_of(theirs.data)
    trained = ", ".join(f"{s}->{t}" for s, t in parents)
    if theirs.data.source != "multi":
        raise NMTError(
            f"data.source=multi: {where} is bilingual ({trained}, no target-language tags in its "
            "vocabulary); fine-tune it on its own direction, or train a multilingual model anew"
        )
    if cfg.data.source != "multi":
        raise NMTError(
            f"data.source={cfg.data.source}: {where} is multilingual ({trained}) and reads tagged input; "
            "fine-tune it with a multilingual corpus (data.corpora) of some of its directions"
        )
    targets = {t for _, t in parents}
    for i, (src, tgt) in enumerate(mine):
        if tgt not in targets:
            raise NMTError(
                f"data.corpora[{i}]: {src}->{tgt}: the tag >>{tgt}<< is not in the vocabulary of {where} "
                f"(it translates {trained}); a new target language needs a model trained with it"
            )
        if (src, tgt) not in parents:
            raise NMTError(
                f"data.corpora[{i}]: {src}->{tgt} is not one of the directions of {where} ({trained}); "
                "a fine-tune takes a subset of them"
            )


def model_differences(cfg: TrainConfig, ckpt: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The ``model.*`` keys whose value in ``cfg`` is not the one the checkpoint ``ckpt`` was trained
    with, as (key, cfg's value, the checkpoint's), the architecture first; dropout and other keys that
    leave the weights' meaning alone (``FREE_MODEL_KEYS``) aside."""
    model, theirs = to_container(cfg)["model"], to_container(ckpt_io.checkpoint_config(ckpt))["model"]
    keys = ["arch", *sorted((set(model) | set(theirs)) - {"arch"})]
    return [
        (key, model.get(key), theirs.get(key))
        for key in keys
        if key not in FREE_MODEL_KEYS and model.get(key) != theirs.get(key)
    ]


def check_same_model(cfg: TrainConfig, state: dict[str, Any], where: str) -> None:
    """Refuse to resume a checkpoint as another architecture (``model.heads=8`` over a run of 4 heads:
    the shapes may fit, the weights do not mean the same), naming every key that differs."""
    differences = model_differences(cfg, state)
    if differences:
        given = " ".join(f"model.{key}={value}" for key, value, _ in differences)
        had = " ".join(f"model.{key}={theirs}" for key, _, theirs in differences)
        raise NMTError(
            f"{given}: {where} was trained with {had}; a resumed run keeps its architecture (drop the "
            "override, or train a new run in another hydra.run.dir)"
        )


def start(run: FineTune, model: Seq2Seq) -> None:
    """Load the parent's weights into the freshly built ``model`` and record their digest."""
    assert run.weights is not None
    ckpt_io.load_model_state(model, run.weights, where=f"trainer.init_from={run.record['path']}")
    run.record["digest"] = ckpt_io.weights_digest(model)
    run.weights = None  # the optimizer, sampler and progress of the parent are not used: let them go
    log.info(
        "fine-tuning %s (step %d of its run, weights sha256 %s, tokenizer %s): fresh optimizer, "
        "schedule, sampler and budget",
        run.record["path"],
        run.record["step"],
        run.record["digest"][:12],
        run.tokenizer.fingerprint,
    )


def warn_unknown(data: PreparedData, threshold: float, path: str) -> None:
    """Warn once when the parent's tokenizer leaves much of the new training text as <unk>: characters
    its training text did not have, which the fine-tune can neither read nor write."""
    train = data.splits["train"]
    shares = {side: unknown_share(train.flat_ids(side)) for side in ("src", "tgt")}
    if max(shares.values()) > threshold:
        log.warning(
            "trainer.init_from=%s: %.1f%% of the source and %.1f%% of the target training subwords are "
            "<unk> under the parent's tokenizer (text outside its alphabet; warned above "
            "trainer.init_unk_warning=%g)",
            path,
            100 * shares["src"],
            100 * shares["tgt"],
            threshold,
        )


def unknown_share(ids: np.ndarray) -> float:
    """The share of <unk> in a flat id array, read a block at a time (it may be memory-mapped)."""
    block = 1 << 24
    unknown = sum(int(np.count_nonzero(ids[i : i + block] == UNK_ID)) for i in range(0, len(ids), block))
    return unknown / max(len(ids), 1)
