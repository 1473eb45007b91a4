"""Draws -> verdicts: support checks, goodness of fit under Holm, determinism, logprobs.

Per test (a verdict named ``sampling.<parameter>``, case id ``<case>@<t>/<setting>``):

1. **support** (no statistics): a token the reference gives probability 0 — outside the top-k, the
   nucleus, the min-p set — drawn even once fails the test, naming the token, its rank in the
   oracle's raw distribution and how often it came. Borderline tokens
   (:mod:`harness.sampling.transforms`) are exempt.
2. **fit**: the draws that followed the oracle's path, less borderline tokens (conditioning on "not
   borderline" leaves the other tokens' distribution unchanged whatever the engine decided), against
   the reference renormalised the same way (:mod:`harness.kinds.sampling.gof`); Holm over every fit of
   the record at ``alpha``.

Beside them, ``sampling.seed`` (the same seed twice gives the same tokens; alone and inside a batch,
where the engine promises per-request seeds) and ``sampling.logprobs`` (the logprob the engine
returns for each drawn token against the reference of the mode it claims: raw, or processed = the
distribution it drew from).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.abilities import SamplerTraits, Samples
from harness.api import Status, Verdict
from harness.kinds.sampling import gof
from harness.kinds.sampling.plan import Plan, Test
from harness.sampling.transforms import log_softmax

Decode = Callable[[Sequence[int]], str]
SEED = "sampling.seed"
LOGPROBS = "sampling.logprobs"
SHOW = 8
"""Cells and violations a failing verdict's detail lists."""


def comparator(test: Test) -> str:
    return f"sampling.{test.setting.param}"


@dataclass(frozen=True, slots=True, eq=False)
class Outcome:
    """One test's statistics before Holm."""

    test: Test
    n_eff: int = 0
    fit: gof.Fit | None = None
    cells: gof.Cells | None = None
    violations: tuple[tuple[int, int, int, int], ...] = ()
    """(step, token, rank in the oracle's raw distribution, times drawn)."""
    detectable_tv: float = 1.0
    counts: np.ndarray | None = None
    error: str | None = None
    borderline_draws: int = 0


def _rank(raw: np.ndarray, token: int) -> int:
    return 1 + int(np.sum(raw > raw[token]))


def _on_path(tokens: np.ndarray, path: Sequence[int], j: int) -> np.ndarray:
    """Rows whose first j tokens are the oracle's path."""
    if j == 0:
        return np.ones(len(tokens), bool)
    return np.all(tokens[:, :j] == np.asarray(path[:j], tokens.dtype), axis=1)


def outcome(
    test: Test, s: Samples | None, level: float, power: float | None, min_expected: float, max_cells: int
) -> Outcome:
    """Support check and fit of one test's draws (Holm comes later, over all of them); ``power``
    None: skip the detectable TV (the false-positive loop does not report it)."""
    if s is None:
        return Outcome(test, error="the engine returned no draws for this test")
    if s.error:
        return Outcome(test, error=s.error)
    tokens = np.asarray(s.tokens)
    if tokens.ndim != 2 or tokens.shape[1] < test.setting.step + 1 or len(tokens) != test.draws:
        return Outcome(
            test,
            error=f"the engine returned draws of shape {tokens.shape}, expected "
            f"[{test.draws}, {test.setting.step + 1}]",
        )
    viol = []
    for j, ref in enumerate(test.references):
        rows = _on_path(tokens, test.path, j)
        got = tokens[rows, j]
        got = got[got >= 0]
        bad = got[(ref.probs[got] <= 0) & ~np.isin(got, ref.borderline)]
        for tok, cnt in zip(*np.unique(bad, return_counts=True), strict=True):
            viol.append((j, int(tok), _rank(test.raw[j], int(tok)), int(cnt)))
    ref = test.reference
    rows = _on_path(tokens, test.path, test.setting.step)
    got = tokens[rows, test.setting.step]
    got = got[got >= 0]
    border = np.isin(got, ref.borderline)
    inside = got[~border & (ref.probs[got] > 0)][: test.judged]  # the first `judged` on the path
    q, ranked = ref.probs, ref.ranked
    if ref.borderline:
        q = q.copy()
        q[list(ref.borderline)] = 0.0
        q, ranked = (q / q.sum(), None) if q.sum() > 0 else (ref.probs, ref.ranked)
    counts = np.bincount(inside, minlength=q.size)[: q.size]
    cells = (
        test.planned
        if inside.size == test.planned.n and not ref.borderline
        else gof.cells_for(q, int(inside.size), min_expected, max_cells, ranked)
    )
    f = gof.fit(cells, counts, level)
    det = gof.detectable_tv(cells, level, power) if power is not None else float("nan")
    return Outcome(test, int(inside.size), f, cells, tuple(viol), det, counts, None, int(border.sum()))


