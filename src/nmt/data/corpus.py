"""Prepare a corpus once, reuse it on every later run: cleaned text, tokenizer, encoded ids.

Layout under ``{cache_dir}/{name}/``::

    text-<data hash>/                  one folder per data setting (source, files, sizes, cleaning)
        meta.json                      the settings, the counts of kept/dropped pairs, the chunks of train
        train.{lang}.gz                cleaned training text of BOTH languages, one sentence per line, as
                                       gzip members of whole chunks (the unit the workers encode)
        {valid,test}.{lang}            cleaned text, plain
        tokenizer-<hash>/              SentencePiece model(s), see nmt.text.tokenizer.train_tokenizer (none
                                       for a fine-tune: its parent's tokenizer encodes the text)
        ids-<tokenizer fingerprint>/   {split}.{lang}.ids.npy (uint16 up to 65,536 subwords, else uint32)
                                       + .offsets.npy (int64, one more than the sentences)
        samples-<fingerprint>-<hash>/  train{k}.{lang}.*.npy: sampled segmentations of the training
                                       split (tokenizer.sampling_alpha > 0), one per k < sampled_copies

The corpus streams through: it is read, cleaned and written a chunk at a time, SentencePiece trains on
a sample bounded by ``tokenizer.input_sentence_size`` in a process of its own, and ``data.workers``
processes encode the chunks, whose ids go to disk as they come. Memory stays near a chunk per process
whatever the size of the corpus; the ids equal those of one process encoding everything at once.

The data hash ignores the translation direction, so en->de and de->en share the text (and, with a
joint tokenizer, the encoded ids too). Each folder is written atomically and never modified, so its
existence means it is complete; changed settings simply get a new folder.
"""

from __future__ import annotations

import collections
import json
import logging
import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nmt.cache import atomic_dir, config_dict, hash_key, preparing
from nmt.config import DataConfig, TokenizerConfig
from nmt.data.clean import REASONS, clean_chunk, log_dropped
from nmt.data.sources import (
    SPLITS,
    cache_key,
    grouped_chunks,
    held_out_key,
    read_lines,
    removes_held_out,
    resolve_source,
    source_directions,
    source_tagger,
    source_tags,
)
from nmt.data.writers import EncodedWriter, PlainTextWriter, TrainTextWriter
from nmt.devices import usable_cores
from nmt.errors import NMTError
from nmt.progress import progress_bar
from nmt.text.spm_workers import encode_chunk, encode_lines, ids_dtype, init_encoder, text_lines
from nmt.text.tokenizer import Tokenizer, train_tokenizer

log = logging.getLogger(__name__)

TEXT_VERSION = 3  # 2: plain training text and int32 ids; 1 dropped empty valid/test pairs


