"""Training on several corpora at once: each epoch draws its pairs from the corpora by temperature
(Arivazhagan et al., 2019), p_k ~ n_k^(1/T), so small directions are seen more often than their share
of the text (T=1: in proportion; T -> inf: uniform). An epoch holds as many pairs as the corpora
together; a corpus drawn more often than it has pairs repeats them whole, then a random part.
Everything follows from (seed, epoch), like the bilingual sampler: reproducible and resumable."""

from __future__ import annotations

import logging

import numpy as np

from nmt.data.batching import TokenBatchSampler
from nmt.data.corpus import PreparedData

log = logging.getLogger(__name__)


def temperature_shares(sizes: list[int], temperature: float) -> np.ndarray:
    """p_k ~ n_k^(1/T), over the corpora that have pairs."""
    n = np.asarray(sizes, dtype=np.float64)
    weights = np.where(n > 0, n ** (1.0 / temperature), 0.0)
    return weights / weights.sum()


def epoch_counts(sizes: list[int], temperature: float) -> np.ndarray:
    """Pairs drawn from each corpus per epoch: the shares of the corpora's total, rounded."""
    return np.rint(temperature_shares(sizes, temperature) * sum(sizes)).astype(np.int64)


class TemperatureBatchSampler(TokenBatchSampler):
    """:class:`TokenBatchSampler` over each epoch's temperature draw from consecutive corpora of
    ``sizes`` pairs (the prepared training split's groups, in order)."""

    def __init__(self, *args, sizes: list[int], temperature: float, **kwargs):
        super().__init__(*args, **kwargs)
        if sum(sizes) != self.src_lengths.shape[1]:
            raise ValueError(f"corpora of {sum(sizes)} pairs, lengths of {self.src_lengths.shape[1]}")
        self.sizes, self.counts = list(sizes), epoch_counts(sizes, temperature)
        self.starts = np.cumsum([0, *sizes[:-1]])

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        drawn = []
        for start, size, count in zip(self.starts, self.sizes, self.counts):
            if size == 0:
                continue
            whole, rest = divmod(int(count), size)
            drawn += [np.arange(start, start + size)] * whole
            drawn.append(start + rng.choice(size, rest, replace=False))
        return np.concatenate(drawn)


def train_sampler(data: PreparedData, temperature: float, *args, **kwargs) -> TokenBatchSampler:
    """The training sampler: the bilingual one, or a temperature draw over several corpora."""
    if not data.multilingual:
        return TokenBatchSampler(*args, **kwargs)
    sizes = data.group_pairs["train"]
    shares = temperature_shares(sizes, temperature)
    log.info(
        "temperature %g: %s",
        temperature,
        ", ".join(
            f"{s}->{t} {n:,} pairs, drawn {p:.1%}" for (s, t), n, p in zip(data.directions, sizes, shares)
        ),
    )
    return TemperatureBatchSampler(*args, sizes=sizes, temperature=temperature, **kwargs)