def statistics(
    plan: Plan, main: Mapping[str, Samples], power: float | None | bool = True
) -> tuple[list[Outcome], list[bool], list[float]]:
    """Every test's outcome, and Holm's decisions and adjusted p over the fits."""
    gs = plan.gs
    pw = gs.power if power is True else (power or None)
    outs = [
        outcome(t, main.get(t.id), plan.level, pw, gs.min_expected, gs.max_cells)
        for t in plan.tests
        if t.runs
    ]
    fitted = [i for i, o in enumerate(outs) if o.fit is not None and o.fit.method != "none"]
    rej, adj = gof.holm([outs[i].fit.p for i in fitted], gs.alpha)  # type: ignore[union-attr]
    rejected, adjusted = [False] * len(outs), [1.0] * len(outs)
    for k, i in enumerate(fitted):
        rejected[i], adjusted[i] = rej[k], adj[k]
    return outs, rejected, adjusted


def failed(outs: Sequence[Outcome], rejected: Sequence[bool]) -> list[int]:
    """Indexes of the tests that fail: a support violation or a fit Holm rejects."""
    return [i for i, o in enumerate(outs) if o.violations or rejected[i]]


def _tok(decode: Decode | None, t: int) -> str:
    return f"{t} {decode([t])!r}" if decode is not None else str(t)


def test_verdict(o: Outcome, rejected: bool, p_holm: float, decode: Decode | None) -> Verdict:
    t = o.test
    name, where = comparator(t), f"{t.case_id}@{t.position} ({t.setting.id}"
    where += f", step {t.setting.step})" if t.setting.step else ")"
    if o.error:
        return Verdict(t.id, name, "error", f"{name} {where}: {o.error}", o.error, {"draws": t.draws})
    assert o.fit is not None and o.cells is not None
    ev: dict[str, Any] = {
        "setting": t.setting.to_json(),
        "position": t.position,
        "draws": t.draws,
        "judged_draws": o.n_eff,
        "p_path": t.p_path,
        "method": o.fit.method,
        "cells": o.fit.cells,
        "stat": o.fit.stat,
        "df": o.fit.df,
        "p": o.fit.p,
        "p_holm": p_holm,
        "observed_tv": o.fit.observed_tv,
        "detectable_tv": o.detectable_tv,
        "judged_target": t.judged,
        "calibration": o.fit.calibration,
        "support": int((t.reference.probs > 0).sum()),
        "borderline": list(t.reference.borderline),
        "borderline_draws": o.borderline_draws,
        "violations": [{"step": j, "token": tok, "rank": r, "count": c} for j, tok, r, c in o.violations],
    }
    lines = []
    if o.violations:
        status: Status = "fail"
        j, tok, r, c = o.violations[0]
        head = (
            f"{name} FAIL {where}: token {_tok(decode, tok)} (rank {r} in the oracle's raw distribution) "
            f"drawn {c}x outside the support of {ev['support']} tokens"
        )
        lines += [
            f"outside the support: step {j}, token {_tok(decode, tok)}, rank {r}, drawn {c}x"
            for j, tok, r, c in o.violations[:SHOW]
        ]
    elif o.n_eff == 0:
        return Verdict(
            t.id,
            name,
            "skip",
            f"{name} {where}: no draw followed the oracle's path (p {t.p_path:.3g} of {t.draws})",
            evidence=ev,
        )
    else:
        status = "fail" if rejected else "pass"
        verb = "FAIL" if rejected else "pass"
        head = (
            f"{name} {verb} {where}: "
            + (
                f"p {o.fit.p:.3g} (Holm {p_holm:.3g}), "
                if o.fit.method != "none"
                else "one token in the support, "
            )
            + f"TV {o.fit.observed_tv:.3f} observed, {o.detectable_tv:.3f} detectable, {o.n_eff} draws"
        )
    if status == "fail" and o.counts is not None:
        n = max(o.n_eff, 1)
        for m, pr in list(zip(o.cells.members, o.cells.probs, strict=True))[:SHOW]:
            label = _tok(decode, int(m[0])) if len(m) == 1 else f"{len(m)} tokens pooled"
            lines.append(f"  {label:<28} reference {pr:.4f}  drawn {o.counts[m].sum() / n:.4f}")
    return Verdict(t.id, name, status, head, "\n".join(lines), ev)


