"""Structured output: ``json_schema`` and ``json_object`` (``response_format``), ``regex`` and ``choice``
(vLLM's ``structured_outputs``): every output is valid — a JSON-schema validator (``jsonschema``),
``re.fullmatch`` of the very pattern, membership of the choices —, every generated token was allowed by
the request's grammar at its step (:mod:`harness.kinds.api.grammar`), and the constrained greedy
tokens equal the oracle's; at the first difference, both tokens."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from harness.api import Verdict
from harness.kinds.api.facets.base import FACETS, Context, Observed, Probe, chat, completion, seen, verdict
from harness.kinds.api.facets.template import no_free_whitespace
from harness.kinds.api.grammar import constraint, first_forbidden, first_forbidden_text
from harness.kinds.api.reference import Reference
from harness.kinds.api.views import View, first_difference

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "color": {"type": "string", "enum": ["red", "green", "blue"]},
        "size": {"type": "integer", "enum": [1, 2, 3]},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "size", "ok"],
    "additionalProperties": False,
}
REGEX = "[a-z]{2,5}-[0-9]{2}"
CHOICES = ["alpha", "beta", "gamma delta"]


def valid(kind: str, text: str, finish: str | None) -> tuple[bool | None, str]:
    """(valid?, why); None: not judged (a json_object cut by max_tokens)."""
    if kind in ("json_schema", "json_object"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            if kind == "json_object" and finish == "length":
                return None, "cut by max_tokens before the object closed: validity not judged"
            return False, f"not JSON: {e.msg} at {e.pos}"
        if kind == "json_object":
            return isinstance(obj, dict), "a JSON object" if isinstance(obj, dict) else "JSON, not an object"
        import jsonschema

        try:
            jsonschema.validate(obj, SCHEMA)
        except jsonschema.ValidationError as e:
            return False, f"schema violation: {e.message}"
        return True, "valid under the schema"
    if kind == "regex":
        return (re.fullmatch(REGEX, text) is not None), f"re.fullmatch({REGEX!r})"
    return text in CHOICES, "one of the choices" if text in CHOICES else f"{text!r} is not a choice"


def token_words(ref: Reference, ids: Sequence[int] | None, i: int) -> str:
    if ids is None or i >= len(ids):
        return "(end)"
    return f"{ids[i]} {ref.piece(ids[i])!r}"


@dataclass(frozen=True, slots=True)
class Structured:
    key: ClassVar[str] = "structured"
    title: ClassVar[str] = (
        "Structured output: json_schema, regex, choice, json_object valid, grammar-allowed at every "
        "token, and oracle-equal"
    )
    rule: ClassVar[str] = (
        "every constrained output is valid (jsonschema, re.fullmatch, the choices), each of its "
        "tokens was allowed by the request's grammar at its step, and its greedy tokens equal the oracle's"
    )

    def probes(self, ctx: Context) -> list[Probe]:
        first = next(iter(ctx.texts.values()))
        user = [{"role": "user", "content": first}]
        schema = {"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA}}
        bias = no_free_whitespace(ctx.reference)
        return [
            Probe(
                "structured/json_schema",
                self.key,
                "/chat/completions",
                chat(user, 48, response_format=schema, logit_bias=bias),
                meta={"kind": "json_schema"},
            ),
            Probe(
                "structured/json_object",
                self.key,
                "/chat/completions",
                chat(user, 32, response_format={"type": "json_object"}, logit_bias=bias),
                meta={"kind": "json_object"},
            ),
            Probe(
                "structured/regex",
                self.key,
                "/completions",
                completion(first, 16, structured_outputs={"regex": REGEX}),
                meta={"kind": "regex"},
            ),
            Probe(
                "structured/choice",
                self.key,
                "/completions",
                completion(first, 16, structured_outputs={"choice": CHOICES}),
                meta={"kind": "choice"},
            ),
        ]

    def judge(
        self, ctx: Context, probes: Sequence[Probe], oracle: Observed, candidate: Observed
    ) -> list[Verdict]:
        return [self._one(ctx.reference, p, seen(oracle, p.id), seen(candidate, p.id)) for p in probes]

    def _one(self, ref: Reference, p: Probe, o: View, c: View) -> Verdict:
        kind = str(p.meta["kind"])
        if not c.ok:
            return verdict(self.key, p.id, False, f"no answer: {c.error}")
        ok, why = valid(kind, c.text or "", c.finish)
        facts: dict[str, Any] = {"kind": kind, "text": c.text, "oracle_text": o.text, "valid": ok}
        if ok is False:
            return verdict(self.key, p.id, False, f"{kind}: invalid output {c.text!r}: {why}", **facts)
        spec = constraint(kind, p.body or {})
        if c.token_ids is None:
            broken = first_forbidden_text(ref, kind, spec, c.text or "")
            facts["grammar"] = (
                broken.words() if broken else "no token ids: every character of the text allowed"
            )
        else:
            broken = first_forbidden(ref, kind, spec, c.token_ids)
            facts["grammar"] = broken.words() if broken else f"all {len(c.token_ids)} tokens allowed"
            if broken is not None:
                return verdict(
                    self.key, p.id, False, f"{kind}: grammar broken at {broken.words()}", **facts
                )
        if o.token_ids is not None and c.token_ids is not None:
            i = first_difference(o.token_ids, c.token_ids)
            if i is not None:
                return verdict(
                    self.key,
                    p.id,
                    False,
                    f"{kind}: constrained tokens differ at {i}: oracle {token_words(ref, o.token_ids, i)}"
                    f", candidate {token_words(ref, c.token_ids, i)}",
                    **facts,
                )
        elif (o.text or "") != (c.text or ""):
            return verdict(self.key, p.id, False, f"{kind}: text {c.text!r} != oracle {o.text!r}", **facts)
        return verdict(
            self.key,
            p.id,
            True,
            f"{kind}: {why}; {facts['grammar']}; equal to the oracle's {len(c.token_ids or ())} tokens",
            **facts,
        )


FACETS.register(Structured.key, help=Structured.title)(Structured())
