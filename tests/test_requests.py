"""The service's request parser alone: a good request becomes decoding overrides; a bad one is refused
with a 4xx naming the field; the decoding fields and their limits are those of DecodingConfig."""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass, fields, replace

import pytest
from helpers import knob_rules

from nmt.config import (
    NON_NEGATIVE,
    POSITIVE,
    DecodingConfig,
    DecodingOverrides,
    ServerLimits,
    check_decoding,
    knob,
)
from nmt.errors import NMTError
from nmt.serve.requests import SERVER_SIDE, BadRequest, parse_request, parse_score, request_model

LIMITS = ServerLimits(max_sentences=3, max_chars=20, max_beam_size=6)


def refused(payload: bytes | dict, limits: ServerLimits = LIMITS) -> tuple[int, dict[str, str]]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    with pytest.raises(BadRequest) as e:
        parse_request(body, limits)
    return e.value.status, e.value.body()


def test_a_good_request_gives_its_sentences_and_only_the_settings_it_sets():
    request = parse_request(
        json.dumps({"text": ["A cat.", ""], "beam_size": 4, "alpha": 1, "no_unk": True}).encode(), LIMITS
    )
    assert request.text == ["A cat.", ""] and request.attention is False
    assert request.decoding() == DecodingOverrides(beam_size=4, alpha=1.0, no_unk=True)
    assert parse_request(b'{"text": [], "attention": true}', LIMITS).decoding() == DecodingOverrides()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b"{not json",
            "body: not JSON (Expecting property name enclosed in double quotes at line 1 column 2)",
        ),
        (b'{"text": ["caf\xe9"]}', "body: invalid UTF-8 at byte 14"),
        (b'["a", "b"]', 'body: a JSON object is expected, e.g. {"text": ["A sentence."]}'),
    ],
)
def test_what_is_not_a_json_object_is_a_400(body, message):
    assert refused(body) == (400, {"error": message, "field": "body"})


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"text": "one string"}, "text"),
        ({"text": ["ok", 5]}, "text.1"),
        ({}, "text"),
        ({"text": ["a"], "beam_size": "5"}, "beam_size"),  # strict: no conversion from strings
        ({"text": ["a"], "beam_size": True}, "beam_size"),
        ({"text": ["a"], "beam_size": 2.0}, "beam_size"),
        ({"text": ["a"], "no_unk": 1}, "no_unk"),
        ({"text": ["a"], "attention": "yes"}, "attention"),
    ],
)
def test_a_wrongly_typed_field_is_a_422_naming_it(payload, field):
    status, body = refused(payload)
    assert status == 422 and body["field"] == field and body["error"].startswith(f"{field}: ")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"text": ["a"], "max_len_b": ' + b"9" * 5000 + b"}", "max_len_b"),
        (b'{"text": ["a"], "beam_size": -' + b"1" * 4301 + b"}", "beam_size"),
        (b'{"text": ["a", ' + b"7" * 4400 + b"]}", "text.1"),
    ],
)
def test_an_integer_too_long_for_python_is_a_422_naming_its_field(body, field):
    """JSON integers of more than 4,300 digits, which Python refuses to convert (a ValueError)."""
    assert refused(body)[0] == 422 and refused(body)[1]["field"] == field
    score = body.replace(b'["a"]', b'["a"], "target": ["b"]')
    with pytest.raises(BadRequest) as e:
        parse_score(score, LIMITS)
    assert (e.value.status, e.value.field) == (422, field)


def test_an_unknown_field_is_named():
    assert refused({"text": ["a"], "beam": 5}) == (422, {"error": "beam: unknown field", "field": "beam"})


def test_the_servers_own_settings_are_refused_per_request():
    """max_tokens, cache and shortlist_group change only the speed, and shortlist names a file where the
    model runs: the server sets them for every batch."""
    assert set(SERVER_SIDE) == {"max_tokens", "cache", "shortlist", "shortlist_group"}
    for name in SERVER_SIDE:
        error = {"error": f"{name}: set by the server, not per request", "field": name}
        assert refused({"text": ["a"], name: getattr(DecodingConfig(), name)}) == (422, error)


@pytest.mark.parametrize("name", sorted(set(knob_rules(DecodingConfig)) - set(SERVER_SIDE)))
def test_every_decoding_rule_holds_for_requests_as_for_the_scripts(name):
    ok, what = knob_rules(DecodingConfig)[name]
    bad = next(v for v in (-1, 0) if not ok(v))
    assert refused({"text": ["a"], name: bad}) == (422, {"error": f"{name}: {what}", "field": name})
    with pytest.raises(NMTError, match=f"^decoding.{name}={bad}: "):
        check_decoding(replace(DecodingConfig(), **{name: bad}))


def test_limits_of_the_server():
    assert refused({"text": ["a"] * 4}) == (
        413,
        {"error": "text: 4 sentences; at most 3 per request", "field": "text"},
    )
    error = "text: 21 characters; at most 20 per request"
    assert refused({"text": ["a" * 10, "b" * 11]}) == (413, {"error": error, "field": "text"})
    error = "beam_size: 7 is out of range 1..6"
    assert refused({"text": ["a"], "beam_size": 7}) == (422, {"error": error, "field": "beam_size"})
    assert parse_request(b'{"text": ["a"], "beam_size": 6}', LIMITS).beam_size == 6


def test_the_request_has_a_field_per_decoding_option_that_changes_the_output():
    options = typing.get_type_hints(DecodingConfig)
    request = request_model()
    assert set(request.model_fields) == {
        "text",
        "attention",
        "alignments",
        "prefix",
        "target_lang",
        *options,
    } - set(SERVER_SIDE)
    assert {f.name for f in fields(DecodingOverrides)} == set(options)


def test_a_new_decoding_option_is_a_request_field_with_its_rule():
    @dataclass
    class WithMore(DecodingConfig):
        top_k: int = knob(0, NON_NEGATIVE)
        threads: int = knob(1, POSITIVE, speed_only=True)

    request = request_model(WithMore)
    assert "top_k" in request.model_fields and "threads" not in request.model_fields
    assert request.model_validate({"text": ["a"], "top_k": 3}).top_k == 3
    with pytest.raises(ValueError, match="must be >= 0"):
        request.model_validate({"text": ["a"], "top_k": -1})
