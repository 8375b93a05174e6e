"""Pictures: attention heatmaps (source subwords x target subwords) and training curves."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def attention_figure(
    weights: np.ndarray,
    src_pieces: Sequence[str],
    tgt_pieces: Sequence[str],
    titles: Sequence[str] | None = None,
    cell: float = 0.32,
) -> Figure:
    """One heatmap panel per (tgt_len, src_len) matrix in ``weights`` (panels, tgt_len, src_len).

    Rows are target subwords (what was generated), columns source subwords; colour is the weight.
    """
    weights = np.asarray(weights, dtype=np.float32)
    if weights.ndim == 2:
        weights = weights[None]
    panels, tgt_len, src_len = weights.shape
    cols = min(panels, 4)
    rows = (panels + cols - 1) // cols
    width = max(3.0, cell * src_len + 1.5)
    height = max(2.5, cell * tgt_len + 1.2)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for p, ax in enumerate(axes.flat):
        if p >= panels:
            ax.axis("off")
            continue
        ax.imshow(weights[p], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        ax.set_xticks(range(src_len), labels=list(src_pieces), rotation=90, fontsize=8)
        ax.set_yticks(range(tgt_len), labels=list(tgt_pieces), fontsize=8)
        ax.set_xlabel("source")
        ax.set_ylabel("target")
        if titles is not None:
            ax.set_title(titles[p], fontsize=9)
    fig.tight_layout()
    return fig
