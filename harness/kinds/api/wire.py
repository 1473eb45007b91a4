"""What came over the wire, validated against the OpenAI API's published types: the ``openai`` Python
package's pydantic models (``Completion``, ``ChatCompletion``, ``ChatCompletionChunk``, ``ErrorObject``)
in pydantic's strict mode — no coercion, so a number sent as a string or an object where a string
belongs is a deviation. Fields beyond the types (vLLM's ``token_ids``, ``prompt_token_ids`` ...) are
allowed: the models accept extra fields. One deviation names the JSON path and what the type expects.

One accommodation, stated here: a ``/v1/completions`` stream event may carry ``finish_reason: null``
before its last event. The package reads completions streams as ``Completion`` objects without
validating them (its ``CompletionChoice.finish_reason`` is required), and the OpenAI API itself sends
``null`` there; :class:`CompletionEvent` is ``Completion`` with that one field optional.

Beyond the types: a tool call's ``function.arguments`` is a string *holding JSON* (the API's own
words); a whole reply's arguments that do not parse are a deviation too."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from harness.engines.openai.transport import Exchange
from harness.excerpt import clip


@functools.cache
def published() -> dict[str, Any]:
    """The types, by route and shape. Imported on first use: the ``openai`` package and pydantic stay
    out of everything that only reads records (the fleet's merge installs neither)."""
    from openai.types import Completion, ErrorObject
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.completion_choice import CompletionChoice
    from pydantic import BaseModel

    class StreamChoice(CompletionChoice):
        finish_reason: Literal["stop", "length", "content_filter"] | None = None  # type: ignore[assignment]

    class CompletionEvent(Completion):
        """One ``/v1/completions`` stream event: ``Completion``, ``finish_reason`` null until the end."""

        choices: list[StreamChoice]  # type: ignore[assignment]

    class ErrorReply(BaseModel):
        """An HTTP error's body: ``{"error": <ErrorObject>}`` (the shape the OpenAI API answers)."""

        error: ErrorObject

    return {
        "completion": Completion,
        "completion_event": CompletionEvent,
        "chat": ChatCompletion,
        "chat_event": ChatCompletionChunk,
        "error": ErrorReply,
    }


INDEX = re.compile(r"\[\d+\]")
EXPECTS = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "missing": "a required field",
    "none_required": "null",
}


@dataclass(frozen=True, slots=True)
class Deviation:
    """One place a reply differs from the published type."""

    type_name: str
    """The type the reply was validated as (``ChatCompletion``, ``ChatCompletionChunk`` ...)."""
    path: str
    """JSON path from the body (``choices[0].message.tool_calls[0].function.arguments``); a stream
    event's starts with ``events[i]``."""
    expected: str
    got: str

    @property
    def key(self) -> str:
        """The deviation with every index left out (a stream's event count may differ)."""
        return f"{self.type_name} {INDEX.sub('[]', self.path)}: {self.expected}"

    def words(self) -> str:
        return f"{self.path}: expected {self.expected} ({self.type_name}), got {self.got}"

    def to_json(self) -> dict[str, str]:
        return {"type": self.type_name, "path": self.path, "expected": self.expected, "got": self.got}


def _render(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _got(value: Any) -> str:
    kind = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}
    name = "null" if value is None else kind.get(type(value), type(value).__name__)
    return f"{name} {clip(json.dumps(value, default=str), 60)}"


@functools.cache
def _models() -> frozenset[str]:
    from pydantic import BaseModel

    def under(cls: type) -> set[str]:
        out = set()
        for sub in cls.__subclasses__():
            out |= {sub.__name__} | under(sub)
        return out

    published()
    return frozenset(under(BaseModel))


def _is_member(part: Any) -> bool:
    """A smart union's member in a location (pydantic puts the model's class name there; a dict key
    such as a ``top_logprobs`` token is not one)."""
    return isinstance(part, str) and part[:1].isupper() and part in _models()


def _errors(model: Any, obj: Any) -> list[dict[str, Any]]:
    from pydantic import ValidationError

    try:
        model.model_validate(obj, strict=True)
    except ValidationError as e:
        return [dict(x) for x in e.errors(include_url=False)]
    return []


def _closest_members(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of a union's members, keep the errors of the one that failed least (the member the reply
    meant: a function tool call, not a custom one), with the member's name left out of the path."""
    by_union: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = {}
    plain = []
    for err in errors:
        loc = tuple(err["loc"])
        at = next((i for i, p in enumerate(loc) if _is_member(p)), None)
        if at is None:
            plain.append(err)
            continue
        by_union.setdefault(loc[:at], {}).setdefault(str(loc[at]), []).append(
            {**err, "loc": loc[:at] + loc[at + 1 :]}
        )
    for members in by_union.values():
        plain += _closest_members(min(members.values(), key=len))
    return plain


def validate(model: Any, obj: Any, prefix: str = "") -> list[Deviation]:
    """Strict validation of one JSON value as ``model`` (a pydantic model of :func:`published`): every
    deviation, path and expected type."""
    out = []
    for err in _closest_members(_errors(model, obj)):
        path = _render(err["loc"])
        expected = EXPECTS.get(err["type"], err["msg"].removeprefix("Input should be ").rstrip("."))
        if err["type"] == "literal_error":
            expected = f"one of {err.get('ctx', {}).get('expected', err['msg'])}"
        got = "nothing" if err["type"] == "missing" else _got(err.get("input"))
        full = f"{prefix}.{path}" if prefix and path else prefix or path or "(body)"
        out.append(Deviation(model.__name__, full, expected, got))
    return out


def _arguments(body: Mapping[str, Any]) -> list[Deviation]:
    out = []
    for i, ch in enumerate(body.get("choices") or []):
        msg = ch.get("message") if isinstance(ch, Mapping) else None
        for j, tc in enumerate((msg or {}).get("tool_calls") or []) if isinstance(msg, Mapping) else ():
            args = ((tc or {}).get("function") or {}).get("arguments") if isinstance(tc, Mapping) else None
            if isinstance(args, str):
                try:
                    json.loads(args)
                except json.JSONDecodeError:
                    out.append(
                        Deviation(
                            "ChatCompletion",
                            f"choices[{i}].message.tool_calls[{j}].function.arguments",
                            "a string holding JSON",
                            f"a string that is not JSON: {clip(args, 60)!r}",
                        )
                    )
    return out


def deviations(path: str, ex: Exchange) -> list[Deviation] | None:
    """Every deviation of one exchange on route ``path`` from the published types; None: nothing
    came back to validate (no answer)."""
    chat = path.startswith("/chat")
    types = published()
    if ex.status == 0:
        return None
    if ex.status >= 400:
        if not isinstance(ex.body, Mapping):
            return [Deviation("ErrorReply", "(body)", "a JSON object", f"{clip(ex.raw, 60)!r}")]
        return validate(types["error"], ex.body)
    if ex.events or ex.done:
        event_type = types["chat_event" if chat else "completion_event"]
        out = []
        for i, ev in enumerate(ex.events):
            out += validate(event_type, ev, f"events[{i}]")
        if ex.error and ex.raw:
            out.append(
                Deviation(event_type.__name__, f"events[{len(ex.events)}]", "a JSON object", f"{ex.raw!r}")
            )
        return out
    if not isinstance(ex.body, Mapping):
        return [Deviation("Completion", "(body)", "a JSON object", f"{clip(ex.raw, 60)!r}")]
    body_type = types["chat" if chat else "completion"]
    return validate(body_type, ex.body) + (_arguments(ex.body) if chat else [])
