"""near-tie: a divergence is forgiven only where the oracle itself was nearly undecided.

Nothing after the first divergence is judged: the prefixes differ from there. At the first divergent
position the case passes iff the candidate's token is in the oracle's top-k AND the oracle's logprob
gap (its chosen token minus the candidate's token) is at most ``threshold_nats``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from harness.api import Case, Output, Verdict
from harness.compare.explain import engine_error, explain_divergence, unmapped
from harness.compare.strict import first_divergence


@dataclass(frozen=True, slots=True)
class NearTie:
    key = "near_tie"
    needs_scores = False
    threshold_nats: float = 0.5
    decode: Callable[[Sequence[int]], str] | None = None

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        if (err := engine_error(self.key, oracle, candidate, case)) is not None:
            return err
        n = len(oracle.token_ids)
        pos = first_divergence(oracle.token_ids, candidate.token_ids)
        if pos is None:
            return Verdict(case.id, self.key, "pass", f"exact: {n}/{n} tokens",
                           evidence={"kind": "exact", "matched": n, "tokens": n})
        if (unknown := unmapped(self.key, oracle, candidate, case, pos, self.decode)) is not None:
            return unknown
        base = {"matched": pos, "tokens": n, "first_divergence": pos,
                "threshold_mnats": round(self.threshold_nats * 1000, 3)}
        if pos >= n or pos >= len(candidate.token_ids):
            short = "candidate" if pos >= len(candidate.token_ids) else "oracle"
            return Verdict(case.id, self.key, "fail", f"{short} output ended at token {pos}/{n}",
                           detail=explain_divergence(self.key, oracle, candidate, case, pos, self.decode),
                           evidence={**base, "kind": "length"})
        if oracle.top_ids is None or oracle.top_logprobs is None or oracle.chosen_logprobs is None:
            return Verdict(case.id, self.key, "error",
                           "oracle has no logprobs: near-tie cannot judge",
                           evidence={**base, "kind": "no-logprobs"})
        cand_tok = candidate.token_ids[pos]
        hits = np.nonzero(oracle.top_ids[pos] == cand_tok)[0]
        k = int(oracle.top_ids.shape[1])
        if hits.size == 0:
            extra = [f"gap        : candidate token not in oracle top{k} -> not a near-tie"]
            return Verdict(case.id, self.key, "fail", f"near-tie FAIL at token {pos}/{n}: not in top{k}",
                           detail=explain_divergence(self.key, oracle, candidate, case, pos,
                                                     self.decode, extra),
                           evidence={**base, "kind": "not-in-topk", "k": k})
        gap = float(oracle.chosen_logprobs[pos]) - float(oracle.top_logprobs[pos][hits[0]])
        mn = round(gap * 1000, 3)
        ev = {**base, "kind": "tie" if gap <= self.threshold_nats else "beyond", "gap_mnats": mn,
              "rank": int(hits[0])}
        bar = f"(near-tie bar {self.threshold_nats * 1000:.0f})"
        if gap <= self.threshold_nats:
            return Verdict(case.id, self.key, "pass", f"near-tie at token {pos}/{n}: gap {mn:.0f} mnats",
                           evidence=ev)
        extra = [f"gap        : {mn:.0f} mnats {bar} -> not a near-tie"]
        return Verdict(case.id, self.key, "fail", f"near-tie FAIL at token {pos}/{n}: gap {mn:.0f} mnats",
                       detail=explain_divergence(self.key, oracle, candidate, case, pos, self.decode, extra),
                       evidence=ev)
