"""tokenizer: a server fed *text* must turn it into exactly the prompt ids the oracle was fed.

Servers that refuse token-id prompts get the case's text; their tokenizer (a GGUF's, a server's own)
then decides what the model sees. GGUF conversions do get tokenizers wrong — a missing pre-tokenizer
rule, a BOS the HF tokenizer never adds, a merge table cut short — and every logit compared after
a different prompt would blame the engine for the tokenizer. So the tokenization is verified before
any output is judged, and a mismatch is this verdict, naming the first differing prompt token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from harness.api import Case, Verdict
from harness.compare.strict import first_divergence
from harness.excerpt import INLINE, clip, first_line, tail

KEY = "tokenizer"


def _tok(decode: Callable[[Sequence[int]], str] | None, ids: Sequence[int], p: int) -> str:
    if p >= len(ids):
        return "(end of prompt)"
    tid = int(ids[p])
    if tid < 0:
        return "(a token text no single id accounts for)"
    return f"{tid} {decode([tid])!r}" if decode else str(tid)


def tokenizer_verdict(case: Case, served: Sequence[int] | None, how: str,
                      decode: Callable[[Sequence[int]], str] | None = None, why: str = "") -> Verdict:
    """``served``: the ids the server said it makes of the case's text (None: it could not say,
    ``why``); ``how``: which endpoint said so."""
    n = len(case.prompt_ids)
    if served is None:
        return Verdict(case.id, KEY, "error", first_line(f"tokenizer: not verified ({why})"),
                       detail=f"{case.id}: the server's tokenization of the prompt could not be read: {why}",
                       evidence={"how": how, "reason": why})
    pos = first_divergence(case.prompt_ids, served)
    ev = {"how": how, "prompt_tokens": n, "served_tokens": len(served)}
    if pos is None:
        return Verdict(case.id, KEY, "pass", f"tokenizer: the server makes the same {n} prompt ids ({how})",
                       evidence=ev)
    prefix = decode(case.prompt_ids[:pos]) if decode else " ".join(map(str, case.prompt_ids[:pos][-12:]))
    detail = "\n".join([
        f"{case.id}: tokenizer FAIL at prompt token {pos}/{n}: the server tokenizes the text differently",
        f"  text       : {clip(case.prompt_text, INLINE)!r}",
        f"  prefix     : {tail(prefix, INLINE)!r}",
        f"  oracle     : {_tok(decode, case.prompt_ids, pos)}",
        f"  server     : {_tok(decode, served, pos)}  ({len(served)} ids in all, oracle {n}; read via {how})",
        "  nothing of this case is judged: the two engines would not see the same prompt",
        "  fix the candidate's tokenizer (its GGUF metadata) or serve token-id prompts",
    ])
    return Verdict(case.id, KEY, "fail", f"tokenizer FAIL at prompt token {pos}/{n}", detail=detail,
                   evidence={**ev, "first_divergence": pos,
                             "oracle_id": int(case.prompt_ids[pos]) if pos < n else None,
                             "served_id": int(served[pos]) if pos < len(served) else None})
