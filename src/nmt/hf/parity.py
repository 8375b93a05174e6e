"""Does the exported folder, loaded by stock ``transformers``, translate as our model does?

Both models get the same source ids (ours). Compared:

- the logits, teacher-forced along our greedy output, in fp32 at every real position: the largest
  absolute difference (the export is wrong above the tolerance);
- greedy search: ours (the checkpoint's decoding settings, beam 1) against ``generate(num_beams=1)``
  with the folder's generation config. Our per-sentence length budget (``max_len_a * src_len +
  max_len_b``) is passed as ``max_length``, for sentences of one source length at a time, so no
  source padding enters either. Where the outputs differ, the margin by which our model preferred its
  token at the first difference says whether it was a near-tie (fp32 rounding decides those);
- the tokenizer: ``AutoTokenizer``'s ids for the source text against ours, and the decoded texts; and
  its ids for texts holding the special pieces' names (``</s>``, ``<unk>``), which are text to ours;
- with references, BLEU and chrF of both outputs (one sacrebleu call each, ``nmt.metrics``).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from nmt.config import DecodingConfig
from nmt.decoding import pad_batch, translate_ids
from nmt.decoding.common import length_budget
from nmt.errors import NMTError
from nmt.metrics import CorpusScore, corpus_scores
from nmt.models.transformer import Transformer
from nmt.text.special import BOS_ID, EOS_ID, PAD_ID
from nmt.text.tags import untagged
from nmt.text.tokenizer import Tokenizer


def require_transformers() -> ModuleType:
    """The ``transformers`` module, or an NMTError saying how to install it."""
    try:
        import transformers
    except ImportError:
        raise NMTError(
            "transformers is not installed: pip install transformers safetensors (the project's [hf] extra)"
        ) from None
    return transformers


@dataclass
class Difference:
    """A sentence whose greedy outputs differ."""

    index: int  # in the checked sentences
    position: int  # the first target position where they differ
    margin: float  # our model's log-probability of its token minus that of transformers' token there


@dataclass
class Parity:
    """What the check found (:func:`check_parity`)."""

    sentences: list[str]
    max_abs_diff: float  # of the fp32 logits, over every real position
    ours: list[str]  # greedy translations: our model, our tokenizer
    theirs: list[str]  # transformers' generate, its tokenizer's decode
    differences: list[Difference]  # sentences whose greedy token ids differ
    tokenizer_mismatches: list[int]  # sentences that AutoTokenizer encodes to other ids than ours
    special_text_mismatches: list[str]  # texts holding "</s>", "<unk>", ... that it encodes otherwise
    text_mismatches: list[int]  # sentences with the same ids whose decoded texts differ
    scores: dict[str, dict[str, CorpusScore]] = field(default_factory=dict)  # "nmt"/"transformers" -> scores

    @property
    def identical(self) -> int:
        """Sentences with the same greedy token ids."""
        return len(self.sentences) - len(self.differences)


def check_parity(
    model: Transformer,
    tokenizer: Tokenizer,
    folder: Path,
    decoding: DecodingConfig,
    sentences: list[str],
    refs: list[str] | None = None,
    batch_sentences: int = 64,
) -> Parity:
    """Load ``folder`` with ``AutoModelForSeq2SeqLM``/``AutoTokenizer`` and compare it with ``model`` on
    ``sentences`` (with ``refs``: their scores too)."""
    hf_model, hf_tokenizer = _load_export(folder)
    model = model.float().eval()
    limit = model.cfg.max_positions - 1
    sources = [ids[:limit] for ids in tokenizer.encode_src(sentences)]
    theirs_ids = hf_tokenizer(sentences, truncation=True).input_ids
    tokenizer_mismatches = [i for i, (a, b) in enumerate(zip(sources, theirs_ids)) if [*a, EOS_ID] != b]
    special_text_mismatches = _special_text_mismatches(tokenizer, hf_tokenizer, sentences)

    greedy = dataclasses.replace(decoding, beam_size=1, nbest=1, shortlist=None)
    ours = [h[0].tokens for h in translate_ids(model, sources, greedy, "cpu", model.cfg.max_positions)]
    theirs = hf_greedy(hf_model, sources, greedy, limit, batch_sentences)

    max_diff, differences = _compare_greedy(model, hf_model, sources, ours, theirs, batch_sentences)

    our_text = tokenizer.decode_tgt(ours)
    their_text = hf_tokenizer.batch_decode(theirs, skip_special_tokens=True)
    text_mismatches = [
        i for i in range(len(sources)) if ours[i] == theirs[i] and our_text[i] != their_text[i]
    ]
    parity = Parity(
        sentences,
        max_diff,
        our_text,
        their_text,
        differences,
        tokenizer_mismatches,
        special_text_mismatches,
        text_mismatches,
    )
    if refs is not None:
        parity.scores = {
            "nmt": corpus_scores(our_text, refs),
            "transformers": corpus_scores(their_text, refs),
        }
    return parity


def _load_export(folder: Path) -> tuple[Any, Any]:
    """The exported folder as ``AutoModelForSeq2SeqLM`` (fp32, eval mode) and ``AutoTokenizer`` load it."""
    transformers = require_transformers()
    hf_model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.float32).eval()
    with (
        warnings.catch_warnings()
    ):  # MarianTokenizer asks for sacremoses, which only its unused normalize needs
        warnings.filterwarnings("ignore", message="Recommended: pip install sacremoses")
        hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return hf_model, hf_tokenizer


def _compare_greedy(
    model: Transformer,
    hf_model: Any,
    sources: list[list[int]],
    ours: list[list[int]],
    theirs: list[list[int]],
    batch_sentences: int,
) -> tuple[float, list[Difference]]:
    """The largest logit difference on our greedy translations, by batches of similar length, and the
    sentences whose greedy ids differ (in input order), each with the margins that explain it."""
    max_diff, differences = 0.0, []
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    for start in range(0, len(order), batch_sentences):
        part = [i for i in order[start : start + batch_sentences] if sources[i]]
        if not part:
            continue
        diff, margins = _compare_logits(model, hf_model, [sources[i] for i in part], [ours[i] for i in part])
        max_diff = max(max_diff, diff)
        for i, log_probs in zip(part, margins):
            if ours[i] != theirs[i]:
                differences.append(_difference(i, ours[i], theirs[i], log_probs))
    differences.sort(key=lambda d: d.index)
    return max_diff, differences


def special_texts(tokenizer: Tokenizer, sentences: list[str]) -> list[str]:
    """Sentences holding the special pieces' names as text (``</s>``, ``<unk>``, ...), alone, between
    words and inside one: a user's text may hold them, and they must be read as text, as ours reads it."""
    names = tokenizer.src_pieces(list(range(min(4, tokenizer.src_vocab_size))))
    word = next((w for s in sentences for w in untagged(s).split()), "a")
    return [text for name in names for text in (name, f"{word} {name} {word}", f"{word}{name}{word}")]


