"""The RL gate's controls.

**Planted faults, each its own run** (``make rl CONTROL=<name>``, one engine start each, the record
says which): :data:`PLANTED` — each must fail, naming what it found. The clean run's separation from
each is the ratio of the main figure (largest mean |Δ logprob| over the steps).

**In-memory controls beside every run** (the vacuous-gate guard, :class:`~harness.records.Control`):
each judge is fed a planted copy of what this run measured and must fail (and an unchanged copy must
pass): trainer logprobs shifted by 10x the step bar; one tensor's engine value replaced by the previous
step's; a mismatch that grows step over step under every per-step bar; an identity step with one
token changed; a version that did not advance; for MoE, routes replayed from another request and
all-zero routes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from harness.api import Verdict
from harness.kinds.rl.judge import (
    GROWTH,
    IDENTITY,
    MAIN,
    ROUTING,
    SYNC,
    VERSION,
    WEIGHTS,
    judge_growth,
    judge_identity,
    judge_step,
    judge_version,
    judge_weights,
    metric_verdicts,
    metrics,
)
from harness.kinds.rl.settings import RLSettings
from harness.records import Control

CONTROL = "rl_control"

PLANTED: Mapping[str, str] = {
    "no_reset": "the prefix cache is not reset after an update (KV computed with the old weights is served)",
    "drop_tensor": "one tensor is left out of every transfer (the easy step's first tensor: the LM head, or "
    "the embedding where tied)",
    "not_applied": "the engine never applies the update (start_weight_update and finish_weight_update with "
    "a version, no update_weights)",
    "trainer_dtype": "the trainer scores in bfloat16 where the suite declares float32 (float32 where it "
    "declares bfloat16)",
}
OVER_BAR = 10.0


MASK_EVERY = 8
MOVED = f"trainer logprobs moved by ±1 nat, every {MASK_EVERY}th token masked"


def _control(comparator: str, mutation: str, expect: str, v: Verdict) -> Control:
    ok = (v.status == "fail") if expect == "fail" else (v.status == "pass")
    return Control(comparator, mutation, expect, v.status, ok, v.summary[:300])  # type: ignore[arg-type]


def sync_controls(rollout: Sequence[np.ndarray], s: RLSettings) -> list[Control]:
    """The step judge and each figure's on the rollout against itself moved by ±1 nat per token
    (alternating: a constant shift would leave the Pearson correlation at 1) with every
    :data:`MASK_EVERY`-th token given -inf (a top-p mask drawn elsewhere: what ``frac_masked``
    measures, which no shift moves), and unmoved."""
    moved = []
    for r in rollout:
        r = np.asarray(r, np.float64)
        m = r + np.where(np.arange(len(r)) % 2 == 0, -1.0, 1.0)
        m[MASK_EVERY - 1 :: MASK_EVERY] = -np.inf
        moved.append(m)
    m_moved = metrics(rollout, moved)
    m_copy = metrics(rollout, [np.asarray(r, np.float64) for r in rollout])
    out = [
        _control(SYNC, MOVED, "fail", judge_step(0, "planted", m_moved, s)),
        _control(SYNC, "trainer equals rollout", "pass", judge_step(0, "planted", m_copy, s)),
    ]
    pairs = zip(
        metric_verdicts(0, "planted", m_moved, s), metric_verdicts(0, "planted", m_copy, s), strict=True
    )
    for bad, good in pairs:
        out += [
            _control(bad.comparator, MOVED, "fail", bad),
            _control(good.comparator, "trainer equals rollout", "pass", good),
        ]
    return out


def detection(control: str, verdicts: Sequence[Verdict], dropped: str | None) -> Verdict:
    """Whether a planted fault's run failed for the reason the fault leaves (``rl_control``, case the
    control): the gates passing, or failing for another reason only, is no detection."""

    def failed(comp: str) -> list[Verdict]:
        return [v for v in verdicts if v.comparator == comp and v.status == "fail"]

    found: list[Verdict] = []
    if control == "no_reset":
        found = [v for v in failed(SYNC) if v.case_id != "step0"]
    elif control == "drop_tensor":
        found = [v for v in failed(WEIGHTS) if dropped and dropped in v.summary]
    elif control == "not_applied":
        found = failed(WEIGHTS) if not failed(VERSION) else []
    elif control == "trainer_dtype":
        found = [v for v in failed(SYNC) if v.case_id == "step0"]
    if found:
        return Verdict(
            control,
            CONTROL,
            "pass",
            f"{control} caught: {found[0].summary[:240]}",
            evidence={"found": [v.summary for v in found]},
        )
    return Verdict(
        control,
        CONTROL,
        "fail",
        f"{control} NOT caught: {PLANTED.get(control, control)}, and the gate did not fail for it",
        evidence={"failed": [v.summary for v in verdicts if v.status == "fail"]},
    )


def detection_controls(control: str, verdicts: Sequence[Verdict], dropped: str | None) -> list[Control]:
    """The detection judge on this run's verdicts with every failure turned into a pass must fail."""
    clean = [replace(v, status="pass") if v.status == "fail" else v for v in verdicts]
    return [
        _control(CONTROL, "the same run with every gate passing", "fail", detection(control, clean, dropped))
    ]


