"""The contract of one facet of the API surface, and the requests (:class:`Probe`) it sends."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from harness.api import Status, Verdict
from harness.engines.openai.transport import Exchange
from harness.kinds.api.reference import Reference
from harness.kinds.api.views import View, view
from harness.registry import Registry

if TYPE_CHECKING:  # types only: the settings validate facet names against FACETS
    from harness.kinds.api.settings import ApiSettings

FACET_HEADER = "X-Harness-Facet"
"""Every request names its facet in this header (servers ignore it; the planted-fault proxy reads it)."""
NEXT = "#next"
"""Suffix of the ordinary request sent after a probe that may kill a server."""


@dataclass(frozen=True, slots=True)
class Probe:
    """One request as every side receives it (the endpoint adds ``model`` and its own fields)."""

    id: str
    facet: str
    path: str
    """``/completions`` or ``/chat/completions`` (under the base URL)."""
    body: Mapping[str, Any] | None = None
    raw: bytes | None = None
    """Sent as it is instead of ``body`` (malformed JSON)."""
    stream: bool = False
    drop_after: int | None = None
    """Leave the stream after this many events (a client disconnecting)."""
    then_ordinary: bool = False
    """Send an ordinary request right after (it must still be answered)."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """What the facet needs to judge it (the reference ids, the stop string, the schema)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "path": self.path,
            "stream": self.stream,
            "body": dict(self.body) if self.body is not None else None,
            "raw": self.raw.decode(errors="replace") if self.raw is not None else None,
            "drop_after": self.drop_after,
            "then_ordinary": self.then_ordinary,
            "meta": json.loads(json.dumps(self.meta, default=str)),
        }


@dataclass(frozen=True, slots=True, eq=False)
class Context:
    """What every facet plans its probes from."""

    settings: ApiSettings
    texts: Mapping[str, str]
    """The suite's cases: id -> prompt text."""
    reference: Reference
    base: Mapping[str, View]
    """The oracle's plain greedy completion of every case (the stop facet cuts where it knows)."""
    max_len: int
    """The model's context as the servers run it."""
    managed: bool = True
    """Requests that might kill a server may be sent (robustness)."""
    dtype: str = "float32"
    """The servers' dtype (the suite's ``[oracle] dtype``): logprob values hold within the cross-device
    tolerance and against the float32 reference in float32 only."""


Observed = Mapping[str, Exchange]
"""Probe id (and ``<id>#next``) -> what came back."""


@runtime_checkable
class Facet(Protocol):
    key: ClassVar[str]
    title: ClassVar[str]
    """The FEATURES.md row."""
    rule: ClassVar[str]
    """What passes, in one sentence (the docs and the record)."""

    def probes(self, ctx: Context) -> list[Probe]: ...

    def judge(
        self, ctx: Context, probes: Sequence[Probe], oracle: Observed, candidate: Observed
    ) -> list[Verdict]:
        """One verdict per probe (or group of probes): the candidate against the oracle and the
        reference. Never raises for a bad reply: that is a failing verdict naming it."""
        ...


@runtime_checkable
class JudgesEveryExchange(Protocol):
    """A facet that judges the replies to every facet's probes, not only its own (the wire schema):
    its ``judge`` receives all the probes of the run."""

    every_exchange: ClassVar[bool]


FACETS: Registry[Facet] = Registry("API facet")


def comparator(key: str) -> str:
    """The verdicts' comparator name of a facet (``api.stop``)."""
    return f"api.{key}"


def verdict(
    facet: str, case: str, ok: bool | Status, summary: str, detail: str = "", **evidence: Any
) -> Verdict:
    status: Status = ("pass" if ok else "fail") if isinstance(ok, bool) else ok
    return Verdict(case, comparator(facet), status, summary, detail, evidence)


def seen(obs: Observed, pid: str) -> View:
    ex = obs.get(pid)
    return view(ex) if ex is not None else View(0, error="not sent")


def completion(prompt: str | Sequence[int], max_tokens: int, **fields: Any) -> dict[str, Any]:
    """A greedy ``/v1/completions`` body asking for token ids back."""
    return {
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "return_token_ids": True,
        **fields,
    }


def chat(messages: Sequence[Mapping[str, Any]], max_tokens: int, **fields: Any) -> dict[str, Any]:
    """A greedy ``/v1/chat/completions`` body asking for token ids back."""
    return {
        "messages": [dict(m) for m in messages],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "return_token_ids": True,
        **fields,
    }


def same_generation(o: View, c: View) -> tuple[bool, str]:
    """Does the candidate's reply say what the oracle's does (text, tokens where both give them,
    finish reason)? (ok, the first difference in words)."""
    if not o.ok:
        return False, f"the oracle did not answer: {o.error}"
    if not c.ok:
        return False, f"no answer: {c.error}"
    if o.token_ids is not None and c.token_ids is not None and o.token_ids != c.token_ids:
        from harness.kinds.api.views import first_difference

        i = first_difference(o.token_ids, c.token_ids)
        return False, (f"tokens differ at {i}: oracle {_at(o.token_ids, i)} candidate {_at(c.token_ids, i)}")
    if (o.text or "") != (c.text or ""):
        return False, f"text differs: oracle {o.text!r} candidate {c.text!r}"
    if o.finish != c.finish:
        return False, f"finish_reason: oracle {o.finish!r} candidate {c.finish!r}"
    return True, ""


def _at(ids: Sequence[int], i: int | None) -> str:
    return str(ids[i]) if i is not None and i < len(ids) else "(end)"
