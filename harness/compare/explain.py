"""Shared wording of verdicts: every failure names both sides, the case and the first divergence."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from harness.api import Case, Output, Verdict
from harness.excerpt import INLINE, first_line, tail

Decode = Callable[[Sequence[int]], str]

RERECORD_HINT = "if the oracle changed on purpose: make record MODEL=<model> SUITE=<suite>"


def engine_error(key: str, oracle: Output, candidate: Output, case: Case) -> Verdict | None:
    """An ``error`` verdict when either side failed to produce an output, else None."""
    for side, out in (("oracle", oracle), ("candidate", candidate)):
        if out.error is not None:
            return Verdict(case.id, key, "error", first_line(f"{side} error: {out.error}"),
                           detail=f"{side} failed on {case.id}:\n{out.error}", evidence={"side": side})
    return None


def unmapped(key: str, oracle: Output, candidate: Output, case: Case, pos: int,
             decode: Decode | None) -> Verdict | None:
    """An ``error`` verdict when the candidate's token at the first divergence ``pos`` is a token text
    several ids render as (a text-keyed server, see harness.engines.openai.token_text): its id is unknown,
    so neither a pass nor a fail would be true."""
    if pos >= len(candidate.token_ids) or candidate.token_ids[pos] >= 0:
        return None
    n = len(oracle.token_ids)
    return Verdict(case.id, key, "error", f"{key}: candidate token {pos}/{n} is a text several ids share",
                   detail=explain_divergence(key, oracle, candidate, case, pos, decode, [
                       "the server named this token by its text only, and several ids render as that "
                       "text: its id is unknown, so this case is judged only up to here"]),
                   evidence={"kind": "unmapped", "matched": pos, "tokens": n, "first_divergence": pos})


def _tok(decode: Decode | None, tid: int) -> str:
    if tid < 0:  # a token text no single id accounts for (harness.engines.openai.token_text.UNMAPPED)
        return f"{tid} (a token text several ids render as: id unknown)"
    return f"{tid} {decode([tid])!r}" if decode else str(tid)


def format_topk(out: Output, pos: int, decode: Decode | None) -> str:
    if not out.has_logprobs or out.top_ids is None or out.top_logprobs is None or pos >= len(out.top_ids):
        return "(no logprobs)"
    items = ", ".join(f"{_tok(decode, int(t))} {float(lp):.2f}"
                      for t, lp in zip(out.top_ids[pos], out.top_logprobs[pos], strict=True))
    return f"top{out.top_ids.shape[1]} [{items}]"


def explain_divergence(key: str, oracle: Output, candidate: Output, case: Case, pos: int,
                       decode: Decode | None, extra: Sequence[str] = ()) -> str:
    n = len(oracle.token_ids)
    prefix_ids = oracle.token_ids[:pos]
    prefix = decode(prefix_ids) if decode else " ".join(map(str, prefix_ids[-12:]))
    o = _tok(decode, oracle.token_ids[pos]) if pos < n else "(end of output)"
    c = (_tok(decode, candidate.token_ids[pos]) if pos < len(candidate.token_ids)
         else "(end of output)")
    lines = [
        f"{case.id}: {key} FAIL at token {pos}/{n}",
        f"  prefix     : {tail(prefix, INLINE)!r}",
        f"  oracle     : {o}  {format_topk(oracle, pos, decode)}",
        f"  candidate  : {c}",
        *[f"  {e}" for e in extra],
        f"  {RERECORD_HINT}",
    ]
    return "\n".join(lines)
