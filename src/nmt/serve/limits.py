"""What one request may cost, checked before the cost is paid: the body's size (from Content-Length,
then while it streams in), its media type, how deeply its JSON nests, how long its translations may
get, how much memory their search may keep and how large its answer may grow. A request over a limit
gets a 4xx naming what is over it.

The checks are on cheap upper bounds (the declared length, the bytes read so far, the output budget
``max_len_a * src_len + max_len_b``), so a hostile request costs at most the limit, never its own size.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

from nmt.config import DecodingConfig, ServerLimits
from nmt.errors import NMTError

# The request is {"text": [...], ...}: two levels. Deeper JSON is refused before it is parsed, so the
# parser's recursion (and its RecursionError past ~1000 levels) is never reached.
MAX_JSON_DEPTH = 8
# JSON text per attention weight: "0.1234, " and the brackets around each row.
BYTES_PER_WEIGHT = 8
# Scoring holds, per target token, the logits over the target vocabulary and their log-softmax (fp32).
BYTES_PER_LOG_PROB = 8
_JSON_SYNTAX = re.compile(rb'["\\\[\]{}]')


class BadRequest(Exception):
    """A request refused with ``status``, naming the ``field`` at fault."""

    def __init__(self, status: int, field: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.field, self.message, self.headers = status, field, message, headers

    def body(self) -> dict[str, str]:
        return {"error": f"{self.field}: {self.message}", "field": self.field}


def check_content_type(header: str | None) -> None:
    """Only ``application/json`` (UTF-8) bodies: a browser sends a form or text/plain to any site
    without asking first (no CORS preflight), but not JSON, so other pages cannot make a visitor's
    browser use the service."""
    media_type, *params = [part.strip().lower() for part in (header or "").split(";")]
    if media_type != "application/json":
        raise BadRequest(415, "content-type", f"{header or 'none'}; send the body as application/json")
    for param in params:
        name, _, value = param.partition("=")
        if name.strip() == "charset" and value.strip().strip('"') not in ("utf-8", "utf8"):
            raise BadRequest(415, "content-type", f"{header}; JSON is read as UTF-8")


def declared_length(header: str | None, max_bytes: int) -> int | None:
    """The body's Content-Length (None when it is not given, e.g. chunked); 413 beyond ``max_bytes``."""
    if header is None:
        return None
    if not header.strip().isdigit():
        raise BadRequest(400, "content-length", f"{header!r} is not a number of bytes")
    length = int(header)
    if length > max_bytes:
        raise BadRequest(413, "body", f"{length} bytes; at most {max_bytes} per request (serve.max_body_kb)")
    return length


async def read_body(chunks: AsyncIterator[bytes], max_bytes: int, timeout_s: float) -> bytes:
    """The body from its chunks (``request.stream()``), refused with 413 as soon as it passes
    ``max_bytes`` (at most ``max_bytes`` plus one chunk is ever held), and with 408 when it has not all
    come within ``timeout_s`` (``serve.timeout_s``): a body sent slowly, or never finished, holds its
    connection no longer. The 408 closes the connection, whose unread rest cannot be told from a next
    request."""
    try:
        return await asyncio.wait_for(read_chunks(chunks, max_bytes), timeout_s)
    except asyncio.TimeoutError:
        message = f"not received within serve.timeout_s={timeout_s:g} s; send the whole body at once"
        raise BadRequest(408, "body", message, {"Connection": "close"}) from None


async def read_chunks(chunks: AsyncIterator[bytes], max_bytes: int) -> bytes:
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > max_bytes:
            raise BadRequest(
                413, "body", f"over {max_bytes} bytes; at most that per request (serve.max_body_kb)"
            )
    return bytes(body)


