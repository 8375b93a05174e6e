"""TensorBoard logging of a training run: scalars, validation examples, attention images, hparams.

Only rank 0 writes; on the other ranks every method is a no-op.
"""

from __future__ import annotations

from pathlib import Path

from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from nmt.analysis.cross_attention import cross_attention
from nmt.config import TrainConfig, to_container
from nmt.plotting import attention_figure


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
    def __init__(
        self,
        run_dir: Path,
        cfg: TrainConfig,
        enabled: bool,
        purge_step: int | None = None,
        parent: dict | None = None,
    ):
        self.cfg = cfg
        self.parent = parent  # a fine-tune's parent checkpoint (path, weights digest, step): an hparam too
        self.writer = SummaryWriter(str(run_dir / "tb"), purge_step=purge_step) if enabled else None

    def train_scalars(self, summary: dict[str, float], step: int) -> None:
        if self.writer is None:
            return
        for key, value in summary.items():
            self.writer.add_scalar(f"train/{key}", value, step)

    def validation(
        self, metrics: dict, examples: list, step: int, model, tokenizer, first: tuple[list[int], list[int]]
    ) -> None:
        """Scalars, example translations and (from the validation's own decoding of its first sentence,
        ``first`` = source and hypothesis ids) the cross-attention image."""
        cfg = self.cfg
        if self.writer is None:
            return
        for key in ("loss", "ppl", "bleu", "chrf"):
            self.writer.add_scalar(f"valid/{key}", metrics[key], step)
        for key in (k for k in metrics if "/" in k):  # several directions: each one's, e.g. bleu/en-de
            self.writer.add_scalar(f"valid/{key}", metrics[key], step)
        rows = ["| source | reference | hypothesis |", "|---|---|---|"]
        rows += [f"| {s} | {r} | {h} |" for s, r, h in examples[: cfg.trainer.num_text_examples]]
        self.writer.add_text("valid/examples", "\n".join(rows), step)
        if cfg.trainer.attention_image:
            model.eval()
            p = cross_attention(model, tokenizer, *first).panels()
            figure = attention_figure(
                p.weights, p.source_tokens, p.target_tokens, titles=p.titles, title=p.title
            )
            self.writer.add_figure("valid/attention", figure, step)
            model.train()

    def close(self, final: dict[str, float]) -> None:
        if self.writer is None:
            return
        if final:  # the run's end: hyperparameters and final metrics, once per run
            metrics = {f"hparam/{k}": v for k, v in final.items() if k != "step"}
            # Through this writer (add_hparams would open another event file per call). The session's
            # records only, not an experiment record of its own: TensorBoard then builds the experiment
            # of a sweep's runs from them and lists the hyperparameters that differ first.
            params = flatten({**to_container(self.cfg), **({"parent": self.parent} if self.parent else {})})
            _experiment, *session = hparams(params, metrics)
            for record in session:
                self.writer.file_writer.add_summary(record)
            for key, value in metrics.items():
                self.writer.add_scalar(key, value, int(final.get("step", 0)))
        self.writer.close()
