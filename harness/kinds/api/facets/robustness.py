"""Requests that must not kill a server: an empty prompt, a token-id prompt, a prompt over the context,
``max_tokens`` 0, malformed JSON, an unknown field, ``n`` > 1, an empty conversation, and a client that
leaves in the middle of a stream. Each gets a clear 4xx or a correct answer, and the next ordinary
request is still answered. Sent only to servers the harness starts itself or that the user lets it
probe (``openai:<url>,probe=yes``); a request that kills a server is the finding, named with it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from harness.api import Verdict
from harness.kinds.api.facets.base import (
    FACETS,
    NEXT,
    Context,
    Observed,
    Probe,
    chat,
    completion,
    seen,
    verdict,
)
from harness.kinds.api.views import View


def ordinary(text: str) -> dict[str, Any]:
    """The request that must still be answered after each probe."""
    return completion(text, 2)


def answer(p: Probe, v: View) -> tuple[bool, str]:
    """Is ``v`` a clear 4xx or a correct answer to ``p``?"""
    if 400 <= v.status < 500:
        return (
            bool(v.error),
            f"HTTP {v.status}: {v.error}" if v.error else f"HTTP {v.status} with no message",
        )
    if v.status == 0:
        return False, f"no answer: {v.error}"
    if v.status >= 500:
        return False, f"HTTP {v.status}: {v.error}"
    if p.drop_after is not None:
        return True, "the client left mid-stream"
    if not v.ok:
        return False, f"a broken answer: {v.error}"
    want = p.meta.get("choices", 1)
    if v.choices != want:
        return False, f"{v.choices} choices, asked for {want}"
    if p.meta.get("max_tokens_zero") and (v.token_ids or v.text):
        return False, f"max_tokens 0 answered with text {v.text!r}"
    return True, f"answered ({v.finish}, {len(v.token_ids or ())} tokens)"


@dataclass(frozen=True, slots=True)
class Robustness:
    key: ClassVar[str] = "robustness"
    title: ClassVar[str] = "Requests that must not kill a server: a clear 4xx or a correct answer"
    rule: ClassVar[str] = (
        "each hostile or unusual request gets a clear 4xx or a correct answer, and the "
        "next ordinary request is still answered"
    )

    def probes(self, ctx: Context) -> list[Probe]:
        if not ctx.managed:
            return []
        first = next(iter(ctx.texts.values()))
        ids = ctx.reference.encode(first)
        # as text: a server that refuses token-id prompts must still meet a prompt over its context
        over = " ".join([first] * (ctx.max_len // max(1, len(ids)) + 2))
        c = self.key
        return [
            Probe("robustness/empty-prompt", c, "/completions", completion("", 4), then_ordinary=True),
            Probe("robustness/token-id-prompt", c, "/completions", completion(ids, 4), then_ordinary=True),
            Probe(
                "robustness/over-context",
                c,
                "/completions",
                completion(over, 4),
                then_ordinary=True,
                meta={"prompt_tokens": len(ctx.reference.encode(over))},
            ),
            Probe(
                "robustness/max-tokens-0",
                c,
                "/completions",
                completion(first, 0),
                then_ordinary=True,
                meta={"max_tokens_zero": True},
            ),
            Probe(
                "robustness/malformed-json",
                c,
                "/completions",
                raw=b'{"prompt": "Hi", "max_tokens": 4',
                then_ordinary=True,
            ),
            Probe(
                "robustness/unknown-field",
                c,
                "/completions",
                completion(first, 4, harness_unknown_field={"x": 1}),
                then_ordinary=True,
            ),
            Probe(
                "robustness/n-2",
                c,
                "/completions",
                completion(first, 4, n=2),
                then_ordinary=True,
                meta={"choices": 2},
            ),
            Probe("robustness/empty-messages", c, "/chat/completions", chat([], 4), then_ordinary=True),
            Probe(
                "robustness/disconnect",
                c,
                "/completions",
                {**completion(first, 64), "stream": True},
                stream=True,
                drop_after=1,
                then_ordinary=True,
            ),
        ]

    def judge(
        self, ctx: Context, probes: Sequence[Probe], oracle: Observed, candidate: Observed
    ) -> list[Verdict]:
        if not probes:
            return [
                verdict(
                    self.key,
                    "robustness",
                    "skip",
                    "not probed: a server the harness did not start (openai:<url>,probe=yes allows it)",
                )
            ]
        out = []
        for p in probes:
            c = seen(candidate, p.id)
            ok, words = answer(p, c)
            nxt = seen(candidate, p.id + NEXT)
            if not nxt.ok:
                out.append(
                    verdict(
                        self.key,
                        p.id,
                        False,
                        f"{words}; then the next ordinary request failed "
                        f"({nxt.error}): this request killed the server",
                        killed=True,
                        oracle=answer(p, seen(oracle, p.id))[1],
                    )
                )
                continue
            out.append(
                verdict(
                    self.key,
                    p.id,
                    ok,
                    words + "; the next request was answered",
                    oracle=answer(p, seen(oracle, p.id))[1],
                )
            )
        return out


FACETS.register(Robustness.key, help=Robustness.title)(Robustness())
