"""strict: the candidate's generated ids equal the oracle's, token for token."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.api import Case, Output, Verdict
from harness.compare.explain import engine_error, explain_divergence, unmapped
from harness.compare.kernels.planting import plant_decisive_flip, plant_truncate
from harness.compare.unit import TOKENS, ControlSet, Mutation, Unit


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (a length mismatch counts), or None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence(key: str, oracle: Output, candidate: Output, case: Case) -> Verdict | int | None:
    """An ``error`` verdict when either side failed, else the first position where the generated ids
    part (None: identical): where every comparator of generated tokens starts."""
    if (err := engine_error(key, oracle, candidate, case)) is not None:
        return err
    return first_divergence(oracle.token_ids, candidate.token_ids)


@dataclass(frozen=True, slots=True)
class Strict:
    key = "strict"
    needs_scores = False
    decode: Callable[[Sequence[int]], str] | None = None

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        if isinstance(pos := divergence(self.key, oracle, candidate, case), Verdict):
            return pos
        n = len(oracle.token_ids)
        if pos is None:
            return Verdict(case.id, self.key, "pass", f"strict pass: {n}/{n} tokens",
                           evidence={"matched": n, "tokens": n})
        if (unknown := unmapped(self.key, oracle, candidate, case, pos, self.decode)) is not None:
            return unknown
        return Verdict(
            case.id, self.key, "fail", f"strict FAIL at token {pos}/{n}",
            detail=explain_divergence(self.key, oracle, candidate, case, pos, self.decode),
            evidence={"matched": pos, "tokens": n, "first_divergence": pos},
        )


UNIT = Unit(Strict, "token for token identical", needs=TOKENS, across_devices="bits", controls=ControlSet((
    Mutation("flip decisive token", "fail", plant_decisive_flip),
    Mutation("drop last token", "fail", plant_truncate),
)))
