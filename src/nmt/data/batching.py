"""Token-budget batching: sentences of similar length go together, so little compute is spent on padding.

Each epoch the examples are sorted by (source, target) length with random tie-breaking, cut greedily
into batches under the token budget, and the batch order is shuffled. Everything follows from
(seed, epoch), which makes the order reproducible, the same on every rank, and resumable mid-epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch

from nmt.data.corpus import EncodedSplit
from nmt.errors import NMTError
from nmt.text.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID


class TokenBatchSampler:
    """Token-based batches from length-sorted buckets, shuffled per epoch from a seed, shardable, resumable.

    The cost of a batch is ``len(batch) * (max src len + 1 + max tgt len + 1)`` (EOS on the source,
    BOS/EOS on the target), i.e. the padded size of ``src`` plus ``tgt_in``; it never exceeds
    ``max_tokens``, except for a single example that is too long on its own, which forms its own batch
    (clip the lengths to the model's ``max_positions - 1`` first, as ``collate`` truncates to that:
    :func:`clipped_lengths`).

    The lengths may have one row per segmentation of the corpus (subword sampling, see
    ``PreparedData.train_segmentations``): epoch e is then batched by row ``e % rows``.

    With ``world_size > 1`` rank r gets batches r, r + world_size, ... of the shuffled epoch. Every rank
    gets the same number, ``total // world_size``: the last ``total % world_size`` batches are dropped
    (they differ every epoch). All ranks must use the same seed.

    Iterating yields the remaining batches of the current epoch, then moves on to the next epoch, so
    repeated ``for`` loops walk through epochs 0, 1, 2, ... ``state_dict()`` counts the batches
    handed out so far; the sampler must be iterated in the process that saves it (no prefetching
    DataLoader in between) for a restored sampler to continue exactly where training stopped.
    """

    def __init__(
        self,
        src_lengths,
        tgt_lengths,
        max_tokens: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        # (segmentations, examples), 4 bytes each: the sampler's memory grows by 8 bytes a pair a segmentation
        self.src_lengths = np.atleast_2d(np.asarray(src_lengths, dtype=np.int32))
        self.tgt_lengths = np.atleast_2d(np.asarray(tgt_lengths, dtype=np.int32))
        if self.src_lengths.shape != self.tgt_lengths.shape:
            raise ValueError("src_lengths and tgt_lengths differ in size")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.position = 0, 0
        self._cache: tuple[int, list[np.ndarray]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of ``epoch``; a no-op for the current epoch, so a restored position survives."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._epoch_batches()
        while self.position < len(batches):
            self.position += 1  # counted before the batch is used: a checkpoint taken after it skips it
            yield batches[self.position - 1].tolist()
        self.set_epoch(self.epoch + 1)

    def __len__(self) -> int:
        """Batches in the current epoch for this rank (a full epoch, whatever the position)."""
        return len(self._epoch_batches())

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def _epoch_batches(self) -> list[np.ndarray]:
        if self._cache is None or self._cache[0] != self.epoch:
            self._cache = (self.epoch, self._make_batches(self.epoch))
        return self._cache[1]

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """The examples of an epoch (each once here; a subclass may draw others, from ``rng``)."""
        return np.arange(n)

    def _make_batches(self, epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch])
        row = epoch % len(self.src_lengths)
        src_lengths, tgt_lengths = self.src_lengths[row], self.tgt_lengths[row]
        examples = self._draw(rng, len(src_lengths))
        keys = (tgt_lengths[examples], src_lengths[examples])
        order = examples[np.lexsort((rng.random(len(examples)), *keys) if self.shuffle else keys)]
        batches = cut_batches(order, src_lengths + 1, tgt_lengths + 1, self.max_tokens)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        usable = len(batches) // self.world_size * self.world_size
        if batches and not usable:  # an epoch without a batch for every rank would never end
            raise NMTError(
                f"the split makes {len(batches)} batch(es) of at most trainer.max_tokens={self.max_tokens} "
                f"tokens, fewer than the {self.world_size} processes that each need one: use fewer "
                "processes or a smaller trainer.max_tokens"
            )
        return batches[self.rank : usable : self.world_size]


def clipped_lengths(split: EncodedSplit, max_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """Source and target lengths as ``collate`` will make them (at most ``max_positions - 1``): what
    the sampler must cost, or batches of over-long sentences stay far below the token budget."""
    keep = max_positions - 1
    return np.minimum(split.src_lengths, keep), np.minimum(split.tgt_lengths, keep)


def cut_batches(
    order: np.ndarray, src_width: np.ndarray, tgt_width: np.ndarray, max_tokens: int
) -> list[np.ndarray]:
    """Greedily cut ``order`` into consecutive batches whose padded size stays within ``max_tokens``.

    A batch starting at example ``j`` can hold at most ``max_tokens // width(j)`` examples, so only that
    window is scanned: the loop runs once per batch, not once per example.
    """
    src_width, tgt_width = src_width[order], tgt_width[order]
    batches, start = [], 0
    while start < len(order):
        window = slice(start, start + max(1, max_tokens // int(src_width[start] + tgt_width[start])))
        widths = np.maximum.accumulate(src_width[window]) + np.maximum.accumulate(tgt_width[window])
        cost = widths * np.arange(1, len(widths) + 1)
        size = max(1, int(np.searchsorted(cost, max_tokens, side="right")))
        batches.append(order[start : start + size])
        start += size
    return batches


# ------------------------------------------------------------------------------------------- tensors


@dataclass
class Batch:
    """Padded tensors of one batch. ``tgt_in`` is what the decoder reads, ``tgt_out`` what it predicts."""

    src: torch.Tensor  # (batch, src_len) ids + EOS, right-padded with PAD_ID
    tgt_in: torch.Tensor  # (batch, tgt_len) BOS + ids, padded
    tgt_out: torch.Tensor  # (batch, tgt_len) ids + EOS, padded
    src_tokens: int  # non-pad tokens in src
    tgt_tokens: int  # non-pad tokens in tgt_out (= in tgt_in): the number of predictions

    def __len__(self) -> int:
        return self.src.size(0)

    @property
    def padding_fraction(self) -> float:
        """Share of pad tokens in src + tgt_in: how much compute batching wastes."""
        total = self.src.numel() + self.tgt_in.numel()
        return 1.0 - (self.src_tokens + self.tgt_tokens) / total

    def to(self, device: torch.device | str) -> Batch:
        return replace(
            self, src=self.src.to(device), tgt_in=self.tgt_in.to(device), tgt_out=self.tgt_out.to(device)
        )


def drop_words(batch: Batch, src_p: float, tgt_p: float) -> Batch:
    """Word dropout: each real token of ``src`` and ``tgt_in`` becomes <unk> with probability ``src_p`` /
    ``tgt_p``, so the model cannot lean on any single input word; ``tgt_out`` (what it must predict)
    stays. Uses torch's random generator, which training seeds and checkpoints."""
    return replace(batch, src=_drop(batch.src, src_p), tgt_in=_drop(batch.tgt_in, tgt_p))


