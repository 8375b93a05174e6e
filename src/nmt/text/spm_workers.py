"""The work of preparing a corpus that runs in other processes: SentencePiece encoding of text chunks,
and SentencePiece training.

Kept apart from the rest of the package, importing nothing of it and no torch, so that what a worker
loads is what it needs (a spawned process also imports the main script's own imports). A chunk travels
as the gzip member that holds it in the prepared text (a few hundred kB), and comes back as one flat
array of ids and one of lengths: never as Python lists, which cost ~36 bytes an id.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import resource
import signal
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

# Set in each worker by init_encoder: the SentencePiece processors by language.
_PROCESSORS: dict[str, spm.SentencePieceProcessor] = {}


def ids_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned type that holds every id: uint16 up to 65,536 entries, as fairseq does."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def init_encoder(models: dict[str, str]) -> None:
    """Load the SentencePiece model file of each language (once per worker). Paths, not the models: a
    spawned worker reads its arguments only after it has started, and a parent writing more than a
    pipe holds (64 kB; a model is hundreds) to a worker that died starting would wait for ever."""
    _PROCESSORS.clear()
    for lang, path in models.items():
        _PROCESSORS[lang] = spm.SentencePieceProcessor(model_file=path)


def encode_chunk(task: tuple[str, bytes, float, int | None]) -> tuple[np.ndarray, np.ndarray]:
    """``(lang, gzip'd lines, alpha, seed)`` -> (flat ids, lengths): the best segmentation when seed is
    None, else a sampled one seeded with ``seed`` (SentencePiece 0.2's sampling still differs from one
    process to the next with the same seed: the sampled copies are made once and cached)."""
    lang, member, alpha, seed = task
    lines = gzip.decompress(member).decode("utf-8").split("\n")[:-1]
    return encode_lines(_PROCESSORS[lang], lines, alpha, seed)


def encode_lines(
    sp: spm.SentencePieceProcessor, lines: list[str], alpha: float = 0.0, seed: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    if seed is None:
        ids = encode_best(sp, lines)
    else:
        spm.set_random_generator_seed(seed)
        ids = sp.encode(lines, out_type=int, enable_sampling=True, alpha=alpha, nbest_size=-1, num_threads=1)
        ids = tags_first(sp, ids)
    lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
    dtype = ids_dtype(sp.get_piece_size())
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
    return flat, lengths


def encode_best(sp: spm.SentencePieceProcessor, lines: list[str], threads: int = 1) -> list[list[int]]:
    """The best segmentation of each line, a leading tag first (:func:`tags_first`)."""
    return tags_first(sp, sp.encode(list(lines), out_type=int, num_threads=threads))


def tags_first(sp: spm.SentencePieceProcessor, ids: list[list[int]]) -> list[list[int]]:
    """SentencePiece writes its word-start mark as a piece of its own before a user-defined piece that
    opens a line (``>>de<< A`` -> ``▁ >>de<< ▁A``); Marian's tokenizer, and so a ``transformers`` export,
    starts such a line with the tag (``>>de<< ▁A``). The mark is dropped there, so both read one sequence."""
    tags = user_defined_ids(sp)
    if not tags:
        return ids
    mark = sp.piece_to_id("\u2581")
    return [seq[1:] if len(seq) > 1 and seq[0] == mark and seq[1] in tags else seq for seq in ids]


@functools.lru_cache(maxsize=16)
def user_defined_ids(sp: spm.SentencePieceProcessor) -> frozenset[int]:
    """The ids of the model's user-defined pieces: a multilingual model's target-language tags."""
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(sp.serialized_model_proto())
    kind = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
    return frozenset(i for i, piece in enumerate(proto.pieces) if piece.type == kind)


def text_lines(paths: list[Path]) -> Iterator[str]:
    """The lines of each file in turn (plain or gzip'd), without their newline."""
    for path in paths:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8", newline="\n") as f:
            for line in f:
                yield line[:-1] if line.endswith("\n") else line


def train_sentencepiece(options: dict, paths: list[Path]) -> tuple[bytes, dict]:
    """A SentencePiece model trained on the lines of ``paths``, and the trainer's own cost (seconds,
    peak resident memory of this process). Run in a process of its own, so that its peak, bounded by
    ``input_sentence_size``, is measured apart from the preparation's."""
    import io

    started = time.perf_counter()
    spm.set_random_generator_seed(options.pop("seed"))
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=text_lines(paths), model_writer=writer, **options)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports kB
    return writer.getvalue(), {"seconds": time.perf_counter() - started, "peak_rss_bytes": peak}


def run_and_send(sender: Connection, fn: Callable[..., object], args: tuple) -> None:
    """A process's whole work: ``(True, fn(*args))`` sent back, or ``(False, "Type: message")``. It ignores
    Ctrl-C, which reaches the whole process group: the parent, which hears it too, terminates it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = (True, fn(*args))
    except Exception as e:  # sent back whole: the parent turns it into one line
        result = (False, f"{type(e).__name__}: {e}")
    sender.send(result)
    sender.close()
