"""The NMSE profile of one diverged case: every tapped tensor of the candidate against the oracle's,
in model order, and where the two engines part.

Two numbers judge it, both settable in the diagnosed suite's ``[localize]`` table:

* the **floor** (default 1e-8): the engines *part* at the first tensor whose NMSE exceeds it. Two
  float32 engines computing the same model agree far below it (transformers and the pinned vLLM on
  CPU: ~1e-13 on every tensor of tiny-llama); a changed weight, a wrong kernel or a lower precision
  leaves it at the sub-block where it acts, and the tensors downstream inherit the difference.
* the **bar** (default 5e-4, the cross-device bar of a C++ vLLM port): over it, a sub-block's
  output is not within what another device or kernel may change. A part under the bar is named as
  such (a relative 1e-2 change of one MLP weight gives ~3e-5 where it acts).

Where nothing exceeds the floor, the teacher-forced forward pass agrees and the divergence comes
from elsewhere (the decoding path, batching, sampling): the profile says so instead of guessing.
NMSE is ``sum((candidate - oracle)^2) / sum(oracle^2)`` over every compared position
(:func:`harness.compare.nmse.nmse_rows`), and also at the divergence row alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.compare.kl import json_number
from harness.compare.nmse import DEFAULT_MAX_NMSE, nmse_rows
from harness.tomlcheck import Where, check_keys, need_bool, need_number, need_table

DEFAULT_BAR = DEFAULT_MAX_NMSE
DEFAULT_FLOOR = 1e-8


def sci(x: float | None) -> str:
    """``3.1e-2``, ``2e-9`` (two significant digits at most, the exponent unpadded); ``—`` for None."""
    if x is None:
        return "—"
    if x == 0:
        return "0"
    if not np.isfinite(x):
        return str(x)
    m, e = f"{x:.1e}".split("e")
    return f"{m.removesuffix('.0')}e{int(e)}"


def pretty(name: str) -> str:
    """``layer.1.mlp`` -> ``layer 1 mlp``."""
    return name.replace(".", " ")


@dataclass(frozen=True, slots=True)
class Step:
    """One tensor of the profile."""

    name: str
    nmse: float
    """Over every compared position."""
    nmse_row: float
    """At the divergence row alone (the position that predicts the first divergent token)."""
    growth: float | None
    """``nmse`` over the previous tensor's (None for the first, or after an exact zero)."""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "nmse": json_number(self.nmse), "nmse_row": json_number(self.nmse_row),
                "growth": json_number(self.growth) if self.growth is not None else None}


@dataclass(frozen=True, slots=True)
class Profile:
    case_id: str
    steps: tuple[Step, ...]
    positions: int
    """Rows compared: the prompt and the oracle's tokens up to and including the divergent one."""
    row: int
    """The divergence row (0-based; the last compared row predicts the token after the divergent one)."""
    bar: float
    floor: float
    missing: tuple[str, ...] = ()
    """Tensors the oracle has and the candidate did not give (never judged)."""
    top1: Mapping[str, int] | None = None
    """At the divergence row, each side's most likely next token under teacher forcing."""
    diverged: bool = True
    """False: a case profiled over its whole sequence although its generation did not diverge."""

    @property
    def parts_at(self) -> Step | None:
        return next((s for s in self.steps if s.nmse > self.floor), None)

    @property
    def over_bar(self) -> Step | None:
        return next((s for s in self.steps if s.nmse > self.bar), None)

    def before(self, step: Step) -> float:
        """The largest NMSE of the tensors before ``step`` (0 when it is the first)."""
        i = self.steps.index(step)
        return max((s.nmse for s in self.steps[:i]), default=0.0)

    def line(self) -> str:
        """The console's one line: ``c03: parts at layer 1 mlp (NMSE 3.1e-2; everything before ≤ 2e-9)``."""
        part = self.parts_at
        if part is None:
            worst = max(self.steps, key=lambda s: s.nmse, default=None)
            where = f"largest NMSE {sci(worst.nmse)} at {pretty(worst.name)}, " if worst else ""
            head = f"{self.case_id}: no sub-block parts ({where}floor {sci(self.floor)})"
            if not self.diverged:
                return head + ": the case did not diverge either"
            return (head + ": the teacher-forced forward pass agrees; the divergence comes from elsewhere "
                    "(decoding, batching, sampling)")
        under = "" if part.nmse > self.bar else f", under the {sci(self.bar)} bar"
        before = (f"everything before ≤ {sci(self.before(part))}" if part is not self.steps[0]
                  else "the first tapped sub-block")
        return f"{self.case_id}: parts at {pretty(part.name)} (NMSE {sci(part.nmse)}{under}; {before})"

    def to_json(self) -> dict[str, Any]:
        part, over = self.parts_at, self.over_bar
        return {"case_id": self.case_id, "positions": self.positions, "row": self.row, "bar": self.bar,
                "floor": self.floor, "parts_at": part.name if part else None,
                "parts_nmse": json_number(part.nmse) if part else None,
                "before_max": json_number(self.before(part)) if part else None,
                "over_bar": over.name if over else None, "line": self.line(), "diverged": self.diverged,
                "steps": [s.to_json() for s in self.steps], "missing": list(self.missing),
                **({"top1": dict(self.top1)} if self.top1 is not None else {})}


