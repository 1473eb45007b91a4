"""Streaming: the server-sent deltas concatenate to the text of the same request not streamed, with
the same tokens, finish reason and usage; no delta splits a UTF-8 character (strings whose characters
span several byte tokens are forced through a ``choice`` constraint)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from harness.api import Verdict
from harness.kinds.api.facets.base import FACETS, Context, Observed, Probe, chat, completion, seen, verdict
from harness.kinds.api.views import View

REPLACEMENT = "\ufffd"


def pair(pid: str, path: str, body: dict[str, Any], meta: dict[str, Any] | None = None) -> list[Probe]:
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    return [
        Probe(f"{pid}/whole", "streaming", path, body, meta=meta or {}),
        Probe(f"{pid}/stream", "streaming", path, stream, stream=True, meta=meta or {}),
    ]


def consistent(whole: View, streamed: View, forced: str | None) -> tuple[bool, str]:
    """(ok, every difference in words, or what joined)."""
    if not whole.ok:
        return False, f"the request not streamed got no answer: {whole.error}"
    if not streamed.ok:
        return False, f"the stream failed: {streamed.error}"
    joined = streamed.text or ""
    bad = []
    if joined != (whole.text or ""):
        bad.append(
            f"deltas join to {joined!r}, the whole answer is {whole.text!r} ({len(streamed.deltas)} deltas)"
        )
    if (
        whole.token_ids is not None
        and streamed.token_ids is not None
        and whole.token_ids != streamed.token_ids
    ):
        bad.append(f"stream tokens {list(streamed.token_ids)} != {list(whole.token_ids)}")
    if whole.finish != streamed.finish:
        bad.append(f"finish_reason: streamed {streamed.finish!r}, whole {whole.finish!r}")
    for k in ("prompt_tokens", "completion_tokens"):
        if whole.usage.get(k) != streamed.usage.get(k):
            bad.append(f"usage.{k}: streamed {streamed.usage.get(k)!r}, whole {whole.usage.get(k)!r}")
    split = [
        d for d in streamed.deltas if REPLACEMENT in d and (forced is not None or REPLACEMENT not in joined)
    ]
    if split:
        bad.append(f"a delta splits a UTF-8 character: {split[0]!r}")
    if forced is not None and joined != forced:
        bad.append(f"the forced string {forced!r} came back as {joined!r}")
    if bad:
        return False, "; ".join(bad)
    return True, f"{len(streamed.deltas)} deltas join to the whole answer ({len(joined)} chars)"


@dataclass(frozen=True, slots=True)
class Streaming:
    key: ClassVar[str] = "streaming"
    title: ClassVar[str] = "Streaming: SSE deltas join to the whole answer, no split UTF-8 character"
    rule: ClassVar[str] = (
        "streamed deltas concatenate to the same request's non-streamed text, with "
        "the same tokens, finish_reason and usage; no delta splits a UTF-8 character"
    )

    def probes(self, ctx: Context) -> list[Probe]:
        mt = ctx.settings.max_tokens
        out: list[Probe] = []
        for cid, text in ctx.texts.items():
            out += pair(f"streaming/{cid}", "/completions", completion(text, mt))
        first = next(iter(ctx.texts.values()))
        out += pair("streaming/chat", "/chat/completions", chat([{"role": "user", "content": first}], mt))
        for i, s in enumerate(ctx.settings.stream_texts):
            body = completion(first, 4 * len(s.encode()) + 4, structured_outputs={"choice": [s]})
            out += pair(f"streaming/utf8-{i}", "/completions", body, {"forced": s})
        return out

    def judge(
        self, ctx: Context, probes: Sequence[Probe], oracle: Observed, candidate: Observed
    ) -> list[Verdict]:
        out = []
        for p in probes:
            if not p.id.endswith("/whole"):
                continue
            pid = p.id.rpartition("/")[0]
            ok, words = consistent(
                seen(candidate, p.id), seen(candidate, pid + "/stream"), p.meta.get("forced")
            )
            out.append(verdict(self.key, pid, ok, words))
        return out


FACETS.register(Streaming.key, help=Streaming.title)(Streaming())
