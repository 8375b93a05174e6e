"""Our SentencePiece model(s) as the files of transformers' ``MarianTokenizer``, which any model class can
use (``"tokenizer_class"`` in ``tokenizer_config.json``).

``MarianTokenizer`` segments with ``source.spm`` (inputs) and ``target.spm`` (``text_target``,
decoding) and maps the pieces to ids with ``vocab.json`` (and ``target_vocab.json`` with
``separate_vocabs``): the pieces written in id order give our ids exactly (pad 0, unk 1, bos 2, eos 3).
A joint model is copied to both names. Like ours, it appends EOS to the source and adds no BOS, and
reads the special tokens' text in a sentence (``</s>``) as text (``split_special_tokens``).
"""

from __future__ import annotations

import json
from pathlib import Path

from sentencepiece import sentencepiece_model_pb2

from nmt.text.special import EOS_ID, PAD_ID, UNK_ID
from nmt.text.tokenizer import Tokenizer


def _vocab(pieces: list[str]) -> dict[str, int]:
    return {piece: i for i, piece in enumerate(pieces)}


def write_tokenizer(
    tokenizer: Tokenizer, folder: Path, direction: tuple[str, str], max_positions: int
) -> None:
    """Write ``source.spm``, ``target.spm``, the vocabularies and ``tokenizer_config.json`` to ``folder``."""
    src, tgt = tokenizer.protos
    (folder / "source.spm").write_bytes(_text_only(src))
    (folder / "target.spm").write_bytes(_text_only(tgt if tgt is not None else src))
    src_pieces = tokenizer.src_pieces(list(range(tokenizer.src_vocab_size)))
    _write_json(folder / "vocab.json", _vocab(src_pieces))
    separate = not tokenizer.joint
    if separate:
        tgt_pieces = tokenizer.tgt_pieces(list(range(tokenizer.tgt_vocab_size)))
        _write_json(folder / "target_vocab.json", _vocab(tgt_pieces))
    _write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "MarianTokenizer",
            "source_lang": direction[0],
            "target_lang": direction[1],
            "separate_vocabs": separate,
            "unk_token": src_pieces[UNK_ID],
            "eos_token": src_pieces[EOS_ID],
            "pad_token": src_pieces[PAD_ID],
            "model_max_length": max_positions,  # tokens with EOS; longer sources are cut to it by ours
            # the text "</s>", "<unk>" or "<pad>" in a sentence is text, segmented as ours segments it
            "split_special_tokens": True,
            "sp_model_kwargs": {"emit_unk_piece": True},  # with _text_only: unknown text is <unk>
        },
    )


def _text_only(proto: bytes) -> bytes:
    """The SentencePiece model with its control pieces (``<pad>``, ``<s>``, ``</s>``) renamed so that no
    text matches them (a space, which SentencePiece reads as ``▁``). SentencePiece gives the text
    ``</s>`` its control piece's name with the unknown id; ``MarianTokenizer`` maps pieces to ids by
    name, and would give EOS. Renamed, such text is unknown, which ``emit_unk_piece`` names ``<unk>``:
    our ids. The ids and the vocabularies, which name the pieces, are unchanged."""
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(proto)
    for piece in model.pieces:
        if piece.type == sentencepiece_model_pb2.ModelProto.SentencePiece.CONTROL:
            piece.piece += " (control)"
    return model.SerializeToString()


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
