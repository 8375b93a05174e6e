"""Vocabulary shortlists (Sockeye's lexical shortlists, Marian's ``--shortlist``): the target subwords
worth scoring for a sentence, so that search projects the decoder state onto a few hundred output
embeddings instead of the whole vocabulary.

A shortlist holds, for every source subword, its ``k`` likeliest target subwords, and the
``frequent`` most frequent target subwords plus the special ids, which are candidates for every
sentence. The likelihood is p(t | s) from sentence-level co-occurrence in the training corpus: the
share of the training pairs whose source holds s that also hold t in the target. The frequent
subwords are candidates anyway, so the k places of a source subword go to other target subwords.
The candidates of a batch are the union of its sentences' candidates (:meth:`Shortlist.select`): all
four special ids are in, so their positions in the sorted candidate list are their ids, 0 to 3.

Stored as JSON (``shortlist.k{k}.n{frequent}.json`` beside the checkpoint) with a format version, the
tokenizer's fingerprint and the direction it was built for (the source and target languages: a joint
tokenizer serves both directions, a shortlist only one), all checked when loaded, and what it was
built from (the checkpoint and the corpus), for people to read; :func:`write_vmap` writes the same shortlist
as a CTranslate2 vocabulary map (``vmap.txt``, CTranslate2's ``use_vmap``), which
``scripts/export_ct2.py shortlist=FILE`` puts into the exported model. The builder, which reads the
training corpus, is :mod:`nmt.tooling.shortlist_builder`: the search reads this table and knows no data
pipeline.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from nmt.cache import atomic_write_text
from nmt.errors import NMTError
from nmt.text.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt.text.tokenizer import Tokenizer

FORMAT = "nmt-shortlist"
FORMAT_VERSION = 2  # 2: the direction and what it was built from are recorded
SPECIALS = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)


@dataclass
class Shortlist:
    """Candidate target subwords per source subword (ids of the tokenizer with ``tokenizer_fingerprint``)."""

    k: int
    frequent: int
    tokenizer_fingerprint: str
    tgt_vocab_size: int
    always: list[int]  # the special ids and the ``frequent`` most frequent target subwords, ascending
    candidates: list[list[int]]  # per source id: up to k target ids not in ``always``, likeliest first
    pairs: int  # training pairs the statistics come from
    src_lang: str  # the direction it was built for: candidates of tgt_lang subwords for src_lang subwords
    tgt_lang: str
    built_from: dict[str, str]  # what it was built from (checkpoint, corpus): shown, never checked

    def select(self, sources: Iterable[Sequence[int]]) -> list[int]:
        """The sorted union of the candidates of every token of ``sources`` and ``always``: the target
        ids a batch of these sources is decoded over."""
        chosen = set(self.always)
        for source in sources:
            for token in set(source):
                chosen.update(self.candidates[token])
        return sorted(chosen)

    @cached_property
    def table(self) -> torch.Tensor:
        """(source vocabulary, longest candidate list) target ids: row s holds ``candidates[s]``, padded
        with PAD (a special id, a candidate of every batch anyway); search gathers its batches' rows."""
        width = max(1, max(map(len, self.candidates), default=0))
        table = torch.full((len(self.candidates), width), PAD_ID, dtype=torch.long)
        for s, targets in enumerate(self.candidates):
            table[s, : len(targets)] = torch.tensor(targets, dtype=torch.long)
        return table

    def filename(self) -> str:
        return shortlist_filename(self.k, self.frequent)

    def save(self, path: Path) -> None:
        atomic_write_text(
            Path(path), json.dumps({"format": FORMAT, "version": FORMAT_VERSION, **asdict(self)})
        )


def shortlist_filename(k: int, frequent: int) -> str:
    return f"shortlist.k{k}.n{frequent}.json"