def profile(case_id: str, oracle: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray],
            positions: int, row: int, bar: float = DEFAULT_BAR, floor: float = DEFAULT_FLOOR,
            diverged: bool = True) -> Profile:
    """The profile over the first ``positions`` rows of each tensor, in the oracle's (model) order.

    Raises ``ValueError`` when a tensor holds fewer rows or another width than the oracle's."""
    steps: list[Step] = []
    missing = []
    prev: float | None = None
    for name, ref in oracle.items():
        if name not in candidate:
            missing.append(name)
            continue
        a, b = np.asarray(ref)[:positions], np.asarray(candidate[name])[:positions]
        if a.shape != b.shape or a.shape[0] != positions:
            raise ValueError(f"{case_id}: {name}: oracle rows {list(a.shape)}, candidate rows "
                             f"{list(b.shape)}, {positions} positions compared")
        total, per = nmse_rows(a, b)
        growth = total / prev if prev not in (None, 0.0) else None
        steps.append(Step(name, total, float(per[row]), growth))
        prev = total
    top1 = None
    if "logits" in oracle and "logits" in candidate:
        top1 = {"oracle": int(np.argmax(oracle["logits"][row])),
                "candidate": int(np.argmax(candidate["logits"][row]))}
    return Profile(case_id, tuple(steps), positions, row, bar, floor, tuple(missing), top1, diverged)


def settings(extra: Mapping[str, Any], top: Where) -> tuple[float, float]:
    """(bar, floor) from a suite's ``[localize]`` table (``extra``: the suite's other tables, ``top``:
    the suite file); a bad value is an error naming the file and the key."""
    table = need_table(extra, "localize", top, {})
    where = top / "localize"
    check_keys(table, where, ("nmse_bar", "nmse_floor", "auto"))
    bar = need_number(table, "nmse_bar", where, DEFAULT_BAR, lo=0, lo_open=True)
    floor = need_number(table, "nmse_floor", where, DEFAULT_FLOOR, lo=0, lo_open=True)
    if floor >= bar:
        raise (where / "nmse_floor").fail(f"nmse_floor {floor:g} must be below nmse_bar {bar:g}")
    need_bool(table, "auto", where, True)
    return bar, floor


def planted(oracle: Mapping[str, np.ndarray], at: str, scale: float, seed: int = 0) -> dict[str, np.ndarray]:
    """A copy of ``oracle`` that parts at tensor ``at``: noise of NMSE ``scale`` added there and to
    every tensor after it (the controls of a localization, and tests)."""
    rng = np.random.default_rng(seed)
    names = list(oracle)
    i = names.index(at)
    out = {}
    for j, name in enumerate(names):
        a = np.asarray(oracle[name], np.float32)
        if j >= i:
            noise = rng.standard_normal(a.shape).astype(np.float32)
            a = a + noise * np.float32(np.sqrt(scale * float((a.astype(np.float64) ** 2).sum())
                                               / max(float((noise.astype(np.float64) ** 2).sum()), 1e-30)))
        out[name] = a
    return out


def controls_of(oracle: Mapping[str, np.ndarray], positions: int, row: int, bar: float, floor: float
                ) -> list[tuple[str, str, str | None, str | None]]:
    """(mutation, expect, got, wanted) for the controls of one case's profile: the oracle against
    itself must part nowhere; copies planted at a middle tensor, under the bar and over it, must part
    exactly there."""
    names = [n for n in oracle if n != "logits"] or list(oracle)
    mid = names[len(names) // 2]
    same = profile("control", oracle, oracle, positions, row, bar, floor).parts_at
    out: list[tuple[str, str, str | None, str | None]] = [
        ("identical tensors", "pass", same.name if same else None, None)]
    for scale in (floor * 1e3, bar * 10):
        p = profile("control", oracle, planted(oracle, mid, scale), positions, row, bar, floor).parts_at
        out.append((f"planted at {mid}, NMSE {sci(scale)}", "fail", p.name if p else None, mid))
    return out


def order_by(names: Sequence[str], tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``tensors`` in the order of ``names`` (unknown names last, as given)."""
    head = {n: tensors[n] for n in names if n in tensors}
    return {**head, **{k: v for k, v in tensors.items() if k not in head}}
