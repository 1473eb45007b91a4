"""nmse: normalised mean squared error of tensors, ``sum((x - ref)^2) / sum(ref^2)``.

The cross-device bar of a C++ vLLM port is NMSE <= 5e-4. It is scale invariant (both tensors times
c give the same NMSE), so one bar serves logprob vectors, logits and hidden states. Measured with
transformers: CUDA fp32 vs CPU fp32 on a random tiny Llama gives ~1e-13 over logprobs; CUDA bf16
gives 3-6e-5 while greedy diverges twice in 24 tokens: exactly where strict fails and NMSE passes.

As a comparator it judges full-vocabulary logprob vectors (top-k rows are not a tensor: ``skip``).
:func:`compare_tensors` judges any named tensors (logits, per-layer hidden states) the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.api import Case, Output, Verdict
from harness.compare.explain import RERECORD_HINT, engine_error
from harness.compare.kernels.aligned import AlignError, align
from harness.compare.kernels.planting import (
    OVER_BAR,
    covers_vocab,
    log_softmax,
    plant_identity,
    top_rows,
    with_full,
    with_logprobs,
)
from harness.compare.kl import RUN, json_number
from harness.compare.unit import LOGPROBS, ControlSet, Mutation, Needs, Planted, Unit, param
from harness.excerpt import first_line

DEFAULT_MAX_NMSE = 5e-4


def nmse(ref: np.ndarray, x: np.ndarray) -> float:
    """NMSE of ``x`` against ``ref`` over all elements; 0 when both are all zeros."""
    ref = np.asarray(ref, np.float64)
    x = np.asarray(x, np.float64)
    if ref.shape != x.shape:
        raise ValueError(f"nmse: shapes differ: reference {ref.shape}, other {x.shape}")
    den = (ref**2).sum()
    num = ((x - ref) ** 2).sum()
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    with np.errstate(over="ignore"):
        return float(num / den)


def nmse_rows(ref: np.ndarray, x: np.ndarray) -> tuple[float, np.ndarray]:
    """(NMSE over everything, NMSE of each leading-axis row) for ``[n, ...]`` tensors."""
    ref = np.asarray(ref, np.float64).reshape(len(ref), -1)
    x = np.asarray(x, np.float64).reshape(len(x), -1)
    if ref.shape != x.shape:
        raise ValueError(f"nmse: shapes differ: reference {ref.shape}, other {x.shape}")
    num = ((x - ref) ** 2).sum(axis=1)
    den = (ref**2).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        per = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, np.inf, 0.0))
        total = float(num.sum() / den.sum()) if den.sum() > 0 else (0.0 if num.sum() == 0 else float("inf"))
    return total, per


@dataclass(frozen=True, slots=True)
class TensorNMSE:
    """One named tensor's NMSE, and its worst row (position)."""

    name: str
    nmse: float
    worst_position: int
    worst_nmse: float
    positions: int
    shape: tuple[int, ...]
    passed: bool

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "nmse": json_number(self.nmse), "worst_position": self.worst_position,
                "worst_nmse": json_number(self.worst_nmse), "positions": self.positions,
                "shape": list(self.shape), "passed": self.passed}


def compare_tensors(ref: Mapping[str, np.ndarray], other: Mapping[str, np.ndarray],
                    max_nmse: float = DEFAULT_MAX_NMSE) -> list[TensorNMSE]:
    """NMSE of every tensor both sides hold (``[positions, ...]`` each), in ``ref``'s order."""
    out = []
    for name, r in ref.items():
        if name not in other:
            continue
        total, per = nmse_rows(r, other[name])
        worst = int(per.argmax()) if per.size else -1
        out.append(TensorNMSE(name, total, worst, float(per[worst]) if per.size else float("nan"),
                              int(per.size), tuple(np.shape(r)), bool(total <= max_nmse)))
    return out


