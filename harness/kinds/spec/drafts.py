"""Which positions of a continuation a speculative engine drafts, and what it drafts there.

vLLM's V1 schedule, step by step: the prefill samples position 0 (never drafted); after every step
the drafter proposes up to k tokens from the context so far; the next step verifies them in order —
a drafted token is accepted or replaced (the replacement is never the drafted token), and the
first replacement ends the window; when every drafted token is accepted, the step also emits a
**bonus** token (no draft); a step with no proposal is a plain decode. So, given the tokens a draw
emitted, each position's role is fixed by the tokens before it: ``plain``, ``draft`` (with its
drafted token: the draw accepted it iff it emitted it) or ``bonus``.

The drafter is a callable ``context -> proposal``: for ``ngram`` the engine's own lookup
(:func:`ngram_drafter`, vLLM's function, run on the host), so the roles are the engine's. Replayed
over the greedy pass, the schedule predicts vLLM's counters (drafts, drafted and accepted tokens):
the record puts both side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Drafter = Callable[[Sequence[int]], Sequence[int]]
Role = Literal["plain", "draft", "bonus"]


@dataclass(frozen=True, slots=True)
class Slot:
    role: Role
    draft: int | None = None


def schedule(prompt: Sequence[int], tokens: Sequence[int], propose: Drafter) -> list[Slot]:
    """The role of each position of ``tokens`` (emitted after ``prompt``)."""
    out: list[Slot] = []
    ctx = list(prompt)
    i = 0
    while i < len(tokens):
        if i == 0:
            out.append(Slot("plain"))
            ctx.append(int(tokens[0]))
            i = 1
            continue
        proposal = [int(t) for t in propose(ctx)]
        if not proposal:
            out.append(Slot("plain"))
            ctx.append(int(tokens[i]))
            i += 1
            continue
        accepted_all = True
        for d in proposal:
            if i >= len(tokens):
                break
            out.append(Slot("draft", d))
            ctx.append(int(tokens[i]))
            i += 1
            if int(tokens[i - 1]) != d:
                accepted_all = False
                break
        if accepted_all and i < len(tokens):
            out.append(Slot("bonus"))
            ctx.append(int(tokens[i]))
            i += 1
    return out


def counts(prompt: Sequence[int], tokens: Sequence[int], propose: Drafter) -> dict[str, int]:
    """What the schedule of one continuation adds to vLLM's counters: proposals (``drafts``),
    drafted tokens, accepted tokens, and the positions emitted."""
    ctx = list(prompt)
    drafts = drafted = accepted = 0
    i = 0
    while i < len(tokens):
        if i == 0:
            ctx.append(int(tokens[0]))
            i = 1
            continue
        proposal = [int(t) for t in propose(ctx)]
        if not proposal:
            ctx.append(int(tokens[i]))
            i += 1
            continue
        drafts += 1
        drafted += len(proposal)
        ok = True
        for d in proposal:
            if i >= len(tokens):
                ok = False
                break
            hit = int(tokens[i]) == d
            ctx.append(int(tokens[i]))
            i += 1
            if not hit:
                ok = False
                break
            accepted += 1
        if ok and i < len(tokens):
            ctx.append(int(tokens[i]))
            i += 1
    return {"drafts": drafts, "draft_tokens": drafted, "accepted_tokens": accepted, "emitted": len(tokens)}


def ngram_drafter(config: Mapping[str, Any], max_model_len: int) -> Drafter:
    """vLLM's own n-gram lookup with the suite's ``prompt_lookup_min``/``_max`` and k."""
    import numpy as np
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as find

    lo, hi = int(config.get("prompt_lookup_min", 1)), int(config.get("prompt_lookup_max", 3))
    k = int(config.get("num_speculative_tokens", 1))

    def propose(ctx: Sequence[int]) -> list[int]:
        return [int(t) for t in find(np.asarray(ctx, np.int32), lo, hi, max_model_len, k)]

    return propose


def lookup_drafter(config: Mapping[str, Any]) -> Drafter:
    """llama-cpp-python's prompt lookup (``LlamaPromptLookupDecoding(max_ngram_size=prompt_lookup_max,
    num_pred_tokens=k)``), restated: for n from ``prompt_lookup_max`` down to 1, the context's last n
    tokens are looked up from its start; the first occurrence followed by anything proposes up to k
    of the tokens after it. ``prompt_lookup_min`` plays no part (n goes down to 1)."""
    hi = int(config.get("prompt_lookup_max", 2))
    k = int(config.get("num_speculative_tokens", 1))

    def propose(ctx: Sequence[int]) -> list[int]:
        seq = [int(t) for t in ctx]
        size = len(seq)
        for n in range(min(hi, size - 1), 0, -1):
            tail = seq[size - n :]
            for at in range(size - n):  # an occurrence that ends before the context does
                if seq[at : at + n] == tail:
                    return seq[at + n : at + n + k]
        return []

    return propose


def drafter_for(config: Mapping[str, Any], max_model_len: int, family: str = "vllm") -> Drafter | None:
    """The drafter whose proposals the host can replay — vLLM's n-gram lookup, llama-cpp-python's
    prompt lookup (whose ``generate`` verifies on vLLM's schedule) — or None: a draft model's
    proposals depend on its own sampling, and transformers' prompt lookup stops drafting before the
    last token, so their positions are judged without attribution."""
    if config.get("method") != "ngram":
        return None
    if family == "vllm":
        return ngram_drafter(config, max_model_len)
    return lookup_drafter(config) if family == "llamacpp" else None
