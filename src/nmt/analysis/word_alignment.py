"""Word alignments from cross-attention, in Pharaoh format (``i-j``: source word i, target word j, from 0).

The decoder's cross-attention of one layer, averaged over its heads, says for each target subword which
source subwords the model read. Two choices turn it into word links, both made by measurement against a
statistical aligner (docs/alignment.md):

- which row belongs to target subword t: the attention while the decoder *predicts* t (row t), or while
  it *reads* t as its input to predict the next one (row t + 1, "shift": Chen et al., 2020, who found
  it closer to the truth in the middle layers of a Transformer);
- how subwords become words: SentencePiece marks the first piece of each word with '▁'. ``mean``
  averages the attention over the pieces of each (target word, source word) cell and links each target
  word to its best source word; ``sum`` sums instead (long source words gain); ``piece`` links the word
  of every target piece to the word of that piece's best source piece (a target word can get several).

The source EOS is never a link: attention that rests on it (a "no-op" for the model) is removed and
each row renormalised over the real source pieces. Each target word gets at least one link, so the
alignment is as dense as the attention and never one-to-many on the source side by design.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.decoding import length_sorted_batches, pad_batch
from nmt.errors import NMTError
from nmt.models.base import Seq2Seq
from nmt.text.special import BOS_ID, PAD_ID

WORD_START = "\u2581"  # SentencePiece's meta symbol for a preceding space
METHODS = ("mean", "sum", "piece")

Link = tuple[int, int]  # (source word, target word)


def resolve_layer(layer: int | None, layers: int) -> int:
    """The decoder layer (from 0) that ``layer`` names: None = the penultimate, which agreed best with a
    statistical aligner (docs/alignment.md), or the only one; negative counts from the last."""
    if layer is None:
        return max(layers - 2, 0)
    if not -layers <= layer < layers:
        raise NMTError(f"alignment_layer={layer} out of range: the model has {layers} decoder layer(s)")
    return layer % layers


def word_ids(pieces: Sequence[str]) -> list[int]:
    """The word (0, 1, ...) of each SentencePiece piece: a piece that starts with '▁' starts a word, so
    that words are the whitespace-separated words of the detokenised text. A first piece without '▁'
    (e.g. ``<unk>``) still starts word 0."""
    ids, word = [], -1
    for i, piece in enumerate(pieces):
        if i == 0 or piece.startswith(WORD_START):
            word += 1
        ids.append(word)
    return ids


def attention_links(
    weights: Tensor, src_pieces: Sequence[str], tgt_pieces: Sequence[str], shift: bool, method: str = "mean"
) -> list[Link]:
    """Word links, sorted, from one layer's head-averaged cross-attention ``weights`` of shape
    (len(tgt_pieces) + 1, len(src_pieces) + 1): rows are the decoder steps that predict each target
    piece and then EOS, columns the source pieces and then EOS. ``shift`` takes for piece t the row of
    the step that reads it (t + 1) instead of the one that predicts it (t)."""
    if method not in METHODS:
        raise NMTError(f"alignment method {method!r}: choose one of {', '.join(METHODS)}")
    n_src, n_tgt = len(src_pieces), len(tgt_pieces)
    if weights.shape != (n_tgt + 1, n_src + 1):
        raise NMTError(
            f"attention of shape {tuple(weights.shape)} for {n_tgt} target and {n_src} source pieces "
            f"(expected ({n_tgt + 1}, {n_src + 1}): each plus EOS)"
        )
    if not n_src or not n_tgt:
        return []
    rows = weights[1:] if shift else weights[:-1]
    rows = rows[:, :n_src].float()
    rows = rows / rows.sum(dim=1, keepdim=True).clamp_min(1e-9)  # without the EOS column
    src_words, tgt_words = torch.tensor(word_ids(src_pieces)), torch.tensor(word_ids(tgt_pieces))
    if method == "piece":
        best = rows.argmax(dim=1)
        return sorted({(int(src_words[s]), int(t)) for s, t in zip(best, tgt_words)})
    cells = torch.zeros(int(tgt_words[-1]) + 1, int(src_words[-1]) + 1)
    cells.index_put_((tgt_words[:, None], src_words[None, :]), rows, accumulate=True)
    if method == "mean":
        tgt_sizes = torch.bincount(tgt_words).float()
        src_sizes = torch.bincount(src_words).float()
        cells /= tgt_sizes[:, None] * src_sizes[None, :]
    return [(int(s), t) for t, s in enumerate(cells.argmax(dim=1))]


@dataclass
class WordAlignment:
    """The links of one sentence pair and the words they index (as the detokenised texts split them)."""

    links: list[Link]
    source_words: list[str]
    target_words: list[str]

    def pharaoh(self) -> str:
        return pharaoh(self.links)


def words(
    ids: Sequence[int], pieces: Sequence[str], decode: Callable[[list[list[int]]], list[str]]
) -> list[str]:
    """The text of each word of a subword sequence (its pieces grouped by :func:`word_ids`)."""
    groups: list[list[int]] = []
    for i, word in zip(ids, word_ids(pieces)):
        if word == len(groups):
            groups.append([])
        groups[word].append(int(i))
    return decode(groups) if groups else []


@torch.no_grad()
def cross_attention_batches(
    model: Seq2Seq, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], max_tokens: int
) -> list[Tensor]:
    """Each pair's teacher-forced cross-attention (layers, heads, len(target) + 1, len(source) + 1) in
    fp32 on the CPU: the decoder reads ``[BOS] + target`` over ``source + [EOS]``, in length-sorted
    batches of about ``max_tokens`` source tokens (right padding changes no real position: the source
    padding is masked and the decoder is causal)."""
    device = next(model.parameters()).device
    out: list[Tensor] = [torch.empty(0)] * len(sources)
    lengths = [len(s) + len(t) + 2 for s, t in zip(sources, targets)]
    for batch in length_sorted_batches(lengths, max_tokens):
        src = pad_batch([sources[i] for i in batch], device)
        width = max(len(targets[i]) for i in batch) + 1
        tgt_in = torch.full((len(batch), width), PAD_ID, dtype=torch.long)
        for row, i in enumerate(batch):
            tgt_in[row, : len(targets[i]) + 1] = torch.tensor([BOS_ID, *targets[i]])
        weights = model.cross_attention(src, tgt_in.to(device)).float().cpu()  # (layers, batch, heads, t, s)
        for row, i in enumerate(batch):
            out[i] = weights[:, row, :, : len(targets[i]) + 1, : len(sources[i]) + 1]
    return out


def pharaoh(links: Iterable[Link]) -> str:
    """``i-j`` pairs separated by spaces (the format of fast_align, eflomal and GIZA++ tools)."""
    return " ".join(f"{i}-{j}" for i, j in links)


def parse_pharaoh(line: str, where: str = "alignment") -> set[Link]:
    """The links of one Pharaoh line; ``where`` names the line in errors."""
    links = set()
    for pair in line.split():
        parts = pair.split("-")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise NMTError(f"{where}: {pair!r} is not a Pharaoh link i-j")
        links.add((int(parts[0]), int(parts[1])))
    return links


def grow_diag_final_and(forward: set[Link], reverse: set[Link]) -> set[Link]:
    """Koehn et al.'s (2003) symmetrisation of two directional alignments: from their intersection, add
    neighbouring (also diagonal) links of their union that align a so far unaligned word, then the links
    of each direction between two unaligned words."""
    union, links = forward | reverse, forward & reverse
    source_done, target_done = {i for i, _ in links}, {j for _, j in links}

    def add(link: Link) -> None:
        links.add(link)
        source_done.add(link[0])
        target_done.add(link[1])

    grew = True
    while grew:
        grew = False
        for i, j in sorted(links):
            for di, dj in ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)):
                link = (i + di, j + dj)
                new_word = link[0] not in source_done or link[1] not in target_done
                if link in union and link not in links and new_word:
                    add(link)
                    grew = True
    for direction in (forward, reverse):
        for i, j in sorted(direction):
            if i not in source_done and j not in target_done:
                add((i, j))
    return links


@dataclass
class AlignmentScores:
    """Agreement of predicted links with reference links, over a corpus."""

    precision: float
    recall: float
    f1: float
    aer: float  # alignment error rate (Och and Ney, 2003); with sure links only it is 1 - F1
    links: int  # predicted
    reference_links: int


def alignment_scores(
    predicted: Sequence[set[Link]], sure: Sequence[set[Link]], possible: Sequence[set[Link]] | None = None
) -> AlignmentScores:
    """Precision, recall and F1 against the ``sure`` links, and AER, which also credits ``possible``
    links (a superset of the sure ones; the sure links alone when not given)."""
    if len(predicted) != len(sure) or (possible is not None and len(possible) != len(sure)):
        raise NMTError(f"{len(predicted)} predicted alignments for {len(sure)} reference alignments")
    possible = possible if possible is not None else sure
    a = sum(len(p) for p in predicted)
    s = sum(len(r) for r in sure)
    a_s = sum(len(p & r) for p, r in zip(predicted, sure))
    a_p = sum(len(p & (r | q)) for p, r, q in zip(predicted, sure, possible))
    precision = a_p / a if a else 0.0
    recall = a_s / s if s else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    aer = 1 - (a_s + a_p) / (a + s) if a + s else 0.0
    return AlignmentScores(precision, recall, f1, aer, a, s)


@dataclass
class Reading:
    """One way of reading word links off the attention, and how well it agrees with a reference."""

    layer: int  # decoder layer, from 0
    shift: bool
    method: str
    scores: AlignmentScores


def compare_readings(
    attentions: Sequence[Tensor],
    src_pieces: Sequence[Sequence[str]],
    tgt_pieces: Sequence[Sequence[str]],
    reference: Sequence[set[Link]],
    possible: Sequence[set[Link]] | None = None,
) -> list[Reading]:
    """Agreement with ``reference`` of every layer x (shift or not) x word method, from each pair's
    cross-attention (layers, heads, target + 1, source + 1), heads averaged."""
    for n, (links, src, tgt) in enumerate(zip(reference, src_pieces, tgt_pieces), start=1):
        words = (word_ids(src)[-1] + 1 if src else 0, word_ids(tgt)[-1] + 1 if tgt else 0)
        outside = [f"{i}-{j}" for i, j in sorted(links) if i >= words[0] or j >= words[1]]
        if outside:
            raise NMTError(
                f"reference line {n}: link {outside[0]} is outside the pair's {words[0]} source and "
                f"{words[1]} target words (whitespace-separated): is it the alignment of these lines?"
            )
    layers = attentions[0].size(0) if attentions else 0
    means = [a.mean(dim=1) for a in attentions]  # (layers, target + 1, source + 1)
    readings = []
    for layer in range(layers):
        for shift in (False, True):
            for method in METHODS:
                predicted = [
                    set(attention_links(m[layer], s, t, shift, method))
                    for m, s, t in zip(means, src_pieces, tgt_pieces)
                ]
                readings.append(
                    Reading(layer, shift, method, alignment_scores(predicted, reference, possible))
                )
    return readings
