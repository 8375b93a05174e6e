"""The models a decode runs, rebuilt from ``checkpoint=``: one checkpoint file, or several (an ensemble).

The one place a checkpoint becomes something that translates: the Translator and the decoding worker
processes (:class:`nmt.inference.backends.ProcessesBackend`) both load through :func:`load_models`, so
that each process decodes with the same models under the same settings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from nmt.checkpoint import Task, check_same_task, load_checkpoint, model_from_checkpoint
from nmt.config import TrainConfig, checkpoint_paths
from nmt.models import Seq2Seq
from nmt.models.ensemble import Ensemble
from nmt.text.tokenizer import Tokenizer


@dataclass
class LoadedModels:
    """A model (an :class:`Ensemble` of several checkpoints' models) with what decoding it needs."""

    model: Seq2Seq
    tokenizer: Tokenizer
    cfg: TrainConfig  # the first checkpoint's settings (decoding, data), the models' shortest max_positions
    step: int | None  # training updates behind a single checkpoint's weights (None: unknown, or several)
    paths: list[str]  # the checkpoint files, in the order given

    @property
    def direction(self) -> tuple[str, str]:
        """The (source, target) languages the model translates."""
        return self.cfg.data.src_lang, self.cfg.data.tgt_lang


def load_models(checkpoint: Any, device: torch.device) -> LoadedModels:
    """``checkpoint``: a path, or a list of paths of models that translate in one direction with one
    vocabulary (refused in one line naming the checkpoint that does not)."""
    paths = checkpoint_paths(checkpoint)
    ckpt = load_checkpoint(paths[0])
    model, tokenizer, cfg = model_from_checkpoint(ckpt, device)
    if len(paths) == 1:
        return LoadedModels(model, tokenizer, cfg, ckpt.get("progress", {}).get("step"), paths)
    task = Task.of(cfg.data.src_lang, cfg.data.tgt_lang, tokenizer)
    models = [model]
    for path in paths[1:]:
        other, other_tokenizer, other_cfg = model_from_checkpoint(load_checkpoint(path), device)
        check_same_task(
            f"checkpoint={path}",
            Task.of(other_cfg.data.src_lang, other_cfg.data.tgt_lang, other_tokenizer),
            str(paths[0]),
            task,
            "the models of an ensemble",
        )
        models.append(other)
        positions = min(cfg.model.max_positions, other_cfg.model.max_positions)
        cfg = replace(cfg, model=replace(cfg.model, max_positions=positions))
    return LoadedModels(Ensemble(models).eval(), tokenizer, cfg, None, paths)
