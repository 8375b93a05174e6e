"""TensorBoard logging of a training run: scalars, validation examples, attention images, hparams.

Only rank 0 writes; on the other ranks every method is a no-op.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.tensorboard import SummaryWriter

from nmt.attention_maps import attention_map
from nmt.config import TrainConfig, to_container
from nmt.decoding import greedy_search, pad_batch


def flatten(d: dict, prefix: str = "") -> dict[str, float | int | str | bool]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and None become strings (TensorBoard hparams accept scalars)."""
    out: dict = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, int | float | str | bool) else str(value)
    return out


class Monitor:
    def __init__(self, run_dir: Path, cfg: TrainConfig, enabled: bool, purge_step: int | None = None):
        self.cfg = cfg
        self.writer = SummaryWriter(str(run_dir / "tb"), purge_step=purge_step) if enabled else None

    def train_scalars(self, summary: dict[str, float], step: int) -> None:
        if self.writer is None:
            return
        for key, value in summary.items():
            self.writer.add_scalar(f"train/{key}", value, step)

    def validation(self, metrics: dict, examples: list, step: int, model, data, device) -> None:
        cfg = self.cfg
        if self.writer is None:
            return
        for key in ("loss", "ppl", "bleu", "chrf"):
            self.writer.add_scalar(f"valid/{key}", metrics[key], step)
        rows = ["| source | reference | hypothesis |", "|---|---|---|"]
        rows += [f"| {s} | {r} | {h} |" for s, r, h in examples[: cfg.trainer.num_text_examples]]
        self.writer.add_text("valid/examples", "\n".join(rows), step)
        if cfg.trainer.attention_image:
            self.attention_image(model, data, step, device)

    @torch.no_grad()
    def attention_image(self, model, data, step: int, device) -> None:
        """Last-layer cross-attention (mean over heads) of the first validation sentence, decoded greedily."""
        cfg = self.cfg
        src_ids = list(data.splits["valid"].src(0)[: cfg.model.max_positions - 1])
        model.eval()
        hyp = greedy_search(model, pad_batch([src_ids], device), _greedy(cfg), cfg.model.max_positions - 1)
        self.writer.add_figure(
            "valid/attention", attention_map(model, data.tokenizer, src_ids, hyp[0].tokens), step
        )
        model.train()

    def close(self, final: dict[str, float]) -> None:
        if self.writer is None:
            return
        if final:
            metrics = {f"hparam/{k}": v for k, v in final.items() if k != "step"}
            self.writer.add_hparams(flatten(to_container(self.cfg)), metrics, run_name=".")
        self.writer.close()


def _greedy(cfg: TrainConfig):
    return type(cfg.decoding)(**{**vars(cfg.decoding), "beam_size": 1, "nbest": 1})
