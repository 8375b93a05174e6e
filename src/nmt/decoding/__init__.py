"""Greedy and beam search over the :class:`~nmt.models.base.Seq2Seq` interface (knowing no model class).

Both are batched: sentences (and, for beam search, their beams flattened into the batch) advance
together one token per step, with the model's incremental state (the Transformer's key/value cache,
RNNsearch's hidden state). A sentence leaves the batch as soon as it is finished, and decoding stops
when every sentence is. The bookkeeping stays in tensors: the host learns once per step which
sentences are done, and builds the hypotheses at the end.

- :mod:`~nmt.decoding.common`: hypotheses and their score, length budgets, the rules applied to the
  model's next-token log-probabilities at every step, the set-up both searches start from
  (``SearchStart``), padding and length-sorted batches;
- :mod:`~nmt.decoding.greedy`: greedy search;
- :mod:`~nmt.decoding.beam`: beam search, in named steps (its docstring lists them);
- :mod:`~nmt.decoding.decode`: :func:`translate_ids`, many sentences in batches, in input order,
  optionally each forced through a target prefix;
- :mod:`~nmt.decoding.teacher_forcing`: :func:`score_ids`, the model's log-probability of given translations;
- :mod:`~nmt.decoding.interface`: :class:`Backend`, what every way to decode (``backend=``) offers.

Length normalisation is GNMT's (Wu et al., 2016): a finished hypothesis y scores
``log P(y | x) / ((5 + |y|) / 6) ** alpha + word_reward * |y|``, where |y| counts the generated tokens
including EOS; ``alpha = 0`` ranks by plain log-probability. The word reward (Murray and Chiang, 2018;
Marian's negative word penalty) could be added per token during search as well, but every candidate
that a step compares has the same length, so it only matters when finished hypotheses of different
lengths are ranked. Output length is at most ``max_len_a * src_len + max_len_b`` tokens before EOS
(and within the model's positions). ``no_repeat_ngram = n`` bans every token that would repeat an
n-gram of the hypothesis (fairseq's and Hugging Face's ``no_repeat_ngram_size``).
"""

from nmt.decoding.beam import beam_search
from nmt.decoding.common import (
    Hypothesis,
    batch_source_tokens,
    block_repeated_ngrams,
    hypothesis,
    length_penalty,
    length_sorted_batches,
    mask_logits,
    max_lengths,
    pad_batch,
)
from nmt.decoding.decode import search, translate_ids
from nmt.decoding.greedy import greedy_search
from nmt.decoding.interface import Backend, Ids
from nmt.decoding.teacher_forcing import TeacherForcedScore, score_ids

__all__ = [
    "Backend",
    "Ids",
    "TeacherForcedScore",
    "Hypothesis",
    "batch_source_tokens",
    "beam_search",
    "block_repeated_ngrams",
    "greedy_search",
    "hypothesis",
    "length_penalty",
    "length_sorted_batches",
    "mask_logits",
    "max_lengths",
    "pad_batch",
    "score_ids",
    "search",
    "translate_ids",
]