def determinism(
    plan: Plan, results: Mapping[str, Mapping[str, Samples]], traits: SamplerTraits
) -> list[Verdict]:
    """``sampling.seed``: the same seed twice (``repeat``) and alone vs in the batch (``alone``)."""
    out = []
    promise = {"request": "every request has its own seeded generator", "call": "", "serial": ""}[
        traits.seed_scope
    ]
    for lane, what in (("repeat", "the same seed twice"), ("alone", "alone vs inside the batch")):
        if lane == "alone" and traits.seed_scope != "request":
            why = (
                "one generator per call: a draw depends on the rest of the batch, and the engine does "
                "not promise otherwise"
                if traits.seed_scope == "call"
                else "the engine draws one request at a time: there is no batch"
            )
            out.append(Verdict(lane, SEED, "skip", f"{SEED} {what}: not promised ({why})",
                               evidence={"not_promised": why}))
            continue
        got = results.get(lane)
        if got is None:
            out.append(Verdict(lane, SEED, "skip", f"{SEED} {what}: the lane did not run"))
            continue
        diff, total, ev = [], 0, {}
        for t in plan.det:
            a, b = results["main"].get(f"{t.id}#det"), got.get(f"{t.id}#det")
            if a is None or b is None or a.error or b.error:
                diff.append(f"{t.setting.id}: missing ({(a and a.error) or (b and b.error) or 'no draws'})")
                continue
            same = np.all(np.asarray(a.tokens) == np.asarray(b.tokens), axis=1)
            total += len(same)
            ev[t.setting.id] = int((~same).sum())
            if not same.all():
                i = int(np.flatnonzero(~same)[0])
                diff.append(
                    f"{t.setting.id} at {t.case_id}@{t.position}: draw {i} (seed {t.seed + i}) gave "
                    f"{list(np.asarray(a.tokens)[i])} then {list(np.asarray(b.tokens)[i])}"
                )
        status: Status = "fail" if diff else "pass"
        head = (
            f"{SEED} {what}: {'FAIL' if diff else 'pass'}: {total - sum(ev.values())}/{total} draws "
            f"identical over {len(plan.det)} settings" + (f" ({promise})" if lane == "alone" else "")
        )
        detail = diff[:SHOW] + ([f"why it may: {traits.seed_hint}"] if diff and traits.seed_hint else [])
        out.append(Verdict(lane, SEED, status, head, "\n".join(detail), {"differing": ev, "draws": total}))
    return out


@dataclass
class _Deltas:
    claimed: list[float] = field(default_factory=list)
    other: list[float] = field(default_factory=list)
    where: list[str] = field(default_factory=list)