def load_shortlist(path: Path, tokenizer: Tokenizer, direction: tuple[str, str]) -> Shortlist:
    """Read a shortlist, refusing (in one line) another format, another version (a version 1 file records
    no direction: it is refused, to be built again), another tokenizer or another ``direction``
    (source and target language) than the model's."""
    path = Path(path)
    if not path.is_file():
        raise NMTError(f"shortlist not found: {path}; build it with scripts/build_shortlist.py")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NMTError(f"{path}: not a shortlist (not JSON: {e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise NMTError(f"{path}: not a shortlist (no format {FORMAT!r})")
    if data.get("version") != FORMAT_VERSION:
        why = ", which records no direction" if data.get("version") == 1 else ""
        raise NMTError(
            f"{path}: shortlist format version {data.get('version')}{why}, this nmt reads version "
            f"{FORMAT_VERSION}; build it again with scripts/build_shortlist.py"
        )
    missing = [key for key in Shortlist.__dataclass_fields__ if key not in data]
    if missing:
        raise NMTError(
            f"{path}: not a shortlist (no {missing[0]!r}); build it again with scripts/build_shortlist.py"
        )
    if data["tokenizer_fingerprint"] != tokenizer.fingerprint:
        raise NMTError(
            f"{path} was built for another tokenizer (fingerprint {data['tokenizer_fingerprint']}) than "
            f"the model's ({tokenizer.fingerprint}); build it again with scripts/build_shortlist.py"
        )
    if (data["src_lang"], data["tgt_lang"]) != tuple(direction):
        raise NMTError(
            f"{path} was built for {data['src_lang']}->{data['tgt_lang']}, the model translates "
            f"{direction[0]}->{direction[1]}; build one for this model with scripts/build_shortlist.py"
        )
    if len(data["candidates"]) != tokenizer.src_vocab_size:
        raise NMTError(
            f"{path}: {len(data['candidates'])} source entries for a vocabulary of {tokenizer.src_vocab_size}"
        )
    return Shortlist(**{key: data[key] for key in Shortlist.__dataclass_fields__})


def write_vmap(shortlist: Shortlist, tokenizer: Tokenizer, path: Path) -> None:
    """The shortlist as a CTranslate2 vocabulary map: a line ``<source piece>\\t<target pieces>`` (space
    separated) per source subword with candidates, after a line with the empty source, whose targets
    CTranslate2 adds to every batch (``always``). CTranslate2 reads it from ``vmap.txt`` in the model
    directory and uses it with ``translate_batch(..., use_vmap=True)``."""
    if shortlist.tokenizer_fingerprint != tokenizer.fingerprint:
        raise NMTError(
            f"the shortlist was built for another tokenizer (fingerprint {shortlist.tokenizer_fingerprint}) "
            f"than this one ({tokenizer.fingerprint})"
        )
    src_pieces = tokenizer.src_pieces(range(tokenizer.src_vocab_size))
    tgt_pieces = tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size))
    for piece in {src_pieces[s] for s, c in enumerate(shortlist.candidates) if c} | set(tgt_pieces):
        if not piece or any(sep in piece for sep in " \t\n"):
            raise NMTError(
                f"subword {piece!r} is empty or holds a separator: a vocabulary map cannot list it"
            )
    lines = ["\t" + " ".join(tgt_pieces[t] for t in shortlist.always)]
    lines += [
        src_pieces[s] + "\t" + " ".join(tgt_pieces[t] for t in targets)
        for s, targets in enumerate(shortlist.candidates)
        if targets
    ]
    atomic_write_text(Path(path), "".join(line + "\n" for line in lines))


@dataclass
class Coverage:
    """How a shortlist fits sentences it was not built from: what each sentence is decoded over, and
    how much of its reference that holds (a reference subword outside cannot be produced)."""

    sentences: int
    mean_candidates: float  # target ids per sentence (a batch decodes over the union of its sentences')
    covered: float  # share of the reference subwords among their sentence's candidates


def coverage(
    shortlist: Shortlist, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
) -> Coverage:
    sizes, covered, total = [], 0, 0
    for source, target in zip(sources, targets):
        chosen = set(shortlist.select([source]))
        sizes.append(len(chosen))
        covered += sum(t in chosen for t in target)
        total += len(target)
    return Coverage(len(sizes), float(np.mean(sizes)) if sizes else 0.0, covered / total if total else 1.0)
