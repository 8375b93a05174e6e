"""Pictures: attention heatmaps (source subwords x target subwords) and training curves."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

PNG_DPI = 100  # pixels per inch of the saved pictures
COLORBAR_WIDTH = 0.9  # inches added to the right of the panels
TITLE_HEIGHT = 0.4  # inches added on top for a figure title


def attention_figure_size(
    panels: int, tgt_len: int, src_len: int, cell: float = 0.32, title: bool = False
) -> tuple[float, float]:
    """(width, height) in inches of :func:`attention_figure`'s figure: ``cell`` inches per subword,
    plus room for the labels, a colour bar and the title. Saved at ``dpi`` (:data:`PNG_DPI` by the
    scripts) the image is round(width * dpi) x round(height * dpi) pixels."""
    cols = min(panels, 4)
    rows = (panels + cols - 1) // cols
    width = max(3.0, cell * src_len + 1.5)
    height = max(2.5, cell * tgt_len + 1.4)
    return width * cols + COLORBAR_WIDTH, height * rows + (TITLE_HEIGHT if title else 0.0)


def attention_figure(
    weights: np.ndarray,
    src_pieces: Sequence[str],
    tgt_pieces: Sequence[str],
    titles: Sequence[str] | None = None,
    cell: float = 0.32,
    title: str | None = None,
) -> Figure:
    """One heatmap panel per (tgt_len, src_len) matrix in ``weights`` (panels, tgt_len, src_len), up
    to four panels a row, with one colour bar for all (weights 0..1).

    Rows are target subwords (what was generated), columns source subwords. The size is
    :func:`attention_figure_size`, so long sentences get bigger pictures instead of unreadable labels.
    The figure is not registered with pyplot: nothing to close, safe in long training runs.
    """
    weights = np.asarray(weights, dtype=np.float32)
    if weights.ndim == 2:
        weights = weights[None]
    panels, tgt_len, src_len = weights.shape
    if (len(src_pieces), len(tgt_pieces)) != (src_len, tgt_len):
        raise ValueError(
            f"{len(tgt_pieces)} x {len(src_pieces)} labels for {tgt_len} x {src_len} attention weights"
        )
    size = attention_figure_size(panels, tgt_len, src_len, cell, title=title is not None)
    fig = Figure(figsize=size, layout="constrained")
    cols = min(panels, 4)
    axes = fig.subplots((panels + cols - 1) // cols, cols, squeeze=False)
    image = None
    for p, ax in enumerate(axes.flat):
        if p >= panels:
            ax.axis("off")
            continue
        image = ax.imshow(
            weights[p], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest"
        )
        ax.set_xticks(range(src_len), labels=list(src_pieces), rotation=90, fontsize=8)
        ax.set_yticks(range(tgt_len), labels=list(tgt_pieces), fontsize=8)
        ax.set_xlabel("source")
        ax.set_ylabel("target")
        if titles is not None:
            ax.set_title(titles[p], fontsize=9)
    fig.colorbar(image, ax=axes.ravel().tolist(), label="attention weight", shrink=0.9)
    if title is not None:
        fig.suptitle(title, fontsize=10)
    return fig


def read_scalars(run_dir: str | Path, tag: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step, minutes since the run's first event, value) of one TensorBoard scalar of a run dir."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(Path(run_dir) / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    if tag not in acc.Tags()["scalars"]:
        return np.array([]), np.array([]), np.array([])
    events = acc.Scalars(tag)
    start = min(e.wall_time for t in acc.Tags()["scalars"] for e in acc.Scalars(t))
    steps = np.array([e.step for e in events])
    minutes = np.array([(e.wall_time - start) / 60 for e in events])
    return steps, minutes, np.array([e.value for e in events])


def curves_figure(runs: dict[str, str | Path]) -> Figure:
    """Training loss and validation BLEU against training time, one line per run (label -> run dir)."""
    fig = Figure(figsize=(10, 3.8))
    loss_ax, bleu_ax = fig.subplots(1, 2)
    for label, run_dir in runs.items():
        _, minutes, loss = read_scalars(run_dir, "train/loss")
        loss_ax.plot(minutes, loss, label=label)
        _, minutes, bleu = read_scalars(run_dir, "valid/bleu")
        bleu_ax.plot(minutes, bleu, marker="o", markersize=3, label=label)
    loss_ax.set(xlabel="training time (minutes)", ylabel="train loss (label-smoothed, per token)")
    bleu_ax.set(xlabel="training time (minutes)", ylabel="validation BLEU (greedy)")
    for ax in (loss_ax, bleu_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig
