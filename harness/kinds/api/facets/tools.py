"""Tool calls: ``tool_choice`` naming a function (forced: it works with random weights) and
``required``: the parsed ``tool_calls`` — names, and arguments compared as JSON, key order free — and
the content/tool-call split equal the oracle's; a conversation with a tool reply renders as the
reference renders it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from harness.api import Verdict
from harness.kinds.api.facets.base import FACETS, Context, Observed, Probe, chat, seen, verdict
from harness.kinds.api.facets.template import (
    TOOLS,
    conversations,
    evidence,
    no_free_whitespace,
    refused,
    rendered,
)
from harness.kinds.api.views import View


def calls(v: View) -> list[tuple[Any, Any]] | str:
    """(name, arguments as JSON) per call; a string saying why when an argument is not JSON."""
    out = []
    for tc in v.tool_calls:
        args = tc.get("arguments")
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            return f"arguments of {tc.get('name')!r} are not JSON: {args!r}"
        out.append((tc.get("name"), parsed))
    return out


def content(v: View) -> str | None:
    return v.text or None


@dataclass(frozen=True, slots=True)
class Tools:
    key: ClassVar[str] = "tools"
    title: ClassVar[str] = "Tool calls: named and required tool_choice, arguments as JSON, tool replies"
    rule: ClassVar[str] = (
        "parsed tool_calls (name, arguments compared as JSON, key order free) and the "
        "content/tool_calls split equal the oracle's; a tool reply renders as "
        "apply_chat_template renders it"
    )

    def probes(self, ctx: Context) -> list[Probe]:
        first = next(iter(ctx.texts.values()))
        user = [{"role": "user", "content": first}]
        named = {"type": "function", "function": {"name": "get_weather"}}
        msgs, tools = conversations(list(ctx.texts.values()))["tool_reply"]
        bias = no_free_whitespace(ctx.reference)
        return [
            Probe(
                "tools/named",
                self.key,
                "/chat/completions",
                chat(user, 96, tools=TOOLS, tool_choice=named, logit_bias=bias),
            ),
            Probe(
                "tools/required",
                self.key,
                "/chat/completions",
                chat(user, 96, tools=TOOLS, tool_choice="required", logit_bias=bias),
            ),
            Probe(
                "tools/reply-render",
                self.key,
                "/chat/completions",
                chat(msgs, 1, tools=tools),
                meta=rendered(ctx.reference, msgs, tools),
            ),
        ]

    def judge(
        self, ctx: Context, probes: Sequence[Probe], oracle: Observed, candidate: Observed
    ) -> list[Verdict]:
        out = []
        for p in probes:
            o, c = seen(oracle, p.id), seen(candidate, p.id)
            if (finding := refused(p, c)) is not None:
                out.append(finding)
                continue
            if not c.ok:
                out.append(verdict(self.key, p.id, False, f"no answer: {c.error}"))
                continue
            if "reference" in p.meta:
                source, same, words = evidence(c, list(p.meta["reference"]))
                out.append(
                    verdict(self.key, p.id, "skip" if same is None else bool(same), words, evidence=source)
                )
                continue
            out.append(self._calls(p, o, c))
        return out

    def _calls(self, p: Probe, o: View, c: View) -> Verdict:
        oc, cc = calls(o), calls(c)
        facts: Mapping[str, Any] = {
            "oracle": [dict(t) for t in o.tool_calls],
            "candidate": [dict(t) for t in c.tool_calls],
        }
        if isinstance(cc, str):
            return verdict(self.key, p.id, False, cc, **facts)
        if isinstance(oc, str):
            return verdict(self.key, p.id, False, f"the oracle's {oc}", **facts)
        if not cc:
            return verdict(
                self.key,
                p.id,
                False,
                f"no tool_calls (content {c.text!r}); the oracle called {[n for n, _ in oc]}",
                **facts,
            )
        if [n for n, _ in cc] != [n for n, _ in oc]:
            return verdict(
                self.key,
                p.id,
                False,
                f"called {[n for n, _ in cc]}, the oracle {[n for n, _ in oc]}",
                **facts,
            )
        for (name, a), (_, b) in zip(cc, oc, strict=True):
            if a != b:
                return verdict(
                    self.key,
                    p.id,
                    False,
                    f"{name} arguments {json.dumps(a)} != oracle {json.dumps(b)}",
                    **facts,
                )
        if content(c) != content(o):
            return verdict(
                self.key,
                p.id,
                False,
                f"content {content(c)!r} beside the calls, the oracle {content(o)!r}",
                **facts,
            )
        return verdict(
            self.key,
            p.id,
            True,
            f"{len(cc)} call(s) equal the oracle's as JSON: "
            + ", ".join(f"{n}({json.dumps(a, sort_keys=True)})" for n, a in cc),
            **facts,
        )


FACETS.register(Tools.key, help=Tools.title)(Tools())
