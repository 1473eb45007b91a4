"""The structured-output facet's grammar at every step (harness/kinds/api/grammar.py), on a committed
tiny model's tokenizer: a token path the grammar allows passes, and the first token it does not allow
is named by step, id and text — including where the finished text would still validate."""

from __future__ import annotations

import json

import pytest

from harness.kinds.api.facets.structured import CHOICES, REGEX, SCHEMA, valid
from harness.kinds.api.grammar import constraint, first_forbidden, first_forbidden_text, grammar_source
from tests.unit.api_kit import context

EOS = 1
"""tiny-qwen3's end-of-sequence id (its generation_config.json)."""


@pytest.fixture(scope="module")
def ref():  # type: ignore[no-untyped-def]
    return context("tiny-qwen3").reference


def ids(ref, text: str) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(t) for t in ref.tokenizer.encode(text, add_special_tokens=False)]


@pytest.mark.parametrize(
    ("kind", "spec", "text"),
    [
        ("json_schema", SCHEMA, '{ "color":"red", "size": 1, "ok":true}'),
        ("json_object", None, '{"a": [1, 2.5, "x"]}'),
        ("regex", REGEX, "elyg-00"),
        ("choice", CHOICES, "gamma delta"),
    ],
)
def test_a_path_the_grammar_allows_passes_to_its_stop_token(ref, kind: str, spec, text: str) -> None:  # type: ignore[no-untyped-def]
    assert first_forbidden(ref, kind, spec, ids(ref, text) + [EOS]) is None
    assert first_forbidden(ref, kind, spec, ids(ref, text)[:2]) is None, "a prefix cut by max_tokens"


def test_valid_json_in_another_key_order_is_named_at_the_token_that_left_the_grammar(ref) -> None:  # type: ignore[no-untyped-def]
    text = json.dumps({"size": 1, "color": "red", "ok": True})
    assert valid("json_schema", text, "stop")[0] is True, "jsonschema alone cannot see this"
    broken = first_forbidden(ref, "json_schema", SCHEMA, ids(ref, text) + [EOS])
    assert broken is not None and broken.step == 2 and broken.before == '{"'
    assert broken.words() == f"step 2: token {broken.token} 's' not allowed after '{{\"'"


def test_a_stop_token_before_the_grammar_may_end_and_a_token_after_it_are_refused(ref) -> None:  # type: ignore[no-untyped-def]
    early = first_forbidden(ref, "choice", CHOICES, ids(ref, "gam") + [EOS])
    assert early is not None and early.step == len(ids(ref, "gam")) and early.token == EOS
    after = first_forbidden(ref, "regex", REGEX, ids(ref, "ab-12") + [EOS] + ids(ref, "3"))
    assert after is not None and after.step == len(ids(ref, "ab-12")) + 1
    over = first_forbidden(ref, "regex", REGEX, ids(ref, "ab-123"))
    assert over is not None and over.piece == "3" and over.before == "ab-12"


def test_each_probe_kind_names_the_constraint_its_request_carries() -> None:
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA}}}
    assert constraint("json_schema", body) == SCHEMA
    assert constraint("regex", {"structured_outputs": {"regex": REGEX}}) == REGEX
    assert grammar_source("choice", ['say "hi"', "b"]) == ("ebnf", 'root ::= "say \\"hi\\"" | "b"')
    with pytest.raises(ValueError, match="no grammar for structured-output kind 'grammar'"):
        grammar_source("grammar", "root ::= x")


def test_a_server_without_token_ids_is_judged_on_its_text_character_by_character(ref) -> None:  # type: ignore[no-untyped-def]
    assert first_forbidden_text(ref, "json_object", None, '{"a": [1, "caf\u00e9"') is None, "cut by max_tokens"
    broken = first_forbidden_text(ref, "json_schema", SCHEMA, '{"size": 1}')
    assert broken is not None and broken.token is None
    assert broken.words() == "character 2: 's' not allowed after '{\"'"
    assert first_forbidden_text(ref, "choice", CHOICES, "gamma  delta") is not None
