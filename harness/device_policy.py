"""The cross-device policy: what may be expected to hold between goldens and a run on another device.

==========================================  ==========================  ==========================
goldens vs candidate                        bit-exact                   within a stated bound
==========================================  ==========================  ==========================
same device class                           token ids, float logprobs   -
different CPU classes, float32              token ids                   logprobs, ``FLOAT32_ATOL``
goldens of unknown class vs a CPU, float32  token ids                   logprobs, ``FLOAT32_ATOL``
CPU vs GPU, GPU vs GPU, other dtypes        nothing                     -
==========================================  ==========================  ==========================

Whatever the classes, near-tie, KL, NMSE and drift hold only within their suites' bars.

"Unknown" goldens were recorded before fingerprints existed; they are never assumed to be of the
candidate's class. Every golden is recorded by the pinned oracle, the CPU build of vLLM, so against
a CPU candidate they get the cross-CPU expectations, against a GPU the bars alone.

:func:`policy` states the expectation for two classes (a :class:`DevicePolicy`, whose ``statement``
names both, for records and verdict text); :func:`check_reproduction` enforces it where a fresh
oracle recording is compared with goldens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from harness.api import Output
from harness.compare import COMPARATORS
from harness.device import UNKNOWN

Relation = Literal["same-class", "cross-cpu", "cross-device", "unknown-cpu", "unknown-device"]

FLOAT32_ATOL = 1e-4
"""Bound on |Δ logprob| (nats) between float32 runs on two CPU classes. Measured on tiny-llama
(2 layers, smoke suite, 1280 top-5 logprobs): AVX2 kernels against AVX-512 BF16 goldens moved 95%
of them, by at most 1.67e-5 (1.43e-5 in c01, as on an AVX2-only CPU); the bound leaves 6x headroom.
Deeper models accumulate more: tests on them state their own bound."""


def bars() -> tuple[str, ...]:
    """The comparators that hold only within their suites' bars whatever the device classes: those
    whose unit declares ``across_devices = "bar"`` (:mod:`harness.compare.unit`)."""
    return tuple(e.name for e in COMPARATORS.entries() if e.value.across_devices == "bar")


@dataclass(frozen=True, slots=True)
class DevicePolicy:
    """What may be expected of a candidate on ``candidate_class`` against goldens of ``golden_class``."""

    golden_class: str
    candidate_class: str
    relation: Relation
    exact: tuple[str, ...]
    """What must be bit-identical: ``"token_ids"`` (generated ids and top-k ids) and ``"logprobs"``."""
    logprob_atol: float | None
    """Where logprobs are not exact: the bound on |Δ| they must stay within, or None (bars only)."""
    bars: tuple[str, ...] = field(default_factory=bars)
    """Comparators that hold only within their suite's bars whatever the classes."""

    @property
    def same_class(self) -> bool:
        return self.relation == "same-class"

    @property
    def statement(self) -> str:
        """One line naming both classes and what is expected."""
        who = (f"goldens {self.golden_class}, candidate {self.candidate_class}"
               if not self.same_class else f"goldens and candidate both {self.golden_class}")
        why = {"same-class": "same device class",
               "cross-cpu": "different CPU classes",
               "cross-device": "different device kinds or dtype across classes",
               "unknown-cpu": "goldens' class unknown (recorded before fingerprints; never assumed equal)",
               "unknown-device": "goldens' class unknown, candidate not a CPU"}[self.relation]
        if "logprobs" in self.exact:
            what = "token ids and logprobs must be bit-identical"
        elif self.exact:
            what = f"token ids must be identical, logprobs within {self.logprob_atol:g} nats (not bit-exact)"
        else:
            what = "nothing is expected bit-exactly; only the near-tie, KL and NMSE bars apply"
        return f"{who}: {why} — {what}"

    def to_json(self) -> dict[str, Any]:
        return {"golden_class": self.golden_class, "candidate_class": self.candidate_class,
                "relation": self.relation, "exact": list(self.exact),
                "logprob_atol": self.logprob_atol, "bars": list(self.bars),
                "statement": self.statement}


def _kind(cls: str) -> str:
    return cls.split("-", 1)[0] if cls and cls != UNKNOWN else UNKNOWN


def policy(golden_class: str, candidate_class: str, *, dtype: str = "float32") -> DevicePolicy:
    """The expectation between goldens of ``golden_class`` and a run on ``candidate_class``.

    ``dtype`` is the model dtype both ran in; the cross-class logprob bound is stated for float32
    only (a bfloat16 run on another class may legitimately flip a token: bars only).
    """
    g, c = golden_class or UNKNOWN, candidate_class or UNKNOWN
    f32 = dtype in ("float32", "torch.float32", "fp32")
    if g == c and g != UNKNOWN:
        return DevicePolicy(g, c, "same-class", ("token_ids", "logprobs"), 0.0)
    if UNKNOWN in (g, c):
        cpu = _kind(c if g == UNKNOWN else g) == "cpu"
        if cpu and f32:
            return DevicePolicy(g, c, "unknown-cpu", ("token_ids",), FLOAT32_ATOL)
        return DevicePolicy(g, c, "unknown-device", (), None)
    if _kind(g) == _kind(c) == "cpu" and f32:
        return DevicePolicy(g, c, "cross-cpu", ("token_ids",), FLOAT32_ATOL)
    return DevicePolicy(g, c, "cross-device", (), None)