def _special_text_mismatches(tokenizer: Tokenizer, hf_tokenizer, sentences: list[str]) -> list[str]:
    """The texts of :func:`special_texts` that the exported tokenizer encodes (source and target side)
    to other ids than ours."""
    texts = special_texts(tokenizer, sentences)
    sides = (
        (tokenizer.encode_src(texts), hf_tokenizer(texts).input_ids),
        (tokenizer.encode_tgt(texts), hf_tokenizer(text_target=texts).input_ids),
    )
    return list(
        dict.fromkeys(
            t for ours, theirs in sides for t, a, b in zip(texts, ours, theirs) if [*a, EOS_ID] != b
        )
    )


@torch.inference_mode()
def hf_greedy(
    hf_model, sources: list[list[int]], decoding: DecodingConfig, limit: int, batch_sentences: int
) -> list[list[int]]:
    """``generate`` with greedy search on our source ids (EOS appended), sentences of one length at a time
    with that length's budget; an empty source gets an empty output (as ours: it is not decoded)."""
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, ids in enumerate(sources):
        if ids:
            by_length[len(ids)].append(i)
    out: list[list[int]] = [[] for _ in sources]
    for length, indices in sorted(by_length.items()):
        budget = length_budget(length + 1, decoding.max_len_a, decoding.max_len_b, limit)
        for start in range(0, len(indices), batch_sentences):
            part = indices[start : start + batch_sentences]
            src = torch.tensor([[*sources[i], EOS_ID] for i in part])
            found = hf_model.generate(
                input_ids=src,
                attention_mask=torch.ones_like(src),
                num_beams=1,
                do_sample=False,
                max_length=budget + 2,  # BOS, the budget, EOS
            )
            for i, row in zip(part, found.tolist()):
                out[i] = _until_eos(row[1:])
    return out