@dataclass(frozen=True, slots=True)
class NMSE:
    """Judges the candidate's full-vocab logprob vectors: NMSE per case <= ``max_nmse``."""

    key = "nmse"
    needs_scores = True
    max_nmse: float = param(DEFAULT_MAX_NMSE, "number", "bar (the cross-device bar of a C++ vLLM port)")
    decode: Callable[[Sequence[int]], str] | None = None

    def measure(self, oracle: Output, candidate: Output, case: Case
                ) -> tuple[str, np.ndarray, np.ndarray] | Verdict:
        """(alignment, per-position squared error, per-position squared reference) of the
        renormalised full-vocab logprob vectors, from one pass over the ``[n, V]`` arrays."""
        if (err := engine_error(self.key, oracle, candidate, case)) is not None:
            return err
        try:
            a = align(oracle, candidate, case.id)
            if not a.full:
                return Verdict(case.id, self.key, "skip",
                               f"NMSE needs full-vocab logprobs; the sides hold {a.describe_k()}",
                               evidence={"k": list(a.k)})
            f = a.facts()
        except AlignError as e:
            return Verdict(case.id, self.key, "error", first_line(str(e)), detail=str(e))
        return a.alignment, f.sq_err, f.sq_ref

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        m = self.measure(oracle, candidate, case)
        if isinstance(m, Verdict):
            return m
        alignment, num, den = m
        return self._verdict(case.id, [(case.id, num, den)], alignment)

    def compare_run(self, oracles: Sequence[Output], candidates: Sequence[Output],
                    cases: Sequence[Case]) -> Verdict:
        measured = [(case.id, self.measure(o, c, case))
                    for o, c, case in zip(oracles, candidates, cases, strict=True)]
        ok = [(cid, m) for cid, m in measured if not isinstance(m, Verdict)]
        if not ok:
            first = next((m for _, m in measured if isinstance(m, Verdict)), None)
            return Verdict(RUN, self.key, first.status if first else "skip",
                           first.summary if first else "no cases")
        aligns = sorted({m[0] for _, m in ok})  # type: ignore[index]
        return self._verdict(RUN, [(cid, m[1], m[2]) for cid, m in ok],  # type: ignore[index]
                             aligns[0] if len(aligns) == 1 else "mixed")

    def _verdict(self, case_id: str, parts: Sequence[tuple[str, np.ndarray, np.ndarray]],
                 alignment: str) -> Verdict:
        """``parts``: (case, per-position sum (x - ref)^2, per-position sum ref^2)."""
        num = den = 0.0
        worst = ("", -1, -1.0)
        for cid, n_rows, d_rows in parts:
            with np.errstate(divide="ignore", invalid="ignore"):
                per = np.where(d_rows > 0, n_rows / np.where(d_rows > 0, d_rows, 1.0),
                               np.where(n_rows > 0, np.inf, 0.0))
            num += float(n_rows.sum())
            den += float(d_rows.sum())
            if per.size and per.max() > worst[2]:
                worst = (cid, int(per.argmax()), float(per.max()))
        total = num / den if den > 0 else (0.0 if num == 0 else float("inf"))
        n = sum(len(r) for _, r, _ in parts)
        ev = {"nmse": json_number(total), "positions": n, "worst_case": worst[0],
              "worst_position": worst[1], "worst_nmse": json_number(worst[2]), "alignment": alignment,
              "mode": "full-vocab", "max_nmse": self.max_nmse}
        head = f"NMSE {total:.3g} over {n} pos, worst {worst[0]}@{worst[1]} {worst[2]:.3g}"
        if n == 0:
            return Verdict(case_id, self.key, "skip", "no comparable positions", evidence=ev)
        if total <= self.max_nmse:
            return Verdict(case_id, self.key, "pass", f"nmse pass: {head} (bar {self.max_nmse:.3g})",
                           evidence=ev)
        detail = "\n".join([
            f"{case_id}: nmse FAIL — NMSE {total:.4g} > bar {self.max_nmse:.4g} (full-vocab logprobs, "
            f"{alignment}, {n} positions)",
            f"  worst      : {worst[0]} position {worst[1]}: NMSE {worst[2]:.4g}",
            f"  {RERECORD_HINT}"])
        return Verdict(case_id, self.key, "fail", f"nmse FAIL: {total:.3g} > {self.max_nmse:.3g}",
                       detail=detail, evidence=ev)


