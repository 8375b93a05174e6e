"""SentencePiece subword models: training (cached by config and data), encoding, decoding.

The special ids (``nmt.text.special``) are fixed for the whole project; SentencePiece is trained with them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import re
import signal
from functools import cached_property
from pathlib import Path

import sentencepiece as spm
import torch
from sentencepiece import sentencepiece_model_pb2

from nmt.cache import atomic_dir, config_dict, file_digest
from nmt.config import TokenizerConfig
from nmt.devices import usable_cores
from nmt.errors import NMTError
from nmt.text.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt.text.spm_workers import encode_best, run_and_send, train_sentencepiece, user_defined_ids

SAMPLING_KEYS = ("sampling_alpha", "sampled_copies")  # how the training split is re-segmented, not the model

log = logging.getLogger(__name__)


class Tokenizer:
    """SentencePiece model(s) for source and target; joint = one model for both."""

    def __init__(self, src_model: bytes, tgt_model: bytes | None = None):
        self._protos = (src_model, tgt_model)
        self.joint = tgt_model is None
        self._src = spm.SentencePieceProcessor(model_proto=src_model)
        self._tgt = self._src if self.joint else spm.SentencePieceProcessor(model_proto=tgt_model)
        for sp in (self._src, self._tgt):
            _check_special_ids(sp)
        self.src_vocab_size: int = self._src.get_piece_size()
        self.tgt_vocab_size: int = self._tgt.get_piece_size()

    @cached_property
    def fingerprint(self) -> str:
        """Hash of what the model protos encode with: encoded data cached under it is valid exactly for
        this tokenizer. Where its training text was cached and how many threads trained it are left
        out, so the same vocabulary trained again from a text cached elsewhere (another run, the
        data's files touched) is the same tokenizer, for ensembles, shortlists and exports alike."""
        h = hashlib.sha1(_encoding_spec(self._protos[0]))
        h.update(_encoding_spec(self._protos[1]) if self._protos[1] else b"joint")
        if user_defined_ids(self._src):  # tags: a leading one is encoded first (spm_workers.tags_first)
            h.update(b"tags-first")
        return h.hexdigest()[:12]

    @property
    def src_processor(self) -> spm.SentencePieceProcessor:
        return self._src

    @property
    def tgt_processor(self) -> spm.SentencePieceProcessor:
        return self._tgt

    @cached_property
    def src_alphabet(self) -> frozenset[str]:
        """The characters the source pieces are spelled with: any other character of an input becomes
        <unk> (the training text had none of it, or too little for ``character_coverage``)."""
        sp = self._src
        return frozenset(
            "".join(
                sp.id_to_piece(i)
                for i in range(sp.get_piece_size())
                if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i))
            ).replace("\u2581", "")
        )

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        return _encode(self._src, texts)

    def encode_tgt(self, texts: list[str]) -> list[list[int]]:
        return _encode(self._tgt, texts)

    def decode_src(self, ids: list[list[int]]) -> list[str]:
        return [self._src.decode(_strip_specials(seq)) for seq in ids]

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        """Decode model output: padding and BOS are ignored, everything from the first EOS is cut."""
        return [self._tgt.decode(_strip_specials(seq)) for seq in ids]

    def src_pieces(self, ids: list[int]) -> list[str]:
        return [self._src.id_to_piece(int(i)) for i in ids]

    def tgt_pieces(self, ids: list[int]) -> list[str]:
        return [self._tgt.id_to_piece(int(i)) for i in ids]

    @property
    def protos(self) -> tuple[bytes, bytes | None]:
        """The serialized SentencePiece model(s): source, and target (None when joint)."""
        return self._protos

    def state_dict(self) -> dict:
        """The models as uint8 tensors, for checkpoints: ``torch.load(weights_only=True)`` of torch 2.4
        refuses ``bytes``."""
        return {
            key: None if p is None else torch.frombuffer(bytearray(p), dtype=torch.uint8)
            for key, p in zip(("src", "tgt"), self._protos)
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> Tokenizer:
        """From :meth:`state_dict`, or the ``bytes`` that older checkpoints hold."""
        src, tgt = (
            p.numpy().tobytes() if isinstance(p, torch.Tensor) else p for p in (state["src"], state["tgt"])
        )
        return cls(src, tgt)


def _encode(sp: spm.SentencePieceProcessor, texts: list[str]) -> list[list[int]]:
    return encode_best(sp, texts, _threads())


def _strip_specials(ids: list[int]) -> list[int]:
    out = []
    for i in ids:
        i = int(i)
        if i == EOS_ID:
            break
        if i not in (PAD_ID, BOS_ID):
            out.append(i)
    return out


def _check_special_ids(sp: spm.SentencePieceProcessor) -> None:
    found = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if found != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise NMTError(f"SentencePiece model has special ids pad/unk/bos/eos = {found}, expected 0/1/2/3")


def _encoding_spec(proto: bytes) -> bytes:
    """A SentencePiece model proto without the trainer settings that describe the training run, not
    the encoding (the input paths, threads, the output prefix)."""
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(proto)
    for name in ("input", "input_format", "model_prefix", "num_threads"):
        model.trainer_spec.ClearField(name)
    return model.SerializeToString(deterministic=True)


def _threads() -> int:
    return min(8, usable_cores())


# ------------------------------------------------------------------------------------------ training


def train_tokenizer(
    cfg: TokenizerConfig,
    src_texts_path: Path,
    tgt_texts_path: Path,
    out_dir: Path,
    user_symbols: tuple[str, ...] = (),
) -> Tokenizer:
    """Train (or reuse) SentencePiece on the training text, cached in ``out_dir/tokenizer-<hash>/``.

    The hash covers the tokenizer config and the content of the text files, so a second run with the
    same settings and data loads the model instead of retraining. A joint model is trained on both
    files in a fixed (sorted) order, so en->de and de->en share it. ``user_symbols`` (a multilingual
    corpus's target-language tags) are pieces of their own, never split; none: the settings and the
    cache key of a bilingual tokenizer are those of before tags existed.
    """
    src_texts_path, tgt_texts_path = Path(src_texts_path), Path(tgt_texts_path)
    settings = {key: v for key, v in config_dict(cfg).items() if key not in SAMPLING_KEYS}
    if user_symbols:
        settings["user_defined_symbols"] = list(user_symbols)
    inputs = (
        sorted([src_texts_path, tgt_texts_path]) if settings["joint"] else [src_texts_path, tgt_texts_path]
    )
    key = _cache_key(settings, inputs)
    cache = Path(out_dir) / f"tokenizer-{key}"
    names = ["joint.model"] if settings["joint"] else ["src.model", "tgt.model"]
    if not cache.is_dir():
        log.info(
            "training SentencePiece (%s, vocab %d) -> %s",
            settings["model_type"],
            settings["vocab_size"],
            cache,
        )
        files = [inputs] if settings["joint"] else [[p] for p in inputs]
        trained = [_train(settings, f) for f in files]
        with atomic_dir(cache) as tmp:
            for name, (proto, _) in zip(names, trained):
                (tmp / name).write_bytes(proto)
            (tmp / "config.json").write_text(json.dumps(settings, indent=2) + "\n")
            (tmp / "trainer.json").write_text(json.dumps([cost for _, cost in trained], indent=2) + "\n")
    return Tokenizer(*[(cache / name).read_bytes() for name in names])


def _cache_key(settings: dict, inputs: list[Path]) -> str:
    digests = [file_digest(p) for p in inputs]
    blob = json.dumps({"tokenizer": settings, "data": digests, "spm": spm.__version__}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def _train(settings: dict, inputs: list[Path]) -> tuple[bytes, dict]:
    """Train in a process of its own (nmt.text.spm_workers.train_sentencepiece): its memory, bounded by
    ``input_sentence_size``, is given back when it ends, and its time and peak are logged apart."""
    if settings["model_type"] not in ("bpe", "unigram"):
        raise NMTError(f"tokenizer.model_type={settings['model_type']!r}: expected 'bpe' or 'unigram'")
    options = {
        "seed": settings["seed"],
        "model_type": settings["model_type"],
        "vocab_size": settings["vocab_size"],
        "character_coverage": settings["character_coverage"],
        "input_sentence_size": settings["input_sentence_size"],
        "shuffle_input_sentence": True,
        "pad_id": PAD_ID,
        "unk_id": UNK_ID,
        "bos_id": BOS_ID,
        "eos_id": EOS_ID,
        "num_threads": _threads(),
        "minloglevel": 2,
    }
    if settings.get("user_defined_symbols"):
        options["user_defined_symbols"] = settings["user_defined_symbols"]
    proto, cost = _run_trainer(options, inputs, settings)
    log.info(
        "SentencePiece trainer: %.1f s, peak %.2f GB in its own process (bounded by "
        "tokenizer.input_sentence_size=%d sentences)",
        cost["seconds"],
        cost["peak_rss_bytes"] / 1e9,
        settings["input_sentence_size"],
    )
    return proto, cost


def _run_trainer(options: dict, inputs: list[Path], settings: dict) -> tuple[bytes, dict]:
    """``train_sentencepiece`` in a spawned process. Ctrl-C (any exception here) terminates it at once:
    the trainer runs in C++ and would not see the signal before it finished. A process that dies
    without an answer (the OOM killer) is one line, as is an error it reports."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(
        target=run_and_send, args=(sender, train_sentencepiece, (options, inputs)), daemon=True
    )
    process.start()
    sender.close()  # the child's end: when the child is gone, recv() ends
    try:
        ok, result = receiver.recv()
    except EOFError:
        process.join()
        raise _trainer_died(process.exitcode, settings) from None
    except BaseException:
        process.terminate()
        process.join()
        raise
    finally:
        receiver.close()
    process.join()
    if not ok:
        raise _training_error(result, settings, inputs)
    return result


def _trainer_died(exitcode: int | None, settings: dict) -> NMTError:
    what = "the SentencePiece trainer's process ended without an answer"
    if exitcode == -signal.SIGKILL:
        return NMTError(
            f"{what} (killed, signal 9): most likely for memory; lower tokenizer.input_sentence_size "
            f"(now {settings['input_sentence_size']}) and run again"
        )
    return NMTError(f"{what} (exit code {exitcode}); what it printed is above")


def _training_error(message: str, settings: dict, inputs: list[Path]) -> NMTError:
    where = ", ".join(str(p) for p in inputs)
    limit = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", message)
    if limit:
        return NMTError(
            f"{where}: the training text supports at most {limit.group(2)} subwords, but "
            f"tokenizer.vocab_size={limit.group(1)}; lower tokenizer.vocab_size to <= {limit.group(2)}"
        )
    return NMTError(f"{where}: SentencePiece training failed: {message}")