class EncodedSplit:
    """Token ids (no BOS/EOS) of one split as flat arrays plus offsets: opening a memory-mapped split
    costs nothing, whatever its size; the lengths cost 4 bytes a sentence a side."""

    def __init__(
        self, src_ids: np.ndarray, src_offsets: np.ndarray, tgt_ids: np.ndarray, tgt_offsets: np.ndarray
    ):
        if len(src_offsets) != len(tgt_offsets):
            raise ValueError("source and target have different numbers of sentences")
        self._src_ids, self._src_offsets = src_ids, src_offsets
        self._tgt_ids, self._tgt_offsets = tgt_ids, tgt_offsets
        self.src_lengths: np.ndarray = np.diff(src_offsets).astype(np.int32)
        self.tgt_lengths: np.ndarray = np.diff(tgt_offsets).astype(np.int32)

    @classmethod
    def load(cls, folder: Path, split: str, src_lang: str, tgt_lang: str, pairs: int) -> EncodedSplit:
        """The split's arrays, memory-mapped, checked for what a copy cut short or a full disk leaves:
        a file numpy cannot map, offsets that do not end at the number of ids, or another number of
        sentences than ``pairs`` (meta.json's). One line naming the folder to delete."""

        def arrays(lang: str) -> tuple[np.ndarray, np.ndarray]:
            loaded = []
            for kind in ("ids", "offsets"):
                path = folder / f"{split}.{lang}.{kind}.npy"
                try:
                    loaded.append(np.load(path, mmap_mode="r"))
                except (OSError, ValueError, EOFError) as e:
                    raise _damaged(folder, f"{path.name}: {e}") from None
            ids, offsets = loaded
            name = f"{split}.{lang}"
            if offsets.ndim != 1 or len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(ids):
                end = offsets[-1] if offsets.ndim == 1 and len(offsets) else None
                raise _damaged(folder, f"{name}: offsets end at {end}, the ids hold {len(ids)}")
            if len(offsets) - 1 != pairs:
                raise _damaged(folder, f"{name}: {len(offsets) - 1} sentences, meta.json counts {pairs}")
            return ids, offsets

        return cls(*arrays(src_lang), *arrays(tgt_lang))

    def __len__(self) -> int:
        return len(self.src_lengths)

    def flat_ids(self, side: str) -> np.ndarray:
        """Every sentence's ids of one side ("src" or "tgt"), back to back."""
        return self._src_ids if side == "src" else self._tgt_ids

    def src(self, i: int) -> np.ndarray:
        return self._src_ids[self._src_offsets[i] : self._src_offsets[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self._tgt_ids[self._tgt_offsets[i] : self._tgt_offsets[i + 1]]


def _damaged(folder: Path, why: str) -> NMTError:
    return NMTError(
        f"{folder}: prepared data damaged ({why}), as an interrupted copy or a full disk leaves it; "
        "delete this folder and run again to prepare it anew"
    )


@dataclass
class PreparedData:
    root: Path  # the text-<hash> folder
    tokenizer: Tokenizer
    splits: dict[str, EncodedSplit]  # "train", "valid", "test"
    summary: dict  # pairs per split, dropped per reason, vocab size, tokens per split, mean lengths
    src_lang: str
    tgt_lang: str
    train_copies: list[EncodedSplit] = field(default_factory=list)  # sampled segmentations of "train"
    directions: list[tuple[str, str]] = field(default_factory=list)  # several corpora's, in group order
    group_pairs: dict[str, list[int]] = field(default_factory=dict)  # split -> pairs of each, in order

    @property
    def multilingual(self) -> bool:
        """Several corpora, tagged (a bilingual corpus has no groups)."""
        return bool(self.directions)

    def group_ranges(self, split: str) -> list[range]:
        """The pairs of each corpus in ``split``: consecutive, in the order of :attr:`directions`."""
        ends = np.cumsum([0, *self.group_pairs[split]])
        return [range(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:])]

    @property
    def train_segmentations(self) -> list[EncodedSplit]:
        """What the epochs train on in turn (epoch e: item e % len): the sampled copies, or the one best
        segmentation when subword sampling is off. Same sentences in the same order in each."""
        return self.train_copies or [self.splits["train"]]

    def raw(self, split: str) -> tuple[list[str], list[str]]:
        """Cleaned source and reference text, in corpus order (the references for BLEU)."""
        return read_text(self.root, split, self.src_lang), read_text(self.root, split, self.tgt_lang)


def text_path(root: Path, split: str, lang: str) -> Path:
    """The cleaned text of one side of a split in a prepared text folder."""
    return root / (f"train.{lang}.gz" if split == "train" else f"{split}.{lang}")


def read_text(root: Path, split: str, lang: str) -> list[str]:
    """One side of a prepared split, whole (the training split of a large corpus is big: stream it
    with nmt.text.spm_workers.text_lines instead)."""
    path = text_path(root, split, lang)
    return list(text_lines([path])) if split == "train" else read_lines(path)


def prepare_corpus(
    data_cfg: DataConfig, tok_cfg: TokenizerConfig, progress: bool = True, tokenizer: Tokenizer | None = None
) -> PreparedData:
    """Text, tokenizer and encoded ids for ``data_cfg.src_lang -> data_cfg.tgt_lang``, from the cache
    when present (seconds), otherwise built and cached. ``tokenizer`` (a fine-tune's, its parent's)
    encodes the text instead of one trained on it: the ids are cached under its fingerprint."""
    src, tgt = data_cfg.src_lang, data_cfg.tgt_lang
    if src == tgt:
        raise NMTError(f"data.src_lang and data.tgt_lang are both {src!r}")
    workers = data_workers(data_cfg)
    with preparing(Path(data_cfg.cache_dir) / data_cfg.name):  # jobs of a sweep prepare it once
        root = _cleaned_text(data_cfg, progress)
        if tokenizer is None:
            tokenizer = train_tokenizer(
                tok_cfg,
                text_path(root, "train", src),
                text_path(root, "train", tgt),
                root,
                **({"user_symbols": tags} if (tags := source_tags(data_cfg)) else {}),  # none: bilingual
            )
        ids_dir = _encode(root, tokenizer, src, tgt, workers, progress)
        copies = (
            _sample_train(root, tokenizer, tok_cfg, src, tgt, workers, progress)
            if tok_cfg.sampling_alpha > 0
            else []
        )
    meta = json.loads((root / "meta.json").read_text())
    splits = _load_splits(ids_dir, meta, src, tgt)
    summary = _summary(data_cfg, root, tokenizer, splits, meta, copies)
    groups = {split: list(n) for split, n in meta.get("group_pairs", {}).items()}
    directions = [tuple(d) for d in meta.get("directions", [])]
    return PreparedData(root, tokenizer, splits, summary, src, tgt, copies, directions, groups)


def prepare_ids(data_cfg: DataConfig, tokenizer: Tokenizer, progress: bool = True) -> dict[str, EncodedSplit]:
    """Every split encoded with ``tokenizer`` (a checkpoint's), memory-mapped: the ids a training run on
    this corpus prepared (cached under the tokenizer's fingerprint), else encoded once and cached."""
    src, tgt = data_cfg.src_lang, data_cfg.tgt_lang
    with preparing(Path(data_cfg.cache_dir) / data_cfg.name):
        root = _cleaned_text(data_cfg, progress)
        ids_dir = _encode(root, tokenizer, src, tgt, data_workers(data_cfg), progress)
    return _load_splits(ids_dir, json.loads((root / "meta.json").read_text()), src, tgt)


def _load_splits(ids_dir: Path, meta: dict, src: str, tgt: str) -> dict[str, EncodedSplit]:
    return {split: EncodedSplit.load(ids_dir, split, src, tgt, meta["pairs"][split]) for split in SPLITS}


def data_workers(cfg: DataConfig) -> int:
    """``data.workers``, 0 meaning one per CPU core this process may use."""
    if cfg.workers:
        return cfg.workers
    return usable_cores()


# ----------------------------------------------------------------------------------------------- text


def _text_settings(cfg: DataConfig, version: int = TEXT_VERSION) -> dict:
    """Everything that changes the cleaned text (the source's rule: :func:`nmt.data.sources.cache_key`);
    not the direction, nor where the cache lives, nor how many processes make it."""
    settings = config_dict(cfg)
    for key in ("name", "cache_dir", "src_lang", "tgt_lang", "workers"):
        settings.pop(key, None)
    settings["langs"] = sorted([cfg.src_lang, cfg.tgt_lang])
    settings["text_version"] = version
    if removes_held_out(cfg):  # a corpus prepared before this was done is not the same text
        settings["held_out_removed"] = True
    return cache_key(cfg, settings)


def prepare_text(cfg: DataConfig, progress: bool = True) -> Path:
    """Only the cleaned text (no tokenizer): what evaluation needs for its sources and references, and
    the first part of :func:`prepare_corpus`. Cached; jobs of a sweep prepare it once."""
    with preparing(Path(cfg.cache_dir) / cfg.name):
        return _cleaned_text(cfg, progress)


def _cleaned_text(cfg: DataConfig, progress: bool) -> Path:
    name, cfg = cfg.name, resolve_source(cfg)
    folder = Path(cfg.cache_dir) / name
    root = folder / f"text-{hash_key(_text_settings(cfg))}"
    if root.is_dir():
        return root
    older = folder / f"text-{hash_key(_text_settings(cfg, version=2))}"
    if older.is_dir():
        log.warning(
            "%s was prepared by an older version (plain training text, int32 ids): preparing the corpus "
            "again as %s (the old folder can be deleted)",
            older,
            root,
        )
    log.info("reading %s data -> %s", cfg.source, root)
    langs = tuple(sorted([cfg.src_lang, cfg.tgt_lang]))
    meta: dict = {"config": _text_settings(cfg), "pairs": {}, "dropped": {}}
    with atomic_dir(root) as tmp:
        # valid and test pairs, kept out of training (None: the source's splits may share pairs)
        held_out: set[tuple[str, str]] | None = set() if removes_held_out(cfg) else None
        groups = {}
        for split in ("valid", "test", "train"):  # held-out pairs first
            meta["pairs"][split], meta["dropped"][split], chunks, groups[split] = _write_split(
                cfg, split, langs, tmp, progress, held_out
            )
            if split == "train":
                meta["train_chunks"] = chunks
        if source_tagger(cfg) is not None:  # several corpora: the pairs of each, in order
            meta["directions"] = source_directions(cfg)
            meta["group_pairs"] = {split: _padded(groups[split], len(meta["directions"])) for split in SPLITS}
        meta["pairs"] = {split: meta["pairs"][split] for split in SPLITS}
        meta["dropped"] = {split: meta["dropped"][split] for split in SPLITS}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return root


def _padded(counts: list[int], n: int) -> list[int]:
    """Pairs per corpus, a corpus with none of a split counted as 0."""
    return counts + [0] * (n - len(counts))


def _write_split(
    cfg: DataConfig, split: str, langs: tuple[str, str], folder: Path, progress: bool, held_out: set | None
) -> tuple[int, dict[str, int], dict, list[int]]:
    """Clean the split's chunks as they are read and write them: (kept pairs, dropped per reason,
    the gzip members of the training text, kept pairs per corpus). Valid and test pairs are added to
    ``held_out``; training pairs found there are dropped (reason ``in_valid_test``), whatever the
    source. Several corpora's source lines get their tags here, once clean."""
    train = split == "train"
    dropped = dict.fromkeys(REASONS + (("in_valid_test",) if train and held_out is not None else ()), 0)
    writer = TrainTextWriter(folder, langs) if train else PlainTextWriter(folder, split, langs)
    order = (cfg.src_lang, cfg.tgt_lang)
    key, tag_lines = held_out_key(cfg), source_tagger(cfg)
    groups: collections.Counter[int] = collections.Counter()
    with (
        writer,
        progress_bar(desc=f"reading {split}", unit=" pairs", disable=not progress, leave=False) as bar,
    ):
        for group, (src, tgt) in grouped_chunks(cfg, split):
            kept_src, kept_tgt, chunk_dropped = clean_chunk(src, tgt, cfg.clean, train)
            if held_out is None:
                pass
            elif not train:
                held_out.update(k for pair in zip(kept_src, kept_tgt) for k in key(*pair))
            elif held_out:
                kept = [p for p in zip(kept_src, kept_tgt) if not any(k in held_out for k in key(*p))]
                chunk_dropped["in_valid_test"] = len(kept_src) - len(kept)
                kept_src, kept_tgt = [a for a, _ in kept], [b for _, b in kept]
            if tag_lines is not None:
                kept_src = tag_lines(group, kept_src)
            writer.add(dict(zip(order, (kept_src, kept_tgt))))
            groups[group] += len(kept_src)
            for reason, n in chunk_dropped.items():
                dropped[reason] += n
            bar.update(len(src))
    log_dropped(split, writer.pairs, dropped)
    if train and writer.pairs == 0:
        why = ", ".join(f"{n} {reason}" for reason, n in dropped.items() if n) or "the source gave none"
        raise NMTError(f"data ({cfg.source}): no training pair is left to train on (dropped: {why})")
    return writer.pairs, dropped, writer.chunks(), [groups[g] for g in range(max(groups, default=-1) + 1)]


# ----------------------------------------------------------------------------------------------- ids


def _encode(root: Path, tokenizer: Tokenizer, src: str, tgt: str, workers: int, progress: bool) -> Path:
    folder = root / f"ids-{tokenizer.fingerprint}"
    if folder.is_dir():
        return folder
    log.info("encoding with up to %d process%s -> %s", workers, "es" * (workers > 1), folder)
    with atomic_dir(folder) as tmp:
        _encode_train(root, tmp, "train", _protos(tokenizer, src, tgt), workers, progress)
        for split in ("valid", "test"):
            for lang in (src, tgt):
                flat, lengths = encode_lines(_processor(tokenizer, lang, src), read_text(root, split, lang))
                writer = EncodedWriter(tmp, f"{split}.{lang}", flat.dtype)
                writer.add(flat, lengths)
                writer.close()
    return folder


def _protos(tokenizer: Tokenizer, src: str, tgt: str) -> dict[str, bytes]:
    src_proto, tgt_proto = tokenizer.protos
    return {src: src_proto, tgt: tgt_proto or src_proto}


def _processor(tokenizer: Tokenizer, lang: str, src: str) -> Any:
    return tokenizer.src_processor if lang == src else tokenizer.tgt_processor


def _encode_train(
    root: Path,
    out: Path,
    name: str,
    protos: dict[str, bytes],
    workers: int,
    progress: bool,
    alpha: float = 0.0,
    seed: int | None = None,
) -> None:
    """Encode every chunk of the training text (sampled from ``seed`` when given) into
    ``{name}.{lang}.ids.npy`` and ``.offsets.npy``, in corpus order, as the results come."""
    chunks = json.loads((root / "meta.json").read_text())["train_chunks"]
    langs = list(protos)
    vocab = {lang: _vocab_size(proto) for lang, proto in protos.items()}

    def tasks() -> Iterator[tuple[str, bytes, float, int | None]]:
        files = {lang: open(text_path(root, "train", lang), "rb") for lang in langs}  # noqa: SIM115
        try:
            for c in range(len(chunks["pairs"])):
                for lang in langs:
                    start, end = chunks["offsets"][lang][c : c + 2]
                    files[lang].seek(start)
                    yield (
                        lang,
                        files[lang].read(end - start),
                        alpha,
                        None if seed is None else chunk_seed(seed, c),
                    )
        finally:
            for f in files.values():
                f.close()

    writers = {lang: EncodedWriter(out, f"{name}.{lang}", ids_dtype(vocab[lang])) for lang in langs}
    total = 2 * len(chunks["pairs"])
    models = {lang: out / f".{name}.{lang}.model" for lang in langs}  # what the workers load, removed after
    for lang, path in models.items():
        path.write_bytes(protos[lang])
    stage = f"encoding {name}" + (" (sampled segmentations)" if seed is not None else "")
    # More processes than chunks only cost their start (a second or two each): a toy corpus is encoded here.
    results = ordered_map(
        encode_chunk,
        tasks(),
        min(workers, len(chunks["pairs"])),
        init_encoder,
        ({lang: str(path) for lang, path in models.items()},),
        stage,
    )
    with progress_bar(
        total=total, desc=f"encoding {name}", unit=" chunks", disable=not progress, leave=False
    ) as bar:
        for i, (flat, lengths) in enumerate(results):
            writers[langs[i % 2]].add(flat, lengths)
            bar.update()
    for writer in writers.values():
        writer.close()
    for path in models.values():
        path.unlink()


def chunk_seed(seed: int, chunk: int) -> int:
    """The sampling seed of one chunk: ``seed`` for the first, then distinct per chunk (32 bits, as
    SentencePiece takes them)."""
    return (seed + chunk * 1_000_003) % (1 << 32)


def _vocab_size(proto: bytes) -> int:
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(proto)
    return len(model.pieces)


def ordered_map(
    fn: Callable[[Any], Any],
    tasks: Iterable[Any],
    workers: int,
    init: Callable[..., None],
    initargs: tuple,
    stage: str,
) -> Iterator[Any]:
    """``map(fn, tasks)`` in ``workers`` processes, results in task order; at most two tasks per worker
    in flight, so memory stays bounded however many tasks there are. One worker runs here. A worker
    that dies (killed, out of memory) fails the map in one line naming ``stage``; ``initargs`` must be
    small (paths, not data), or the start of a worker that dies at once would hang."""
    if workers <= 1:
        init(*initargs)
        yield from map(fn, tasks)
        return
    # spawn: nothing of this process (torch's threads, open files) is inherited, and the workers import
    # only nmt.text.spm_workers.
    context = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(workers, mp_context=context, initializer=init, initargs=initargs) as pool:
            pending: collections.deque = collections.deque()
            try:
                for task in tasks:
                    pending.append(pool.submit(fn, task))
                    if len(pending) >= 2 * workers:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:
                for future in pending:
                    future.cancel()
    except BrokenProcessPool:
        raise NMTError(
            f"{stage}: a worker process died (killed, most likely for memory); nothing was cached: set "
            f"data.workers lower than {workers} (each holds a chunk and the SentencePiece models) or free "
            "memory, then run again"
        ) from None


def _sample_train(
    root: Path, tokenizer: Tokenizer, cfg: TokenizerConfig, src: str, tgt: str, workers: int, progress: bool
) -> list[EncodedSplit]:
    """``cfg.sampled_copies`` sampled segmentations of the training split, made once and cached: copy k
    of chunk c is seeded with :func:`chunk_seed` (``cfg.seed + k``, c). SentencePiece's sampling is not
    reproducible across processes from its seed (sentencepiece 0.2.3: the same seed gives other draws
    in another process), so a run trains on the copies in its cache, and another cache holds others."""
    settings = {"alpha": cfg.sampling_alpha, "copies": cfg.sampled_copies, "seed": cfg.seed}
    folder = root / f"samples-{tokenizer.fingerprint}-{hash_key(settings)}"
    if not folder.is_dir():
        log.info(
            "sampling %d segmentations of train (alpha %g) -> %s",
            cfg.sampled_copies,
            cfg.sampling_alpha,
            folder,
        )
        with atomic_dir(folder) as tmp:
            for k in range(cfg.sampled_copies):
                _encode_train(
                    root,
                    tmp,
                    f"train{k}",
                    _protos(tokenizer, src, tgt),
                    workers,
                    progress,
                    cfg.sampling_alpha,
                    cfg.seed + k,
                )
    pairs = json.loads((root / "meta.json").read_text())["pairs"]["train"]
    return [EncodedSplit.load(folder, f"train{k}", src, tgt, pairs) for k in range(cfg.sampled_copies)]


# -------------------------------------------------------------------------------------------- summary


def _summary(
    cfg: DataConfig,
    root: Path,
    tokenizer: Tokenizer,
    splits: dict[str, EncodedSplit],
    meta: dict,
    copies: list[EncodedSplit],
) -> dict:
    def mean(lengths: np.ndarray) -> float:
        return float(lengths.mean()) if len(lengths) else 0.0

    by_direction = {  # several corpora: the pairs of each per split
        f"{s}-{t}": {split: meta["group_pairs"][split][i] for split in SPLITS}
        for i, (s, t) in enumerate(meta.get("directions", []))
    }
    return {
        **({"directions": by_direction} if by_direction else {}),
        "name": cfg.name,
        "root": str(root),
        "direction": [cfg.src_lang, cfg.tgt_lang],
        "joint": tokenizer.joint,
        "vocab_size": {"src": tokenizer.src_vocab_size, "tgt": tokenizer.tgt_vocab_size},
        "pairs": {split: len(s) for split, s in splits.items()},
        "dropped": meta["dropped"],
        "tokens": {
            split: {"src": int(s.src_lengths.sum()), "tgt": int(s.tgt_lengths.sum())}
            for split, s in splits.items()
        },
        "mean_length": {
            split: {"src": mean(s.src_lengths), "tgt": mean(s.tgt_lengths)} for split, s in splits.items()
        },
        "sampled_copies": {
            "copies": len(copies),
            "tokens": sum(int(c.src_lengths.sum() + c.tgt_lengths.sum()) for c in copies)
            // max(len(copies), 1),
        },
    }


def format_summary(summary: dict) -> str:
    """One screen: where the corpus is, the vocabulary, and per split pairs, subword tokens and drops."""
    src, tgt = summary["direction"]
    vocab = summary["vocab_size"]
    vocab_text = (
        f"joint, {vocab['src']}" if summary["joint"] else f"{vocab['src']} (src) / {vocab['tgt']} (tgt)"
    )
    lines = [
        f"corpus   {summary['name']}  {src} -> {tgt}   ({summary['root']})",
        f"vocab    {vocab_text} subwords",
        "",
        f"{'split':<6} {'pairs':>9} {'src tokens':>12} {'tgt tokens':>12} {'src len':>8} {'tgt len':>8}"
        "  dropped",
    ]
    for split, pairs in summary["pairs"].items():
        tokens, mean = summary["tokens"][split], summary["mean_length"][split]
        dropped = summary["dropped"][split]
        details = ", ".join(f"{reason} {n:,}" for reason, n in dropped.items() if n)
        drop_text = f"{sum(dropped.values()):,}" + (f" ({details})" if details else "")
        lines.append(
            f"{split:<6} {pairs:>9,} {tokens['src']:>12,} {tokens['tgt']:>12,} "
            f"{mean['src']:>8.1f} {mean['tgt']:>8.1f}  {drop_text}"
        )
    for direction, pairs in summary.get("directions", {}).items():
        counts = ", ".join(f"{split} {n:,}" for split, n in pairs.items())
        lines.append(f"  {direction.replace('-', '->'):<12} {counts}")
    sampled = summary["sampled_copies"]
    if sampled["copies"]:
        best = summary["tokens"]["train"]["src"] + summary["tokens"]["train"]["tgt"]
        lines.append(
            f"train is also segmented {sampled['copies']} times by sampling (tokenizer.sampling_alpha): "
            f"{sampled['tokens'] / max(best, 1) - 1:+.0%} tokens per copy"
        )
    return "\n".join(lines)
