"""kl: how far the candidate's next-token distributions are from the oracle's, position by position.

``KL(oracle || candidate)`` per position, after the same prefix (see :mod:`harness.compare.kernels.aligned`:
teacher-forced, or until the first divergence when the candidate cannot score a given sequence).
The statistics follow llama.cpp's ``--kl-divergence`` report: mean with its standard error, median,
p90/p99/p99.9/max, the share of positions whose top token agrees, and the RMS of Δp, the change in
the probability the candidate gives the oracle's token. Every number says which capture mode
(full-vocab or top-k+rest) and which alignment it came from.

Everything is vectorised over all positions of a case (or of a run) at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np

from harness.api import Case, Output, Verdict
from harness.compare.explain import RERECORD_HINT, engine_error
from harness.compare.kernels.aligned import (
    Aligned,
    AlignError,
    Mode,
    align,
    by_id,
    lookup,
    renormalise,
)
from harness.compare.kernels.planting import lower_top1_until, plant_identity, top_rows
from harness.compare.unit import LOGPROBS, ControlSet, Mutation, Needs, Planted, Unit, param
from harness.excerpt import first_line


def json_number(x: Any) -> Any:
    """NaN/inf -> None, so records stay standard JSON."""
    return None if isinstance(x, float) and not np.isfinite(x) else x


RUN = "(run)"
"""The case id of a verdict about a whole run (all positions of all cases pooled)."""

ModeWish = Literal["auto", "full", "topk"]
MODES: tuple[ModeWish, ...] = ("auto", "full", "topk")
MODE_HELP = "capture mode: exact full-vocab, top-k+rest lower bound, or auto"
REST_FLOOR = 1e-30


@dataclass(frozen=True, slots=True, eq=False)
class KLRows:
    """Per-position facts of one case (or of a pooled run)."""

    kl: np.ndarray
    """[n] KL(oracle || candidate) in nats."""
    same_top: np.ndarray
    """[n] bool: both sides' most likely token agree."""
    dp: np.ndarray
    """[n] p_candidate(oracle token) - p_oracle(oracle token); NaN where the candidate's top-k lacks it."""
    mode: Mode


CHUNK_ROWS = 32768
"""Rows per pass: temporaries of this size stay in cache (about 2x faster than one pass over 1e6)."""


def _chunked(fn: Callable[..., np.ndarray], *arrays: np.ndarray) -> np.ndarray:
    n = len(arrays[0])
    if n <= CHUNK_ROWS:
        return fn(*arrays)
    return np.concatenate([fn(*(a[i:i + CHUNK_ROWS] for a in arrays)) for i in range(0, n, CHUNK_ROWS)])


def kl_topk_rest(o_ids: np.ndarray, o_lp: np.ndarray, c_ids: np.ndarray, c_lp: np.ndarray) -> np.ndarray:
    """KL over the partition {ids both sides hold} + {rest}, per row. A lower bound of the true KL."""
    return _chunked(_kl_topk_rest, o_ids, o_lp, c_ids, c_lp)