def json_depth(body: bytes) -> int:
    """How deeply the JSON in ``body`` nests (0 for a scalar), counting brackets outside strings; a
    linear scan over the syntax characters only."""
    depth = deepest = 0
    in_string, skip = False, -1
    for match in _JSON_SYNTAX.finditer(body):
        char, at = match.group(), match.start()
        if at == skip:  # the character after a backslash inside a string
            continue
        if in_string:
            if char == b"\\":
                skip = at + 1
            elif char == b'"':
                in_string = False
        elif char == b'"':
            in_string = True
        elif char in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif char in (b"]", b"}"):
            depth -= 1
    return deepest


def check_depth(body: bytes) -> None:
    if (depth := json_depth(body)) > MAX_JSON_DEPTH:
        raise BadRequest(
            400, "body", f"JSON nested {depth} levels deep; a request nests at most {MAX_JSON_DEPTH}"
        )


def check_text(lines: Sequence[str], field: str = "text") -> None:
    """Text that can be encoded: JSON's ``\\ud800`` escapes can make a lone surrogate, which no UTF-8
    (and so no tokenizer) can represent."""
    for i, line in enumerate(lines):
        try:
            line.encode("utf-8")
        except UnicodeEncodeError as e:
            raise BadRequest(
                422, f"{field}.{i}", f"a lone surrogate at character {e.start} is not text"
            ) from None


def output_budget(src_len: int, decoding: DecodingConfig, model_limit: int) -> float:
    """The most target subwords the search may produce for a source of ``src_len`` subwords (and EOS):
    ``max_len_a * (src_len + 1) + max_len_b``, and never more than the model's ``model_limit`` (also for
    values too large for a float: 1e308 * 2, 10**400)."""
    if decoding.max_len_b >= model_limit:
        return model_limit
    return min(model_limit, decoding.max_len_a * (src_len + 1) + decoding.max_len_b)


def check_output_length(
    lengths: Sequence[int], decoding: DecodingConfig, limits: ServerLimits, model_limit: int, asked: set[str]
) -> None:
    """Refuse (422) settings under which a sentence of the request (``lengths``: source subwords) could
    get more than ``serve.max_output_tokens`` target subwords. The error names the option the request
    set (``asked``), or its text when only the server's defaults apply."""
    if not lengths:
        return
    longest = max(lengths)
    budget = output_budget(longest, decoding, model_limit)
    if budget <= limits.max_output_tokens:
        return
    limit = limits.max_output_tokens
    field = next((name for name in ("max_len_a", "max_len_b") if name in asked), "text")
    if field == "text":
        message = f"a sentence of {longest} subwords may be translated into {budget:.0f}"
    else:
        b = decoding.max_len_b
        b = b if b < 10**15 else f"a {len(str(b))}-digit number"
        message = f"max_len_a={decoding.max_len_a:g}, max_len_b={b} allow {budget:.0f}"
        message += f" target subwords for a sentence of {longest}"
    raise BadRequest(422, field, f"{message}; the server makes at most {limit} (serve.max_output_tokens)")


def check_search_memory(
    sizes: Sequence[int],
    lengths: Sequence[int],
    decoding: DecodingConfig,
    limits: ServerLimits,
    asked: set[str],
) -> None:
    """Refuse (422) a request with a sentence whose search alone would keep more than
    ``serve.max_search_mb`` (``sizes``: each sentence's decoding state, ``Translator.search_bytes``;
    ``lengths``: its source subwords). Within that, the search's batches are cut to fit: the batcher
    joins requests, and a worker searches a request's sentences, only as many at a time as fit
    together. The error names the option the request set (``asked``), or its text."""
    if not sizes:
        return
    worst = max(range(len(sizes)), key=sizes.__getitem__)
    if sizes[worst] <= limits.max_search_mb * 2**20:
        return
    field = next((name for name in ("beam_size", "max_len_a", "max_len_b") if name in asked), "text")
    raise BadRequest(
        422,
        field,
        f"searching a sentence of {lengths[worst]} subwords with beam_size={decoding.beam_size} keeps "
        f"{sizes[worst] / 2**20:.1f} MB, over serve.max_search_mb={limits.max_search_mb:g}; ask for a "
        "smaller beam_size or max_len_b, or send shorter sentences",
    )


