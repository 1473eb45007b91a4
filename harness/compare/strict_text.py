"""strict on text: for candidates that return no token ids (a text-only server or CLI).

Weaker than :mod:`harness.compare.strict`: two different id sequences can decode to the same text.
The gate uses it in place of ``strict`` only when the candidate's capabilities say it has no ids,
and the verdict says it judged text.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.api import Case, Output, Verdict
from harness.compare.explain import RERECORD_HINT, engine_error
from harness.excerpt import INLINE, tail


def first_text_divergence(a: str, b: str) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True, slots=True)
class StrictText:
    key = "strict"
    needs_scores = False

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        if (err := engine_error(self.key, oracle, candidate, case)) is not None:
            return err
        n = len(oracle.text)
        pos = first_text_divergence(oracle.text, candidate.text)
        ev = {"mode": "text", "chars": n}
        if pos is None:
            return Verdict(case.id, self.key, "pass", f"strict (text) pass: {n}/{n} chars",
                           evidence={**ev, "matched_chars": n})
        detail = "\n".join([
            f"{case.id}: strict (text only: the candidate returns no token ids) FAIL at char {pos}/{n}",
            f"  prefix     : {tail(oracle.text[:pos], INLINE)!r}",
            f"  oracle     : {oracle.text[pos:pos + 40]!r}",
            f"  candidate  : {candidate.text[pos:pos + 40]!r}",
            f"  {RERECORD_HINT}",
        ])
        return Verdict(case.id, self.key, "fail", f"strict (text) FAIL at char {pos}/{n}", detail=detail,
                       evidence={**ev, "matched_chars": pos, "first_divergence_char": pos})
