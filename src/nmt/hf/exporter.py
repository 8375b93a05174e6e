"""Export a trained Transformer as a Hugging Face ``transformers`` folder (``scripts/export_hf.py``).

The folder holds what ``AutoModelForSeq2SeqLM.from_pretrained`` and ``AutoTokenizer.from_pretrained``
load without custom code: ``config.json``, ``model.safetensors`` and ``generation_config.json`` (written
by the class itself, :mod:`nmt.hf.convert` says which class and how the weights map), the tokenizer
files (:mod:`nmt.hf.tokenizer_files`), a model card ``README.md`` (:mod:`nmt.hf.card`) and
``nmt_hf_export.json``, the export's record (checkpoint, weights digest, tokenizer fingerprint, the check's
figures).

It is written into a uniquely named folder beside ``output``, checked there (:mod:`nmt.hf.parity`: the
export fails when the logits differ by more than the tolerance) and renamed to ``output`` at the end,
so an interrupted or failed export leaves no folder that looks finished. An existing non-empty
``output`` is replaced only with ``force=true`` and only when it is an earlier export (it holds
``nmt_hf_export.json``); a symbolic link is never followed (:func:`nmt.outputs.replace_output_dir`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nmt.checkpoint import checkpoint_config, load_checkpoint, model_from_checkpoint, weights_digest
from nmt.config import ExportHFConfig, HFCheckConfig, TrainConfig, directions_of
from nmt.data import read_lines
from nmt.errors import NMTError
from nmt.hf.card import CardFacts, model_card
from nmt.hf.convert import generation_config, hf_class, hf_config, hf_weights
from nmt.hf.parity import Parity, check_parity, require_transformers
from nmt.hf.tokenizer_files import write_tokenizer
from nmt.models import Transformer, count_parameters
from nmt.outputs import check_output_dir, replace_output_dir
from nmt.text.tags import tagged, target_languages
from nmt.text.tokenizer import Tokenizer

RECORD = "nmt_hf_export.json"  # the record of an export: force=true replaces only a folder holding it
WRITER = "scripts/export_hf.py"


# ------------------------------------------------------------------------------------------- exporting
def export_model(
    model: Transformer,
    tokenizer: Tokenizer,
    train_cfg: TrainConfig,
    output: str | Path,
    check: HFCheckConfig,
    sentences: list[str],
    refs: list[str] | None = None,
    force: bool = False,
    meta: dict[str, Any] | None = None,
    test_reports: Sequence[dict[str, Any]] = (),
) -> Parity:
    """Write ``model`` and ``tokenizer`` as a transformers folder ``output`` and check it on ``sentences``
    (with ``refs``: their scores too); ``meta`` (``checkpoint``, ``step``) goes into the record and the
    card, ``test_reports`` (scripts/evaluate.py's on the test split, one per direction) into the card."""
    class_name = hf_class(model.cfg, tokenizer.joint)
    output = Path(output)
    check_output_dir(output, RECORD, force, WRITER)
    transformers = require_transformers()
    meta = meta or {}
    with replace_output_dir(output, RECORD, force, WRITER) as tmp:
        _save_model(transformers, model, class_name, train_cfg, tmp)
        write_tokenizer(tokenizer, tmp, languages(train_cfg), model.cfg.max_positions)
        parity = check_parity(
            model, tokenizer, tmp, train_cfg.decoding, sentences, refs, check.batch_sentences
        )
        _refuse_mismatch(parity, check, transformers.__version__)
        checkpoint = Path(meta.get("checkpoint", "model.pt"))
        facts = CardFacts(
            class_name,
            count_parameters(model),
            model.vocab_sizes,
            checkpoint,
            meta.get("step"),
            parity,
            list(test_reports),
        )
        (tmp / "README.md").write_text(model_card(train_cfg, facts, output.name), encoding="utf-8")
        record = _record(class_name, transformers.__version__, model, tokenizer, parity, meta, checkpoint)
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        _readable(tmp)
    return parity


def languages(train_cfg: TrainConfig) -> tuple[str, str]:
    """The tokenizer config's source and target language: the pair's, or "mul" for a side with several
    (the ISO 639 code for many languages, which the Hub reads)."""
    directions = directions_of(train_cfg.data)
    sides = [list(dict.fromkeys(side)) for side in zip(*directions)]
    src, tgt = (side[0] if len(side) == 1 else "mul" for side in sides)
    return src, tgt


def tagged_check(train_cfg: TrainConfig, sentences: list[str], refs: list[str] | None) -> list[str]:
    """The check's sentences as the model reads them: a multilingual model's, each into every target
    language it has, with the tag (``>>fr<< A man ...``) that MarianTokenizer reads too."""
    if train_cfg.data.source != "multi":
        return sentences
    if refs is not None:
        raise NMTError(
            "check.ref: a multilingual model is checked into each of its target languages, with no "
            "references to score; leave check.ref out (scripts/evaluate.py scores every direction)"
        )
    targets = target_languages(directions_of(train_cfg.data))
    return [line for lang in targets for line in tagged(lang, sentences)]


def _refuse_mismatch(parity: Parity, check: HFCheckConfig, version: str) -> None:
    """NMTError when the exported model's logits or its tokenizer's ids are not ours."""
    if parity.max_abs_diff > check.tolerance:
        raise NMTError(
            f"the exported model's logits differ from ours by {parity.max_abs_diff:.2e} "
            f"(check.tolerance={check.tolerance:g}): the export is wrong for this transformers {version}"
        )
    if parity.special_text_mismatches:
        raise NMTError(
            f"the exported tokenizer encodes {parity.special_text_mismatches[0]!r} to other ids than "
            f"ours: the export is wrong for this transformers {version}"
        )


def _record(
    class_name: str,
    version: str,
    model: Transformer,
    tokenizer: Tokenizer,
    parity: Parity,
    meta: dict[str, Any],
    checkpoint: Path,
) -> dict[str, Any]:
    """The export's record (``nmt_hf_export.json``): what was exported, by what, and the check's figures."""
    return {
        "format": "transformers",
        "class": class_name,
        "transformers_version": version,
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "weights_sha256": weights_digest(model),
        "parity": {
            "sentences": len(parity.sentences),
            "max_abs_logit_diff": parity.max_abs_diff,
            "greedy_identical": parity.identical,
        },
        **meta,
        "checkpoint": checkpoint.name,  # the folder is published: no path of this disk
    }


def _save_model(
    transformers, model: Transformer, class_name: str, train_cfg: TrainConfig, folder: Path
) -> None:
    """``config.json``, ``model.safetensors`` and ``generation_config.json``, written by the class's own
    ``save_pretrained`` (which knows which tied or recomputed weights it leaves out)."""
    cls = getattr(transformers, class_name)
    hf_model = cls(cls.config_class(**hf_config(model, class_name)))
    weights = hf_weights(model, class_name)
    expected = set(hf_model.state_dict())
    missing, unknown = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unknown:
        raise NMTError(
            f"transformers {transformers.__version__}'s {class_name} has other weights than this exporter "
            f"writes (missing: {missing[:3]}, unknown: {unknown[:3]})"
        )
    hf_model.load_state_dict(weights)
    hf_model.generation_config = transformers.GenerationConfig(
        **generation_config(train_cfg.decoding, model.cfg.max_positions)
    )
    hf_model.save_pretrained(folder)
    if not (folder / "model.safetensors").is_file():
        raise NMTError(
            f"transformers {transformers.__version__} wrote no model.safetensors: pip install safetensors"
        )


def _readable(folder: Path) -> None:
    """The permissions of a folder and files made normally (the temporary folder and some files were made
    private to this user)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~umask)


def check_sentences(check: HFCheckConfig) -> tuple[list[str], list[str] | None]:
    """The source sentences of the check (``check.src``'s lines, else ``check.text``) and their references."""
    if check.tolerance <= 0 or check.batch_sentences < 1:
        raise NMTError(
            f"check.tolerance={check.tolerance:g} and check.batch_sentences={check.batch_sentences} "
            "must be positive"
        )
    if check.ref and not check.src:
        raise NMTError("check.ref needs check.src (the references' sources)")
    sentences = read_lines(Path(check.src)) if check.src else list(check.text)
    if not sentences:
        raise NMTError(
            "check.text is empty and check.src is not given: give sentences to check the export on"
        )
    refs = read_lines(Path(check.ref)) if check.ref else None
    if refs is not None and len(refs) != len(sentences):
        raise NMTError(
            f"check.ref={check.ref} has {len(refs)} lines for the {len(sentences)} of check.src={check.src}"
        )
    return sentences, refs


def export_checkpoint(cfg: ExportHFConfig, test_reports: Sequence[dict[str, Any]] = ()) -> Parity:
    """``scripts/export_hf.py``: refuse what cannot be exported (before loading the weights), then export."""
    sentences, refs = check_sentences(cfg.check)
    ckpt = load_checkpoint(cfg.checkpoint)
    train_cfg = checkpoint_config(ckpt)
    joint = Tokenizer.from_state_dict(ckpt["tokenizer"]).joint
    hf_class(train_cfg.model, joint)
    sentences = tagged_check(train_cfg, sentences, refs)
    check_output_dir(Path(cfg.output), RECORD, cfg.force, WRITER)
    model, tokenizer, train_cfg = model_from_checkpoint(ckpt, "cpu")
    meta = {"checkpoint": str(Path(cfg.checkpoint).resolve()), "step": ckpt.get("progress", {}).get("step")}
    mine = [r for r in test_reports if r.get("step") == meta["step"]]  # not of earlier weights of that name
    return export_model(
        model, tokenizer, train_cfg, cfg.output, cfg.check, sentences, refs, cfg.force, meta, mine
    )