def _kl_topk_rest(o_ids: np.ndarray, o_lp: np.ndarray, c_ids: np.ndarray, c_lp: np.ndarray) -> np.ndarray:
    c_at = lookup(c_ids, c_lp, o_ids)
    has = ~np.isnan(c_at)
    np.copyto(c_at, o_lp, where=~has)  # ids only the oracle holds: no shared term (p is 0 there)
    p = np.exp(o_lp) * has
    q = np.exp(c_at) * has
    shared = (p * (o_lp - c_at)).sum(axis=1)
    p_rest = np.clip(1.0 - p.sum(axis=1), 0.0, 1.0)
    q_rest = np.clip(1.0 - q.sum(axis=1), REST_FLOOR, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rest = np.where(p_rest > 0, p_rest * (np.log(np.maximum(p_rest, REST_FLOOR)) - np.log(q_rest)), 0.0)
    # float32 rounding of the captured masses can push a (true) zero a hair below 0
    return np.maximum(shared + rest, 0.0)


def kl_full(o_ids: np.ndarray, o_lp: np.ndarray, c_ids: np.ndarray, c_lp: np.ndarray) -> np.ndarray:
    """Exact KL per row when both sides hold the whole vocabulary."""
    return _chunked(_kl_full, o_ids, o_lp, c_ids, c_lp)


def _kl_full(o_ids: np.ndarray, o_lp: np.ndarray, c_ids: np.ndarray, c_lp: np.ndarray) -> np.ndarray:
    o = renormalise(by_id(o_ids, o_lp))
    c = renormalise(by_id(c_ids, c_lp))
    return np.maximum((np.exp(o) * (o - c)).sum(axis=1), 0.0)


def top_token(ids: np.ndarray, lp: np.ndarray) -> np.ndarray:
    """The most likely id of each row; exact ties go to the lowest id, the same on both sides."""
    if not len(ids):
        return np.empty(0, np.int64)
    best = lp == lp.max(axis=1, keepdims=True)
    return np.where(best, ids, np.iinfo(np.int64).max).min(axis=1)


def choose_mode(a: Aligned, wish: ModeWish) -> Mode:
    if wish == "full" and not a.full:
        raise AlignError(
            f"{a.case_id}: full-vocab KL asked, but the sides hold {a.describe_k()} "
            '(set the suite\'s [sampling] logprobs = "full" and re-record)')
    return "full-vocab" if a.full and wish != "topk" else "top-k+rest"


def kl_rows(a: Aligned, wish: ModeWish = "auto") -> KLRows:
    mode = choose_mode(a, wish)
    dp = np.exp(a.c_chosen) - np.exp(a.o_chosen)
    if mode == "full-vocab":
        f = a.facts()
        return KLRows(f.kl, f.o_top == f.c_top, dp, mode)
    kl = kl_topk_rest(a.o_ids, a.o_lp, a.c_ids, a.c_lp)
    same = top_token(a.o_ids, a.o_lp) == top_token(a.c_ids, a.c_lp)
    return KLRows(kl, same, dp, mode)


@dataclass(frozen=True, slots=True)
class KLStats:
    """The llama.cpp-style summary of a set of per-position KL values."""

    positions: int
    mode: str
    """``full-vocab``, ``top-k+rest`` or ``mixed``."""
    alignment: str
    """``teacher-forced``, ``until-first-divergence`` or ``mixed``."""
    mean: float
    mean_se: float
    """Standard error of the mean, positions taken as independent (they are not quite: a floor)."""
    median: float
    p90: float
    p99: float
    p999: float
    max: float
    same_top: float
    """Share of positions whose most likely token agrees (0..1)."""
    same_top_se: float
    rms_dp: float
    """RMS over positions of Δp = p_candidate(oracle token) - p_oracle(oracle token)."""
    dp_positions: int
    """Positions where Δp is known (the candidate kept the oracle's token)."""

    def to_json(self) -> dict[str, Any]:
        return {f.name: json_number(getattr(self, f.name)) for f in fields(self)}

    def lines(self) -> list[str]:
        """The KL table, one line per statistic (printed by the gate and ``harness show``)."""
        return [
            f"KL(oracle||candidate)  {self.mode}, {self.alignment}, {self.positions} positions",
            f"  mean KLD     : {self.mean:.6g} ± {self.mean_se:.2g} nats",
            f"  median       : {self.median:.6g}",
            f"  p90 / p99    : {self.p90:.6g} / {self.p99:.6g}",
            f"  p99.9 / max  : {self.p999:.6g} / {self.max:.6g}",
            f"  same top     : {100 * self.same_top:.2f} ± {100 * self.same_top_se:.2f} %",
            f"  RMS Δp       : {100 * self.rms_dp:.4f} %  ({self.dp_positions} positions)",
        ]


def _label(values: Sequence[str]) -> str:
    u = sorted(set(values))
    return u[0] if len(u) == 1 else ("mixed" if u else "none")


def kl_stats(rows: Sequence[KLRows], alignments: Sequence[str] = ()) -> KLStats:
    """Pool the positions of ``rows`` (one per case) and summarise them."""
    kl = np.concatenate([r.kl for r in rows]) if rows else np.empty(0)
    same = np.concatenate([r.same_top for r in rows]) if rows else np.empty(0, bool)
    dp = np.concatenate([r.dp for r in rows]) if rows else np.empty(0)
    dp = dp[~np.isnan(dp)]
    n = int(kl.size)
    if n == 0:
        nan = float("nan")
        return KLStats(0, _label([r.mode for r in rows]), _label(alignments), nan, nan, nan, nan, nan,
                       nan, nan, nan, nan, nan, 0)
    q = np.percentile(kl, [50, 90, 99, 99.9])
    st = float(same.mean())
    return KLStats(
        positions=n, mode=_label([r.mode for r in rows]), alignment=_label(alignments),
        mean=float(kl.mean()), mean_se=float(kl.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan"),
        median=float(q[0]), p90=float(q[1]), p99=float(q[2]), p999=float(q[3]), max=float(kl.max()),
        same_top=st, same_top_se=float(np.sqrt(st * (1 - st) / n)),
        rms_dp=float(np.sqrt(np.mean(dp**2))) if dp.size else float("nan"), dp_positions=int(dp.size))


@dataclass(frozen=True, slots=True)
class KL:
    """Judges a case (and, pooled, a run) against the suite's KL bars.

    The candidate output must be the candidate's score of the oracle's sequence (``needs_scores``);
    a free-running output is judged until its first divergence, and the verdict says so.
    """

    key = "kl"
    needs_scores = True
    max_mean: float = param(1e-3, "number", "bar on the mean KLD (nats)")
    max_p99: float | None = param(None, "number", "bar on the p99 KLD")
    max_max: float | None = param(None, "number", "bar on the largest KLD")
    min_same_top: float | None = param(None, "number", "bar on the share of positions whose top token "
                                                       "agrees (0..1)")
    mode: ModeWish = param("auto", "choice", MODE_HELP, MODES)
    decode: Callable[[Sequence[int]], str] | None = None

    def measure(self, oracle: Output, candidate: Output, case: Case) -> tuple[Aligned, KLRows] | Verdict:
        if (err := engine_error(self.key, oracle, candidate, case)) is not None:
            return err
        try:
            a = align(oracle, candidate, case.id)
            return a, kl_rows(a, self.mode)
        except AlignError as e:
            return Verdict(case.id, self.key, "error", first_line(str(e)), detail=str(e),
                           evidence={"reason": str(e)})

    def breaches(self, s: KLStats) -> list[str]:
        out = []
        if not s.mean <= self.max_mean:
            out.append(f"mean KLD {s.mean:.3g} > {self.max_mean:.3g}")
        if self.max_p99 is not None and not s.p99 <= self.max_p99:
            out.append(f"p99 KLD {s.p99:.3g} > {self.max_p99:.3g}")
        if self.max_max is not None and not s.max <= self.max_max:
            out.append(f"max KLD {s.max:.3g} > {self.max_max:.3g}")
        if self.min_same_top is not None and not s.same_top >= self.min_same_top:
            out.append(f"same top {100 * s.same_top:.2f}% < {100 * self.min_same_top:.2f}%")
        return out

    def bars(self) -> dict[str, float | None]:
        return {"max_mean": self.max_mean, "max_p99": self.max_p99, "max_max": self.max_max,
                "min_same_top": self.min_same_top}

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        m = self.measure(oracle, candidate, case)
        if isinstance(m, Verdict):
            return m
        a, rows = m
        return self._verdict(case.id, kl_stats([rows], [a.alignment]), worst=(a, rows))

    def compare_run(self, oracles: Sequence[Output], candidates: Sequence[Output],
                    cases: Sequence[Case]) -> Verdict:
        """One verdict over the pooled positions of every case that could be measured."""
        measured = [self.measure(o, c, case) for o, c, case in zip(oracles, candidates, cases, strict=True)]
        ok = [m for m in measured if not isinstance(m, Verdict)]
        bad = [m for m in measured if isinstance(m, Verdict)]
        if not ok:
            first = bad[0].summary if bad else "no cases"
            return Verdict(RUN, self.key, "error", f"no case could be measured: {first}")
        stats = kl_stats([r for _, r in ok], [a.alignment for a, _ in ok])
        worst = max(ok, key=lambda m: float(m[1].kl.max()) if m[1].kl.size else -1.0)
        v = self._verdict(RUN, stats, worst=worst)
        if bad:
            ev = {**v.evidence, "unmeasured_cases": [b.case_id for b in bad]}
            return Verdict(v.case_id, v.comparator, "error" if v.status == "pass" else v.status,
                           v.summary + f"; {len(bad)} case(s) unmeasured", v.detail, ev)
        return v

    def _verdict(self, case_id: str, s: KLStats, worst: tuple[Aligned, KLRows]) -> Verdict:
        ev: dict[str, Any] = {**s.to_json(), "bars": self.bars()}
        a, rows = worst
        if rows.kl.size:
            pos = int(rows.kl.argmax())
            ev.update(worst_case=a.case_id, worst_position=pos, worst_kl=float(rows.kl[pos]))
        head = (f"mean {s.mean:.3g} ± {s.mean_se:.1g} nats, p99 {s.p99:.3g}, same-top "
                f"{100 * s.same_top:.1f}% over {s.positions} pos ({s.mode}, {s.alignment})")
        if s.positions == 0:
            return Verdict(case_id, self.key, "skip", "no comparable positions", evidence=ev)
        breaches = self.breaches(s)
        if not breaches:
            return Verdict(case_id, self.key, "pass", f"kl pass: {head}", evidence=ev)
        return Verdict(case_id, self.key, "fail", f"kl FAIL: {'; '.join(breaches)}",
                       detail=self._explain(case_id, s, breaches, worst), evidence=ev)

    def _explain(self, case_id: str, s: KLStats, breaches: list[str], worst: tuple[Aligned, KLRows]) -> str:
        a, rows = worst
        pos = int(rows.kl.argmax())

        def side(ids: np.ndarray, lp: np.ndarray) -> str:
            order = np.argsort(-lp[pos])[:5]
            return ", ".join(f"{self._tok(int(ids[pos, j]))} {lp[pos, j]:.2f}" for j in order)

        lines = [f"{case_id}: kl FAIL — {'; '.join(breaches)}", *("  " + x for x in s.lines()),
                 f"  worst      : {a.case_id} position {pos}/{a.tokens}: KLD {rows.kl[pos]:.4g} nats",
                 f"  oracle     : {side(a.o_ids, a.o_lp)}",
                 f"  candidate  : {side(a.c_ids, a.c_lp)}"]
        if a.alignment == "until-first-divergence":
            lines.append(f"  note       : {a.case_id} judged only up to its first divergence "
                         f"({a.positions} of {a.tokens} positions): the candidate could not score "
                         "the oracle's sequence")
        lines.append(f"  {RERECORD_HINT}")
        return "\n".join(lines)

    def _tok(self, tid: int) -> str:
        """``tid`` and its text; an id the tokenizer cannot decode (negative, past its vocabulary)
        is shown as such: explaining a failure must not crash the run that found it."""
        if not self.decode:
            return str(tid)
        try:
            return f"{tid} {self.decode([tid])!r}"
        except (OverflowError, ValueError, TypeError, IndexError, KeyError):
            return f"{tid} (not a token id of this tokenizer)"


def plant_kl_shift(comp: Any, case: Case, oracle: Output) -> Planted | str:
    """Lower the top-1 logprob at every position by d nats (renormalised when the rows are whole)."""
    r = top_rows(oracle)
    if r is None:
        return "the golden has no logprobs"
    n = min(len(oracle.token_ids), len(r[1]))
    if n == 0:
        return "the golden generation is empty"
    return lower_top1_until(oracle, np.ones(n), lambda kl: float(kl.mean()), float(comp.max_mean), "mean KL")


UNIT = Unit(KL, "KL(oracle || candidate) per position, teacher-forced", needs=LOGPROBS, across_devices="bar",
            controls=ControlSet(needs=Needs(logprobs=True, min_k=2), mutations=(
                Mutation("perturb above bar", "fail", plant_kl_shift),
                Mutation("unperturbed copy", "pass", plant_identity),
            )))