def _until_eos(ids: list[int]) -> list[int]:
    return ids[: ids.index(EOS_ID)] if EOS_ID in ids else [t for t in ids if t != PAD_ID]


@torch.inference_mode()
def _compare_logits(
    model: Transformer, hf_model, sources: list[list[int]], targets: list[list[int]]
) -> tuple[float, list[torch.Tensor]]:
    """The largest |logit difference| over the real positions of a batch, teacher-forced along
    ``targets``, and our log-probabilities of each sentence (positions, vocab)."""
    src = pad_batch(sources, "cpu")
    width = max(len(t) for t in targets) + 1
    tgt_in = torch.full((len(targets), width), PAD_ID, dtype=torch.long)
    for row, t in enumerate(targets):
        tgt_in[row, : len(t) + 1] = torch.tensor([BOS_ID, *t])
    ours = model(src, tgt_in).float()
    theirs = hf_model(input_ids=src, attention_mask=src.ne(PAD_ID), decoder_input_ids=tgt_in).logits.float()
    real = torch.arange(width)[None, :] <= torch.tensor([len(t) for t in targets])[:, None]
    diff = float((ours - theirs).abs()[real].max())
    log_probs = torch.log_softmax(ours, dim=-1)
    return diff, [log_probs[row, : len(t) + 1] for row, t in enumerate(targets)]


def _difference(index: int, ours: list[int], theirs: list[int], log_probs: torch.Tensor) -> Difference:
    """Where two greedy outputs first differ and how much our model preferred its own token there (at the
    end of the shorter one, the other's next token is EOS)."""
    position = next((p for p, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    mine = ours[position] if position < len(ours) else EOS_ID
    other = theirs[position] if position < len(theirs) else EOS_ID
    margin = float(log_probs[position, mine] - log_probs[position, other])
    return Difference(index, position, margin)


def format_parity(parity: Parity, show: int = 10) -> str:
    """The check as the exporter prints it: every sentence's two translations when there are at most
    ``show``, else the totals and the first ``show`` differences."""
    n = len(parity.sentences)
    lines = [
        f"logits: max |nmt - transformers| = {parity.max_abs_diff:.2e} (fp32, {n} sentences, teacher-forced)",
        f"greedy: identical token ids on {parity.identical} of {n} sentences",
    ]
    if parity.special_text_mismatches:
        lines.append(f"tokenizer: other ids than ours on the texts {parity.special_text_mismatches[:show]}")
    if parity.tokenizer_mismatches:
        lines.append(
            f"tokenizer: other source ids than ours on sentences {parity.tokenizer_mismatches[:show]}"
        )
    if parity.text_mismatches:
        lines.append(f"decoded text differs (same ids) on sentences {parity.text_mismatches[:show]}")
    for d in parity.differences[:show]:
        lines += [
            f"  sentence {d.index}: first difference at target position {d.position}, where nmt preferred "
            f"its token by {d.margin:.2e} in log-probability",
            f"    nmt:          {parity.ours[d.index]}",
            f"    transformers: {parity.theirs[d.index]}",
        ]
    if n <= show:
        for i, source in enumerate(parity.sentences):
            lines += [f"  [{i}] {source}", f"    nmt:          {parity.ours[i]}"]
            lines.append(f"    transformers: {parity.theirs[i]}")
    for system, scores in parity.scores.items():
        for score in scores.values():
            lines.append(f"{system}: {score.text} ({score.signature})")
    return "\n".join(lines)