def _drop(ids: torch.Tensor, p: float) -> torch.Tensor:
    if p <= 0:
        return ids
    words = (ids != PAD_ID) & (ids != BOS_ID) & (ids != EOS_ID)
    return ids.masked_fill(words & (torch.rand(ids.shape, device=ids.device) < p), UNK_ID)


def collate(split: EncodedSplit, indices: list[int], max_positions: int) -> Batch:
    """The examples ``indices`` as a Batch; sequences longer than ``max_positions - 1`` are truncated,
    keeping room for EOS/BOS."""
    keep = max_positions - 1
    if keep < 1:
        raise NMTError(f"model.max_positions={max_positions} leaves no room for tokens")
    src = _with_eos([split.src(i)[:keep] for i in indices])
    tgt_out = _with_eos([split.tgt(i)[:keep] for i in indices])
    tgt_in = np.empty_like(tgt_out)
    tgt_in[:, 0] = BOS_ID
    tgt_in[:, 1:] = np.where(tgt_out[:, :-1] == EOS_ID, PAD_ID, tgt_out[:, :-1])
    return Batch(
        src=torch.from_numpy(src),
        tgt_in=torch.from_numpy(tgt_in),
        tgt_out=torch.from_numpy(tgt_out),
        src_tokens=int((src != PAD_ID).sum()),
        tgt_tokens=int((tgt_out != PAD_ID).sum()),
    )


def _with_eos(seqs: list[np.ndarray]) -> np.ndarray:
    """Rows of ids + EOS, right-padded: shape (len(seqs), longest + 1), int64."""
    out = np.full((len(seqs), max(len(s) for s in seqs) + 1), PAD_ID, dtype=np.int64)
    for row, seq in zip(out, seqs):
        row[: len(seq)] = seq
        row[len(seq)] = EOS_ID
    return out