def weights_controls(arrivals: Sequence[Any], s: RLSettings) -> list[Control]:
    if not arrivals:
        return []
    a = arrivals[0]
    stale = replace(a, max_abs=max(a.scale, 1.0), same_as_before=True)
    return [
        _control(
            WEIGHTS,
            f"{a.name} left at its previous value",
            "fail",
            judge_weights(0, [stale, *arrivals[1:]], s),
        ),
        _control(
            WEIGHTS,
            "every tensor exact",
            "pass",
            judge_weights(0, [replace(x, max_abs=0.0) for x in arrivals], s),
        ),
    ]


def growth_controls(per_step: Sequence[Mapping[str, float]], s: RLSettings) -> list[Control]:
    base = max(float(per_step[0].get(MAIN, 0.0)), s.growth_floor)
    grown = [
        {MAIN: base * (1.0 + (s.growth + 1.0) * i / max(1, len(per_step) - 1))} for i in range(len(per_step))
    ]
    flat = [{MAIN: base} for _ in per_step]
    return [
        _control(GROWTH, f"mean |Δ| growing to {s.growth + 2:g}x step 0's", "fail", judge_growth(grown, s)),
        _control(GROWTH, "a flat mismatch", "pass", judge_growth(flat, s)),
    ]


def identity_controls(m: Mapping[str, float], s: RLSettings) -> list[Control]:
    moved = {**m, MAIN: float(m.get(MAIN, 0.0)) + 10 * max(s.identity_tol, 1e-12)}
    return [
        _control(IDENTITY, "one sampled token changed", "fail", judge_identity(1, 0, m, m, False, s)),
        _control(
            IDENTITY, "mean |Δ| moved past the tolerance", "fail", judge_identity(1, 0, moved, m, True, s)
        ),
        _control(IDENTITY, "the same rollouts", "pass", judge_identity(1, 0, m, m, True, s)),
    ]


def version_controls() -> list[Control]:
    return [
        _control(VERSION, "the version did not advance", "fail", judge_version(2, "2", "1", "1")),
        _control(VERSION, "the version asked", "pass", judge_version(2, "2", "2", "1")),
        _control(
            VERSION,
            "tokens sampled by the previous version",
            "fail",
            judge_version(2, "2", "2", "1", {"r": (4, [{"version": "1", "start": 0, "end": 2},
                                                       {"version": "2", "start": 2, "end": 4}])}),
        ),
        _control(
            VERSION,
            "every token by the version asked",
            "pass",
            judge_version(2, "2", "2", "1", {"r": (4, [{"version": "2", "start": 0, "end": 4}])}),
        ),
    ]


def routing_controls(judge: Callable[[str], Verdict], names: Sequence[str]) -> list[Control]:
    """``judge(name)``: the routing verdict with the replay ``name`` instead of the engine's routes."""
    out = []
    for name, what in (("r3_other", "routes replayed from another request"), ("r3_zero", "all-zero routes")):
        if name in names:
            out.append(_control(ROUTING, what, "fail", judge(name)))
    if "r3" in names:
        out.append(_control(ROUTING, "the engine's own routes", "pass", judge("r3")))
    return out