def tensor_verdict(ref: Mapping[str, Mapping[str, np.ndarray]], other: Mapping[str, Mapping[str, np.ndarray]],
                   max_nmse: float = DEFAULT_MAX_NMSE, case_id: str = RUN) -> Verdict:
    """NMSE of every named tensor (logits, ``hidden.<layer>``) pooled over the cases both sides
    hold (``case -> name -> [positions, ...]``), each with its worst case and position."""
    names = list(dict.fromkeys(n for t in ref.values() for n in t))
    cases = [c for c in ref if c in other]
    rows = []
    for name in names:
        num = den = 0.0
        worst = ("", -1, -1.0)
        for c in cases:
            if name not in ref[c] or name not in other[c]:
                continue
            r, x = np.asarray(ref[c][name], np.float64), np.asarray(other[c][name], np.float64)
            _, per = nmse_rows(r, x)
            num += float(((x - r) ** 2).sum())
            den += float((r**2).sum())
            if per.size and float(per.max()) > worst[2]:
                worst = (c, int(per.argmax()), float(per.max()))
        total = num / den if den > 0 else (0.0 if num == 0 else float("inf"))
        rows.append({"name": name, "nmse": json_number(total), "worst_case": worst[0],
                     "worst_position": worst[1], "worst_nmse": json_number(worst[2]),
                     "passed": bool(total <= max_nmse)})
    ev = {"tensors": rows, "max_nmse": max_nmse, "cases": len(cases)}
    if not rows:
        return Verdict(case_id, "nmse_tensors", "skip", "no tensors on both sides", evidence=ev)
    worst = max(rows, key=lambda t: t["nmse"] if t["nmse"] is not None else float("inf"))
    text = ", ".join(f"{t['name']} {t['nmse']:.2g}" for t in rows if t["nmse"] is not None)
    status = "pass" if all(t["passed"] for t in rows) else "fail"
    detail = "" if status == "pass" else "\n".join(
        [f"{case_id}: nmse_tensors FAIL (bar {max_nmse:.3g})"]
        + [f"  {t['name']:<10} NMSE {t['nmse']:.4g}  worst {t['worst_case']}@{t['worst_position']} "
           f"{t['worst_nmse']:.4g}" for t in rows])
    return Verdict(case_id, "nmse_tensors", status,
                   f"tensors {status}: {text} (worst {worst['name']} at {worst['worst_case']}@"
                   f"{worst['worst_position']})", detail=detail, evidence=ev)


def _noisy_full(full: np.ndarray, n: int, s: float, seed: int = 0) -> tuple[np.ndarray, float]:
    """Rows ``[:n]`` plus ``s`` x standard normal noise, renormalised, and their reference NMSE
    against the rows (both in float64 slices of about 2^18 values)."""
    out = np.empty((n, full.shape[1]), np.float32)
    num = den = 0.0
    rng = np.random.default_rng(seed)
    step = max(1, (1 << 18) // full.shape[1])
    for lo in range(0, n, step):
        ref = np.asarray(full[lo:min(n, lo + step)], np.float64)
        x = log_softmax(ref + s * rng.standard_normal(ref.shape))
        out[lo:lo + len(ref)] = x
        num += float(((x - ref) ** 2).sum())
        den += float((ref**2).sum())
    return out, (num / den if den else float("inf"))


def reference_nmse(ref: np.ndarray, x: np.ndarray) -> float:
    den = float((ref**2).sum())
    return float(((x - ref) ** 2).sum()) / den if den else float("inf")


def plant_nmse_noise(comp: Any, case: Case, oracle: Output) -> Planted | str:
    """Add s x standard normal noise to the whole rows, renormalised, for the smallest s whose
    reference NMSE reaches 10x the bar."""
    r = top_rows(oracle)
    if r is None:
        return "the golden has no logprobs"
    full = oracle.full_logprobs
    ids, lp = r
    if full is None and not covers_vocab(lp):
        return f"NMSE needs full-vocab logprobs; the goldens hold top-{ids.shape[1]}"
    n = min(len(oracle.token_ids), len(full)) if full is not None else len(lp)
    if n == 0:
        return "the golden generation is empty"
    bar = float(comp.max_nmse)
    noise = np.random.default_rng(0).standard_normal(lp.shape) if full is None else None
    for s in (1e-3, 1e-2, 0.03, 0.1, 0.3, 1.0, 3.0):
        if full is not None:
            c, v = _noisy_full(full, n, s)
        else:
            c = log_softmax(lp + s * noise)
            v = reference_nmse(lp, c)
        if v >= OVER_BAR * bar:
            planted = with_full(oracle, c) if full is not None else with_logprobs(oracle, c)
            where = " on the full rows" if full is not None else ""
            return Planted(oracle, planted, f"noise {s:g}{where}: reference NMSE {v:.3g} >= "
                                            f"{OVER_BAR:g}x bar {bar:g}")
    return f"no perturbation reaches {OVER_BAR:g}x the NMSE bar"


UNIT = Unit(NMSE, "normalised squared error of full-vocab logprob vectors", needs=LOGPROBS,
            across_devices="bar", controls=ControlSet(needs=Needs(logprobs=True, full_vocab=True), mutations=(
                Mutation("perturb above bar", "fail", plant_nmse_noise),
                Mutation("unperturbed copy", "pass", plant_identity),
            )))