def search_groups(sizes: Sequence[int], max_bytes: float) -> list[list[int]]:
    """Indices of ``sizes`` (each sentence's search state) in groups searched together, each within
    ``max_bytes`` (a sentence over it alone: a group of its own); similar sizes (lengths) together, so
    that the groups pad little. One group when all fit."""
    groups: list[list[int]] = [[]]
    total = 0
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        if groups[-1] and total + sizes[i] > max_bytes:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += sizes[i]
    return groups if groups[0] else []


def check_scores(decoding: DecodingConfig, limits: ServerLimits) -> None:
    """Refuse (422) a length penalty or word reward whose scores would not be finite numbers for some
    output length the server allows (GNMT's ((5 + |y|) / 6) ** alpha overflows for a large alpha)."""
    length = limits.max_output_tokens + 1  # EOS counts
    try:
        penalty = ((5.0 + length) / 6.0) ** decoding.alpha
    except OverflowError:
        penalty = math.inf
    if not math.isfinite(penalty):
        raise BadRequest(422, "alpha", f"{decoding.alpha:g} overflows the length penalty; use a smaller one")
    if not math.isfinite(decoding.word_reward * length):
        raise BadRequest(422, "word_reward", f"{decoding.word_reward:g} makes scores that are not finite")


def attention_bytes(
    lengths: Sequence[int], decoding: DecodingConfig, model_limit: int, layers: int, heads: int
) -> float:
    """An upper bound on the JSON size of the attention weights of ``lengths`` sources: per sentence,
    layers x heads x (output budget + EOS) x (source + EOS) weights."""
    return sum(
        layers * heads * (output_budget(n, decoding, model_limit) + 1) * (n + 1) * BYTES_PER_WEIGHT
        for n in lengths
        if n
    )


def check_attention_size(
    lengths: Sequence[int],
    decoding: DecodingConfig,
    limits: ServerLimits,
    model_limit: int,
    model: dict[str, Any],
) -> None:
    """Refuse (422) attention that could make the answer larger than ``serve.max_response_mb``, before
    any of it is computed (``model``: the model's settings, for its decoder layers and heads)."""
    layers, heads = int(model.get("decoder_layers", 1)), int(model.get("heads", 1))
    size = attention_bytes(lengths, decoding, model_limit, layers, heads)
    if size > limits.max_response_mb * 2**20:
        raise BadRequest(
            422,
            "attention",
            f"the weights of {len(lengths)} sentence(s) could take {size / 2**20:.1f} MB, over "
            f"serve.max_response_mb={limits.max_response_mb:g}; ask for attention on fewer or shorter "
            "sentences",
        )


def score_batch_tokens(limits: ServerLimits, vocab: int, max_tokens: int) -> int:
    """Tokens per ``/score`` batch: ``max_tokens`` (``decoding.max_tokens``), or fewer, so that the batch's
    log-probabilities (tokens x ``vocab`` target subwords) stay within ``serve.max_score_mb`` however
    many sentences the batched requests bring."""
    fits = int(limits.max_score_mb * 2**20 // (vocab * BYTES_PER_LOG_PROB))
    return max(1, min(max_tokens, fits))


def check_score_memory(limits: ServerLimits, vocab: int, model_limit: int) -> None:
    """Refuse (NMTError, at start) a ``serve.max_score_mb`` too small to score one translation of the
    longest the model emits (``model_limit`` subwords and EOS), which a batch always holds."""
    needed = (model_limit + 1) * vocab * BYTES_PER_LOG_PROB
    if needed > limits.max_score_mb * 2**20:
        raise NMTError(
            f"serve.max_score_mb={limits.max_score_mb:g}: scoring one translation of {model_limit} subwords "
            f"over {vocab} target subwords takes {needed / 2**20:.1f} MB; raise it"
        )