def _topk_within(g_ids: np.ndarray, g_lps: np.ndarray, f_ids: np.ndarray, f_lps: np.ndarray,
                 atol: float) -> str | None:
    """Whether two top-k rows can be the same distribution moved by at most ``atol`` per logprob.

    Ids in both rows must agree within ``atol``; an id in only one row must lie within ``atol`` of
    the other row's k-th value (it crossed the top-k boundary). Rows may reorder near-ties."""
    g, f = dict(zip(g_ids.tolist(), g_lps.tolist(), strict=True)), dict(
        zip(f_ids.tolist(), f_lps.tolist(), strict=True))
    for tid in g.keys() & f.keys():
        if abs(g[tid] - f[tid]) > atol:
            return f"token {tid}: goldens {g[tid]:.9g}, fresh {f[tid]:.9g} (|Δ| {abs(g[tid] - f[tid]):.3g})"
    for one, other, side in ((g, f, "goldens"), (f, g, "fresh")):
        edge = min(other.values())
        for tid in one.keys() - other.keys():
            if abs(one[tid] - edge) > atol:
                return (f"token {tid} only in the {side} top-k at {one[tid]:.9g}, the other's k-th is "
                        f"{edge:.9g}: not a boundary near-tie")
    return None


def check_reproduction(pol: DevicePolicy, goldens: Mapping[str, Output],
                       fresh: Mapping[str, Output]) -> list[str]:
    """Problems (empty: none) of a fresh oracle recording against goldens, as ``pol`` demands.

    Same class: generated ids, top-k ids and every float logprob bit-identical. Cross-CPU (or
    unknown goldens vs a CPU): generated ids identical, top-k logprobs and the chosen token's
    logprob within ``pol.logprob_atol``. Otherwise nothing is demanded here (the gate's bars judge).
    Each problem names the case, the position and the policy's statement.
    """
    problems: list[str] = []
    if not pol.exact:
        return problems
    for cid in sorted(goldens):
        g, f = goldens[cid], fresh.get(cid)
        if f is None:
            problems.append(f"{cid}: missing from the fresh recording")
            continue
        if g.token_ids != f.token_ids:
            pos = next((i for i, (a, b) in enumerate(zip(g.token_ids, f.token_ids, strict=False)) if a != b),
                       min(len(g.token_ids), len(f.token_ids)))
            problems.append(f"{cid}: token ids differ at position {pos}")
            continue
        if g.top_ids is None or f.top_ids is None or g.top_logprobs is None or f.top_logprobs is None:
            problems.append(f"{cid}: no logprobs to compare")
            continue
        if "logprobs" in pol.exact:
            for name in ("top_ids", "top_logprobs", "chosen_logprobs"):
                a, b = getattr(g, name), getattr(f, name)
                if a is None or b is None or a.shape != b.shape or not np.array_equal(a, b):
                    n = int((a != b).sum()) if a is not None and b is not None and a.shape == b.shape else -1
                    size = getattr(a, "size", 0)
                    problems.append(f"{cid}: {name} not bit-identical ({n} of {size} differ)")
            continue
        atol = float(pol.logprob_atol or 0.0)
        for t in range(len(g.token_ids)):
            why = _topk_within(g.top_ids[t], g.top_logprobs[t], f.top_ids[t], f.top_logprobs[t], atol)
            if why is None and g.chosen_logprobs is not None and f.chosen_logprobs is not None:
                d = abs(float(g.chosen_logprobs[t]) - float(f.chosen_logprobs[t]))
                why = f"chosen logprob |Δ| {d:.3g}" if d > atol else None
            if why is not None:
                problems.append(f"{cid} position {t}: {why} > {atol:g}")
                break
    return [f"{p}  [{pol.statement}]" for p in problems]


def logprob_drift(goldens: Mapping[str, Output], fresh: Mapping[str, Output]) -> dict[str, Any]:
    """How far a fresh recording's top-k logprobs moved from the goldens: counts and max |Δ| (for
    messages and measurements; cases whose top-k ids differ are counted by id)."""
    n = differ = 0
    worst = 0.0
    for cid, g in goldens.items():
        f = fresh.get(cid)
        if f is None or g.top_logprobs is None or f.top_logprobs is None or g.top_ids is None:
            continue
        if f.top_ids is None or f.top_logprobs.shape != g.top_logprobs.shape:
            continue
        same = g.top_ids == f.top_ids
        d = np.abs(g.top_logprobs - f.top_logprobs)[same]
        n += int(g.top_logprobs.size)
        differ += int((d != 0).sum()) + int((~same).sum())
        worst = max(worst, float(d.max()) if d.size else 0.0)
    return {"logprobs": n, "differ": differ, "max_abs": worst}