def logprobs(plan: Plan, main: Mapping[str, Samples], traits: SamplerTraits) -> list[Verdict]:
    """``sampling.logprobs``, one verdict per setting: the engine's logprob of every drawn token on
    a known path against the claimed mode's reference (``raw``: the oracle's log-softmax;
    ``processed``: log of the reference distribution), and the other mode's for the diagnosis."""
    mode = traits.logprobs_mode
    if mode not in ("raw_logprobs", "processed_logprobs"):
        return [Verdict("all", LOGPROBS, "skip", f"{LOGPROBS}: the engine returns no logprobs ({mode})")]
    tol = plan.gs.logprob_tol
    by: dict[str, _Deltas] = {}
    for t in plan.tests:
        s = main.get(t.id)
        if not t.runs or s is None or s.error or s.logprobs is None:
            continue
        tokens, lps = np.asarray(s.tokens), np.asarray(s.logprobs, np.float64)
        d = by.setdefault(t.setting.id, _Deltas())
        for j, ref in enumerate(t.references):
            rows = _on_path(tokens, t.path, j)
            tok, lp = tokens[rows, j], lps[rows, j]
            keep = (tok >= 0) & np.isfinite(lp)
            tok, lp = tok[keep], lp[keep]
            keep = (ref.probs[tok] > 0) & ~np.isin(tok, ref.borderline)
            tok, lp = tok[keep], lp[keep]
            if not tok.size:
                continue
            raw = log_softmax(t.raw[j])[tok]
            proc = np.log(ref.probs[tok])
            claimed, other = (raw, proc) if mode == "raw_logprobs" else (proc, raw)
            d.claimed += list(np.abs(lp - claimed))
            d.other += list(np.abs(lp - other))
            d.where.append(t.id)
    out = []
    for sid, d in by.items():
        if not d.claimed:
            out.append(Verdict(sid, LOGPROBS, "skip", f"{LOGPROBS} {sid}: no logprobs on a known path"))
            continue
        worst, mean = float(np.max(d.claimed)), float(np.mean(d.claimed))
        other = float(np.max(d.other))
        ok = worst <= tol
        other_name = "processed" if mode == "raw_logprobs" else "raw"
        head = (
            f"{LOGPROBS} {sid}: {'pass' if ok else 'FAIL'}: {mode} of {len(d.claimed)} drawn tokens within "
            f"{worst:.2g} nats of the reference (bar {tol:g}; {other_name}: {other:.2g})"
        )
        detail = (
            ""
            if ok
            else (
                f"the engine says {mode}, but its values are {other:.2g} from the {other_name} "
                f"reference and {worst:.2g} from the {mode} one"
            )
        )
        out.append(
            Verdict(
                sid,
                LOGPROBS,
                "pass" if ok else "fail",
                head,
                detail,
                {
                    "mode": mode,
                    "tokens": len(d.claimed),
                    "max_abs": worst,
                    "mean_abs": mean,
                    "other_mode_max_abs": other,
                    "bar": tol,
                },
            )
        )
    return out


def verdicts(
    plan: Plan,
    results: Mapping[str, Mapping[str, Samples]],
    traits: SamplerTraits,
    decode: Decode | None = None,
) -> tuple[list[Verdict], list[Outcome], list[bool]]:
    """Every verdict of a gate from the engine's (or a double's) draws."""
    main = results.get("main", {})
    outs, rejected, adjusted = statistics(plan, main)
    vs = [test_verdict(o, r, a, decode) for o, r, a in zip(outs, rejected, adjusted, strict=True)]
    vs += [
        Verdict(
            t.id,
            comparator(t),
            "refused",
            f"{comparator(t)} {t.id}: refused: {t.refused}",
            evidence={"reason": t.refused},
        )
        for t in plan.tests
        if t.refused
    ]
    vs += [Verdict(t.id, comparator(t), "skip", f"{comparator(t)} {t.id}: not drawn: {t.skip}",
                   evidence={"reason": t.skip, "p_path": t.p_path})
           for t in plan.tests if t.skip and not t.refused]
    vs += determinism(plan, results, traits)
    vs += logprobs(plan, main, traits)
    return vs, outs, rejected


def summary(
    outs: Sequence[Outcome], rejected: Sequence[bool], decode: Decode | None = None
) -> dict[str, Any]:
    """Per parameter: tests, failures, the smallest p, the largest detectable TV; and every failing
    test with its effect size (the closing note's "real disagreements")."""
    per: dict[str, dict[str, Any]] = {}
    fails = []
    for o, r in zip(outs, rejected, strict=True):
        if o.fit is None:
            continue
        p = per.setdefault(
            o.test.setting.param, {"tests": 0, "fail": 0, "min_p": 1.0, "max_detectable_tv": 0.0, "draws": 0}
        )
        p["tests"] += 1
        p["draws"] += o.test.draws
        p["min_p"] = min(p["min_p"], o.fit.p)
        p["max_detectable_tv"] = max(p["max_detectable_tv"], o.detectable_tv)
        if o.violations or r:
            p["fail"] += 1
            fails.append(
                {
                    "test": o.test.id,
                    "param": o.test.setting.param,
                    "p": o.fit.p,
                    "observed_tv": o.fit.observed_tv,
                    "detectable_tv": o.detectable_tv,
                    "violations": [
                        {"token": tok, "text": decode([tok]) if decode else None, "rank": rk, "count": c}
                        for _j, tok, rk, c in o.violations[:SHOW]
                    ],
                }
            )
    return {"per_parameter": per, "disagreements": fails}
