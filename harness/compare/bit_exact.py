"""bit-exact: the same tokens AND the same logprobs, bit for bit (float32 bit patterns).

What an engine feature that "must not change one token" promises, read strictly: strict compares
ids only, so a kernel that moves every logprob by one ulp would pass it. Here the generated ids,
the chosen token's logprob and the top-k ids and logprobs must all be equal at every position.
Compare bits only between runs on one device class: the same program gives other bits on another
CPU or GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from harness.api import Case, Output, Verdict
from harness.compare.explain import explain_divergence, format_topk
from harness.compare.kernels.planting import decisive, plant_decisive_flip, plant_identity, top_rows
from harness.compare.strict import divergence
from harness.compare.unit import TOKENS, ControlSet, Mutation, Needs, Planted, Unit
from harness.excerpt import INLINE, tail


def bits(a: np.ndarray | None) -> np.ndarray | None:
    """float32 bit patterns (so -0.0 != 0.0 and every NaN payload counts)."""
    return None if a is None else np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32)


def logprob_differences(oracle: Output, candidate: Output, upto: int) -> dict[str, Any]:
    """Where the logprob arrays of two outputs differ in their first ``upto`` positions.

    ``positions``: positions whose chosen logprob, top-k ids or top-k logprobs differ; ``first``;
    ``max_abs_chosen`` and ``max_abs_topk`` (nats, over positions whose top-k ids agree);
    ``shape`` when the arrays cannot be compared at all."""
    o_c, c_c = bits(oracle.chosen_logprobs), bits(candidate.chosen_logprobs)
    if o_c is None or c_c is None or oracle.top_ids is None or candidate.top_ids is None:
        return {"shape": "one side has no logprobs"}
    n = min(upto, len(o_c), len(c_c), len(oracle.top_ids), len(candidate.top_ids))
    if oracle.top_ids.shape[1] != candidate.top_ids.shape[1]:
        return {"shape": f"top-k widths differ: {oracle.top_ids.shape[1]} vs {candidate.top_ids.shape[1]}"}
    ids_diff = (oracle.top_ids[:n] != candidate.top_ids[:n]).any(axis=1)
    lp_diff = (bits(oracle.top_logprobs)[:n] != bits(candidate.top_logprobs)[:n]).any(axis=1)  # type: ignore[index]
    ch_diff = o_c[:n] != c_c[:n]
    where = np.nonzero(ids_diff | lp_diff | ch_diff)[0]
    with np.errstate(invalid="ignore"):
        d_ch = np.abs(np.asarray(oracle.chosen_logprobs, np.float64)[:n]
                      - np.asarray(candidate.chosen_logprobs, np.float64)[:n])
        same = ~ids_diff
        d_top = np.abs(np.asarray(oracle.top_logprobs, np.float64)[:n][same]
                       - np.asarray(candidate.top_logprobs, np.float64)[:n][same])
    finite = lambda x: float(np.nanmax(x)) if x.size and np.isfinite(x).any() else 0.0  # noqa: E731
    return {"positions": int(where.size), "compared": int(n),
            "first": int(where[0]) if where.size else None,
            "max_abs_chosen": finite(d_ch), "max_abs_topk": finite(d_top),
            "topk_ids_differ": int(ids_diff.sum())}


@dataclass(frozen=True, slots=True)
class BitExact:
    key = "bit_exact"
    needs_scores = False
    decode: Callable[[Sequence[int]], str] | None = None

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        if isinstance(pos := divergence(self.key, oracle, candidate, case), Verdict):
            return pos
        n = len(oracle.token_ids)
        upto = n if pos is None else pos
        lp = logprob_differences(oracle, candidate, upto)
        ev: dict[str, Any] = {"matched": upto, "tokens": n, "first_divergence": pos,
                              "first_logprob_difference": lp.get("first"),
                              "logprob_positions_differ": lp.get("positions"),
                              "max_abs_chosen_logprob": lp.get("max_abs_chosen"),
                              "max_abs_topk_logprob": lp.get("max_abs_topk")}
        if "shape" in lp:
            return Verdict(case.id, self.key, "error", f"bit-exact cannot compare logprobs: {lp['shape']}",
                           evidence={**ev, "problem": lp["shape"]})
        if pos is not None:
            where = (f"; logprobs first differ at token {lp['first']}" if lp["first"] is not None
                     and lp["first"] < pos else "")
            return Verdict(case.id, self.key, "fail", f"bit-exact FAIL: tokens differ at {pos}/{n}{where}",
                           detail=explain_divergence(self.key, oracle, candidate, case, pos, self.decode),
                           evidence=ev)
        if lp["positions"]:
            t = int(lp["first"])
            return Verdict(case.id, self.key, "fail",
                           f"bit-exact FAIL: tokens equal, logprobs differ at {lp['positions']}/{n} "
                           f"positions from token {t} (max |Δ| {lp['max_abs_chosen']:.3g} nats)",
                           detail=self._explain_logprobs(oracle, candidate, case, t), evidence=ev)
        return Verdict(case.id, self.key, "pass", f"bit-exact: {n}/{n} tokens, logprobs equal",
                       evidence=ev)

    def _explain_logprobs(self, oracle: Output, candidate: Output, case: Case, t: int) -> str:
        o = float(np.asarray(oracle.chosen_logprobs)[t])  # type: ignore[arg-type]
        c = float(np.asarray(candidate.chosen_logprobs)[t])  # type: ignore[arg-type]
        ulps = abs(int(bits(np.float32([o]))[0]) - int(bits(np.float32([c]))[0]))  # type: ignore[index]
        prefix = self.decode(oracle.token_ids[:t]) if self.decode else " ".join(
            map(str, oracle.token_ids[max(0, t - 12):t]))
        return "\n".join([
            f"{case.id}: {self.key} FAIL at token {t}/{len(oracle.token_ids)}: same token, other logprobs",
            f"  prefix     : {tail(prefix, INLINE)!r}",
            f"  token      : {oracle.token_ids[t]}",
            f"  oracle     : chosen {o!r}  {format_topk(oracle, t, self.decode)}",
            f"  candidate  : chosen {c!r}  {format_topk(candidate, t, self.decode)}",
            f"  gap        : {abs(o - c):.3g} nats ({ulps} ulp) on the chosen token"])


def plant_one_ulp(comp: Any, case: Case, oracle: Output) -> Planted | str:
    """The same tokens; the chosen logprob (and its top-k entry) one float32 ulp lower at the
    decisive position: only a comparator of logprob bits can see it."""
    r = top_rows(oracle)
    if r is None or oracle.chosen_logprobs is None:
        return "the golden has no logprobs"
    if not oracle.token_ids:
        return "the golden generation is empty"
    t = min(decisive(oracle), len(oracle.chosen_logprobs) - 1)
    chosen = np.array(oracle.chosen_logprobs, np.float32, copy=True)
    old = chosen[t]
    chosen[t] = np.nextafter(old, np.float32(-np.inf))
    lp = np.array(oracle.top_logprobs, np.float32, copy=True)
    lp[t][(r[0][t] == oracle.token_ids[t]) & (lp[t] == old)] = chosen[t]
    return Planted(oracle, replace(oracle, chosen_logprobs=chosen, top_logprobs=lp),
                   f"position {t}: {float(old)!r} -> {float(chosen[t])!r}")


UNIT = Unit(BitExact, "the same tokens and the same logprobs, bit for bit", needs=TOKENS,
            across_devices="bits", controls=ControlSet(needs=Needs(logprobs=True), mutations=(
                Mutation("flip decisive token", "fail", plant_decisive_flip),
                Mutation("one logprob one ulp lower", "fail", plant_one_ulp),
                Mutation("unperturbed copy", "pass", plant_identity),
            )))
