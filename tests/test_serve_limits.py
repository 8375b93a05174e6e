"""The service's per-request limits alone (nmt.serve.limits): each refuses what is over it with the status
and field a client needs, before the cost is paid, and lets what is within it through."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from nmt.config import DecodingConfig, ServerLimits
from nmt.decoding.common import length_budget
from nmt.errors import NMTError
from nmt.serve.limits import (
    BadRequest,
    attention_bytes,
    check_attention_size,
    check_content_type,
    check_depth,
    check_output_length,
    check_score_memory,
    check_scores,
    check_search_memory,
    check_text,
    declared_length,
    json_depth,
    output_budget,
    read_body,
    score_batch_tokens,
    search_groups,
)

LIMITS = ServerLimits(max_output_tokens=50, max_response_mb=1.0)


def refused(fn, *args) -> tuple[int, str, str]:
    with pytest.raises(BadRequest) as e:
        fn(*args)
    return e.value.status, e.value.field, e.value.message


@pytest.mark.parametrize(
    "header", ["application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"]
)
def test_json_is_accepted(header):
    check_content_type(header)


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "application/jsonx",
    ],
)
def test_what_a_page_can_send_without_a_preflight_is_a_415(header):
    assert refused(check_content_type, header)[:2] == (415, "content-type")


def test_a_declared_length_over_the_limit_is_refused_before_reading():
    assert declared_length(None, 10) is None and declared_length("10", 10) == 10
    assert refused(declared_length, "104857600", 1024)[:2] == (413, "body")
    assert refused(declared_length, "-1", 1024)[:2] == (400, "content-length")


def test_a_streamed_body_is_read_no_further_than_the_limit():
    read = []

    async def chunks(n: int):
        for _ in range(n):
            read.append(1)
            yield b"x" * 100

    assert asyncio.run(read_body(chunks(3), 300, 30)) == b"x" * 300
    read.clear()
    with pytest.raises(BadRequest) as e:
        asyncio.run(read_body(chunks(10**6), 1000, 30))
    assert e.value.status == 413 and len(read) == 11  # one chunk past the limit, not a million


def test_a_body_not_all_sent_within_the_timeout_is_a_408_that_closes_the_connection():
    """A slow-loris client: Content-Length 200, 10 bytes sent, then nothing."""

    async def trickle():
        yield b"x" * 10
        await asyncio.sleep(3600)
        yield b"x" * 190

    started = time.monotonic()
    with pytest.raises(BadRequest) as e:
        asyncio.run(read_body(trickle(), 1000, 0.3))
    assert (e.value.status, e.value.field) == (408, "body") and "serve.timeout_s=0.3" in e.value.message
    assert e.value.headers == {"Connection": "close"} and time.monotonic() - started < 2


def test_score_batches_are_cut_to_keep_their_log_probabilities_within_the_limit():
    limits = ServerLimits(max_score_mb=64.0)
    assert score_batch_tokens(limits, 32_000, 8000) == 262  # 64 MiB / (32,000 x 8 bytes)
    assert score_batch_tokens(limits, 100, 8000) == 8000  # decoding.max_tokens, when it fits
    assert score_batch_tokens(ServerLimits(max_score_mb=1e-9), 32_000, 8000) == 1
    check_score_memory(limits, 32_000, 255)  # 256 x 32,000 x 8 bytes = 62.5 MiB
    with pytest.raises(NMTError, match=r"^serve.max_score_mb=64: scoring one translation of 511 subwords"):
        check_score_memory(limits, 32_000, 511)


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("1", 0),
        ('{"text": ["a", "b"]}', 2),
        ('{"text": ["[[[{{{", "\\"[[["], "a": {"b": [1]}}', 3),  # brackets in strings do not count
        ('{"text": ["\\\\"], "a": [[1]]}', 3),  # an escaped backslash ends before the quote
        ("[" * 100_000 + "]" * 100_000, 100_000),
    ],
)
def test_json_depth_counts_brackets_outside_strings(text, depth):
    assert json_depth(text.encode()) == depth


def test_deep_json_is_refused_before_the_parser_recurses():
    check_depth(b'{"text": ["a"]}')
    assert refused(check_depth, b"[" * 100_000 + b"]" * 100_000)[:2] == (400, "body")


def test_a_lone_surrogate_is_not_text():
    check_text(["ok", "caf\u00e9 \U0001f600"])
    assert refused(check_text, ["ok", json.loads('"a\\ud800"')])[:2] == (422, "text.1")


def test_outputs_longer_than_the_limit_are_refused_naming_what_allows_them():
    decoding = DecodingConfig(max_len_a=1.2, max_len_b=10)
    check_output_length([30], decoding, LIMITS, 255, set())  # 1.2 * 31 + 10 = 47.2
    assert refused(check_output_length, [40], decoding, LIMITS, 255, set())[:2] == (422, "text")
    assert refused(check_output_length, [40], decoding, LIMITS, 255, {"max_len_b"})[:2] == (422, "max_len_b")
    huge = DecodingConfig(max_len_a=1e308, max_len_b=10)
    assert refused(check_output_length, [1], huge, LIMITS, 255, {"max_len_a", "max_len_b"})[1] == "max_len_a"
    check_output_length([40], DecodingConfig(max_len_b=10**9), LIMITS, 49, {"max_len_b"})  # the model's cap


@pytest.mark.parametrize(("a", "b"), [(1e308, 10), (1.0, 10**400), (1e308, 10**4000)], ids=["a", "b", "both"])
def test_huge_finite_lengths_are_computable_and_the_models_cap_holds(a, b):
    """Values within the rules but beyond a float (1e308 * 2, 10**400) cap at the model's positions,
    in the service's check as in the search's budget (no OverflowError)."""
    decoding = DecodingConfig(max_len_a=a, max_len_b=b)
    assert output_budget(30, decoding, 49) == 49 and length_budget(31, a, b, 49) == 49
    check_output_length([30], decoding, LIMITS, 49, {"max_len_a", "max_len_b"})
    status, field, message = refused(check_output_length, [30], decoding, LIMITS, 255, {"max_len_b"})
    assert (status, field) == (422, "max_len_b") and "allow 255 target subwords" in message
    assert length_budget(3, 1.5, 2, 49) == 6 and length_budget(0, 0.0, 0, 49) == 1  # unchanged


def test_scores_must_stay_finite_numbers():
    check_scores(DecodingConfig(alpha=2.0, word_reward=-1.0), LIMITS)
    assert refused(check_scores, DecodingConfig(alpha=1000.0), LIMITS)[:2] == (422, "alpha")
    assert refused(check_scores, DecodingConfig(word_reward=1e308), LIMITS)[:2] == (422, "word_reward")


def test_attention_is_refused_when_it_could_exceed_the_response_limit():
    decoding = DecodingConfig(max_len_a=1.0, max_len_b=10)
    model = {"decoder_layers": 6, "heads": 8}
    size = attention_bytes([20] * 4, decoding, 255, 6, 8)
    assert size == 4 * 6 * 8 * (21 + 10 + 1) * 21 * 8
    check_attention_size([20] * 4, decoding, LIMITS, 255, model)  # 1,032,192 bytes: under 1 MiB
    status, field, message = refused(check_attention_size, [20] * 64, decoding, LIMITS, 255, model)
    assert (status, field) == (422, "attention") and "serve.max_response_mb=1" in message


def test_the_backend_is_asked_once_per_distinct_settings():
    from nmt.errors import NMTError
    from nmt.serve.app import BackendCheck

    class Translator:
        calls = 0

        def search(self, ids, decoding):
            self.calls += 1
            if decoding.no_repeat_ngram and decoding.beam_size > 1:
                raise NMTError(f"cannot block (decoding.no_repeat_ngram={decoding.no_repeat_ngram})")
            return []

    translator = Translator()
    check = BackendCheck(translator, size=2)
    for _ in range(3):
        check(DecodingConfig())
        with pytest.raises(BadRequest) as e:
            check(DecodingConfig(no_repeat_ngram=2))
        assert (e.value.status, e.value.field) == (422, "no_repeat_ngram")
    assert translator.calls == 2
    check(DecodingConfig(beam_size=3))  # a third: the least recently used is forgotten
    check(DecodingConfig())
    assert translator.calls == 4


def test_a_second_start_on_a_busy_port_fails_in_one_line_before_loading_anything(tmp_path):
    """The port is bound first: a second server fails at once naming it (not after its model and workers
    are up, nor on the checkpoint, which here does not even exist)."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    script = Path(__file__).resolve().parents[1] / "scripts" / "serve.py"
    try:
        done = subprocess.run(
            [sys.executable, str(script), f"checkpoint={tmp_path / 'missing.pt'}", f"port={port}"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
    finally:
        busy.close()
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"error: host=127.0.0.1 port={port}: cannot listen there (Address already in use); another server "
        "may hold it: stop it, or choose another port=..."
    )


def test_a_second_start_while_the_first_loads_its_model_fails_at_once():
    """The first server's socket listens from the start (before its model loads): Linux would let a second
    socket with SO_REUSEADDR bind the same port while neither listens, and both would load a model."""
    from nmt.serve import listen

    first = listen("127.0.0.1", 0)
    try:
        port = first.getsockname()[1]
        with pytest.raises(NMTError, match=f"port={port}: cannot listen there"):
            listen("127.0.0.1", port).close()
    finally:
        first.close()


def test_a_sentence_whose_search_alone_is_over_the_memory_limit_is_refused_naming_the_option():
    limits = ServerLimits(max_search_mb=1.0)
    decoding = DecodingConfig(beam_size=16)
    check_search_memory([2**20, 2**20, 2**20], [5, 9, 7], decoding, limits, {"beam_size"})  # parts fit
    check_search_memory([], [], decoding, limits, set())
    status, field, message = refused(check_search_memory, [10, 3 * 2**20], [5, 40], decoding, limits, set())
    assert (status, field) == (422, "text")
    assert message.startswith("searching a sentence of 40 subwords with beam_size=16 keeps 3.0 MB, over ")
    assert "serve.max_search_mb=1" in message
    over = (check_search_memory, [3 * 2**20], [40], decoding, limits)
    assert refused(*over, {"beam_size", "max_len_b"})[1] == "beam_size"
    assert refused(*over, {"max_len_b"})[1] == "max_len_b"


@pytest.mark.parametrize("limit", [1, 10, 25, 1000])
def test_search_groups_keep_each_part_within_the_limit(limit):
    sizes = [7, 3, 12, 5, 5, 30, 1]
    groups = search_groups(sizes, limit)
    assert sorted(i for group in groups for i in group) == list(range(len(sizes)))
    assert all(sum(sizes[i] for i in group) <= limit or len(group) == 1 for group in groups)
    assert len(groups) == (1 if limit >= sum(sizes) else len(groups)) and search_groups([], limit) == []
    if limit == 25:  # greedy, largest first: [30] alone, then parts as full as fit
        assert [[sizes[i] for i in group] for group in groups] == [[30], [12, 7, 5], [5, 3, 1]]
