"""Data pipeline: sources -> cleaning -> SentencePiece -> cached ids -> token-budget batches."""

from nmt.data.batching import Batch, TokenBatchSampler, clipped_lengths, collate, drop_words
from nmt.data.clean import clean_pairs
from nmt.data.corpus import (
    EncodedSplit,
    PreparedData,
    format_summary,
    prepare_corpus,
    prepare_ids,
    prepare_text,
    read_text,
    text_path,
)
from nmt.data.sources import SPLITS, describe_source, load_source, pin_source, read_lines

__all__ = [
    "SPLITS",
    "Batch",
    "EncodedSplit",
    "PreparedData",
    "TokenBatchSampler",
    "clean_pairs",
    "describe_source",
    "pin_source",
    "clipped_lengths",
    "collate",
    "drop_words",
    "format_summary",
    "load_source",
    "prepare_corpus",
    "prepare_ids",
    "prepare_text",
    "read_lines",
    "read_text",
    "text_path",
]
