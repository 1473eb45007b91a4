"""Chat template: the prompt a server builds from a conversation is transformers'
``apply_chat_template(..., add_generation_prompt=True)`` token for token; multi-turn prefix
preservation (the render of turns 1..k is a prefix of the render of 1..k+1)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from harness.api import Verdict
from harness.kinds.api.facets.base import FACETS, Context, Observed, Probe, chat, seen, verdict
from harness.kinds.api.views import View, first_difference

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                    "unit": {"type": "string", "enum": ["C", "F"]},
                    "days": {"type": "integer", "enum": [1, 2, 3]},
                },
                "required": ["city", "unit", "days"],
            },
            "strict": True,
        },
    }
]
"""One tool whose every argument is an enum, ``strict`` so that a server constrains the arguments to
its schema (vLLM's hermes parser lets them be any JSON, ``null`` included, without it). The fields are
in the order of the OpenAI schema (vLLM renders a tool re-serialized in that order)."""


def no_free_whitespace(ref: Any) -> dict[str, float]:
    """``logit_bias`` pushing down every token that is only whitespace: a JSON grammar allows free
    whitespace, and random weights fill it with tabs until ``max_tokens``; a token the grammar forces
    (a space inside a literal) is still taken, being the only one allowed."""
    ids = [
        i
        for i in range(len(ref.tokenizer))
        if not ref.piece(i).strip() and ref.piece(i) and i not in ref.special_ids()
    ]
    return {str(i): -100.0 for i in ids}


def conversations(
    texts: Sequence[str],
) -> dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    """id -> (messages, tools): a system turn, several turns, and a tool call with its reply."""
    a, b, c = (list(texts) * 3)[:3]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "C", "days": 2}'},
    }
    return {
        "system": ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": a}], None),
        "multi_turn": (
            [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": a},
                {"role": "assistant", "content": b},
                {"role": "user", "content": c},
                {"role": "assistant", "content": a},
                {"role": "user", "content": b},
            ],
            None,
        ),
        "tool_reply": (
            [
                {"role": "user", "content": a},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 7}'},
                {"role": "user", "content": c},
            ],
            TOOLS,
        ),
    }


def rendered(ref: Any, messages: Sequence[Mapping[str, Any]], tools: Any) -> dict[str, Any]:
    """A probe's meta: the reference render of a conversation, or why the model's own chat template
    refuses it (SmolLM2's concatenates ``message['content']``, so the ``null`` content of an assistant
    turn holding a tool call raises): the row then says so, and the run goes on."""
    try:
        return {"reference": ref.render(messages, tools)}
    except Exception as e:  # a template raises whatever its own expressions raise (TypeError, jinja's)
        return {"refused": f"{type(e).__name__}: {e}"}


def refused(p: Probe, c: View) -> Verdict | None:
    """The row of a conversation the model's template refuses: nothing to compare the server's prompt
    with (``skip``), saying what the template raised and what the server did with it."""
    why = p.meta.get("refused")
    if why is None:
        return None
    server = (
        f"the server refused it too ({c.error})"
        if not c.ok
        else "the server answered it anyway"
        + (f" ({c.usage['prompt_tokens']} prompt tokens)" if c.usage and "prompt_tokens" in c.usage else "")
    )
    return verdict(
        p.facet,
        p.id,
        "skip",
        f"the model's chat template refuses this conversation (transformers: {why}); {server}",
        template_refuses=why,
    )


def evidence(v: View, expected: Sequence[int]) -> tuple[str, bool | None, str]:
    """(which evidence the reply gave, does it match the reference — None: none —, in words)."""
    if v.prompt_ids is not None:
        i = first_difference(v.prompt_ids, expected)
        if i is None:
            return "prompt_token_ids", True, f"{len(expected)} prompt tokens equal the reference"
        return (
            "prompt_token_ids",
            False,
            (
                f"prompt differs from apply_chat_template at token {i}/{len(expected)}: server "
                f"{list(v.prompt_ids[max(0, i - 2) : i + 3])} "
                f"reference {list(expected[max(0, i - 2) : i + 3])}"
            ),
        )
    n = v.usage.get("prompt_tokens") if v.usage else None
    if isinstance(n, int):
        same = n == len(expected)
        return (
            "usage.prompt_tokens",
            same,
            (
                f"usage.prompt_tokens {n} vs {len(expected)} reference tokens "
                "(count only: the server returns no prompt ids)"
            ),
        )
    return "none", None, "the server returns neither prompt ids nor usage"


@dataclass(frozen=True, slots=True)
class Template:
    key: ClassVar[str] = "template"
    title: ClassVar[str] = "Chat template: prompt ids equal apply_chat_template, prefix preserved"
    rule: ClassVar[str] = (
        "the prompt a server builds from a conversation (system, multi-turn, tool "
        "messages) equals apply_chat_template(add_generation_prompt=True) token for "
        "token; turns 1..k render as a prefix of turns 1..k+1"
    )

    def probes(self, ctx: Context) -> list[Probe]:
        out = []
        for cid, (msgs, tools) in conversations(list(ctx.texts.values())).items():
            body = chat(msgs, 1, **({"tools": tools} if tools else {}))
            meta = rendered(ctx.reference, msgs, tools)
            out.append(Probe(f"template/{cid}", self.key, "/chat/completions", body, meta=meta))
        return out

    def judge(
        self, ctx: Context, probes: Sequence[Probe], oracle: Observed, candidate: Observed
    ) -> list[Verdict]:
        out = []
        for p in probes:
            c = seen(candidate, p.id)
            if (finding := refused(p, c)) is not None:
                out.append(finding)
                continue
            ref = list(p.meta["reference"])
            if not c.ok:
                out.append(verdict(self.key, p.id, False, f"no answer: {c.error}"))
                continue
            source, same, words = evidence(c, ref)
            status = "skip" if same is None else bool(same)
            out.append(verdict(self.key, p.id, status, words, evidence=source, reference_tokens=len(ref)))
        out.append(self._prefix(ctx, candidate))
        return out

    def _prefix(self, ctx: Context, candidate: Observed) -> Verdict:
        msgs, _ = conversations(list(ctx.texts.values()))["multi_turn"]
        ref = ctx.reference
        broken = []
        for k in range(2, len(msgs)):
            head, longer = (
                ref.render(msgs[:k], generation_prompt=False),
                ref.render(msgs[: k + 1], generation_prompt=False),
            )
            if longer[: len(head)] != head:
                broken.append(k)
        if broken:
            return verdict(
                self.key,
                "template/prefix",
                False,
                f"the template breaks multi-turn prefix preservation after turns {broken}",
                broken_after=broken,
            )
        c = seen(candidate, "template/multi_turn")
        head = ref.render(msgs[:-1], generation_prompt=False)
        if c.prompt_ids is None:
            return verdict(
                self.key,
                "template/prefix",
                True,
                f"turns 1..k render as a prefix of 1..k+1 for k < {len(msgs)} (reference; "
                "the server returns no prompt ids)",
            )
        ok = tuple(c.prompt_ids[: len(head)]) == tuple(head)
        return verdict(
            self.key,
            "template/prefix",
            ok,
            f"the server's prompt for {len(msgs)} turns "
            + ("starts with" if ok else "does not start with")
            + f" the render of the first {len(msgs) - 1} ({len(head)} tokens)",
        )


FACETS.register(Template.key, help=Template.title)(Template())
