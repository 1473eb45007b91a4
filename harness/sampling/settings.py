"""A sampling suite's ``[sampling_gate]`` table: its settings (one sampler configuration each, and
the FEATURES.md row it exercises) and its bars, validated with errors naming the file, the table and
the key. :mod:`harness.sampling.plan` turns them into tests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.api import Sampling
from harness.sampling.transforms import PARAMETERS
from harness.suites import Suite, SuiteError

MIN_EXPECTED = 5.0
"""Smallest expected count of a cell of its own (a fit's default)."""
MAX_CELLS = 16
"""Cells per fit, the pooled rest included (a fit's default)."""
TABLE = "sampling_gate"
PARAMS_ROWS = (*PARAMETERS, "order")
"""What a setting may claim to exercise (one FEATURES.md row each): a parameter, or ``order`` (a
truncation with a temperature other than 1, where the engines' orders disagree)."""


@dataclass(frozen=True, slots=True)
class Setting:
    id: str
    param: str
    """The parameter it exercises (its FEATURES.md row): one of :data:`PARAMS_ROWS`."""
    sampling: Sampling
    """temperature, top-k/p, min-p, penalties (max_tokens = step + 1, logprobs 1)."""
    step: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "param": self.param,
            "step": self.step,
            **{
                k: v
                for k, v in self.sampling.to_json().items()
                if k not in ("max_tokens", "logprobs", "seed")
            },
        }


@dataclass(frozen=True, slots=True)
class GateSettings:
    settings: tuple[Setting, ...]
    positions_per_case: int = 2
    align: int = 32
    max_draws: int = 4000
    repeat_draws: int = 8
    control_repetitions: int = 200
    seed: int = 1
    alpha: float = 0.01
    power: float = 0.9
    target_tv: float = 0.1
    min_expected: float = MIN_EXPECTED
    max_cells: int = MAX_CELLS
    boundary_tol: float = 1e-3
    logprob_tol: float = 1e-3

    @property
    def max_step(self) -> int:
        return max((s.step for s in self.settings), default=0)

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": [s.to_json() for s in self.settings],
            **{
                k: getattr(self, k)
                for k in (
                    "positions_per_case",
                    "align",
                    "max_draws",
                    "repeat_draws",
                    "control_repetitions",
                    "seed",
                    "alpha",
                    "power",
                    "target_tv",
                    "min_expected",
                    "max_cells",
                    "boundary_tol",
                    "logprob_tol",
                )
            },
        }


_GATE_KEYS: Mapping[str, tuple[type | tuple[type, ...], str]] = {
    "positions_per_case": (int, "an int >= 1"),
    "align": (int, "an int >= 0"),
    "max_draws": (int, "an int >= 20"),
    "repeat_draws": (int, "an int >= 1"),
    "control_repetitions": (int, "an int >= 0"),
    "seed": (int, "an int >= 0"),
    "settings": (list, "an array of tables ([[sampling_gate.settings]])"),
}
_SETTING_KEYS = (
    "id",
    "param",
    "step",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)
_BARS: Mapping[str, tuple[float, float]] = {
    "alpha": (1e-6, 0.5),
    "power": (0.5, 0.9999),
    "target_tv": (1e-4, 1.0),
    "min_expected": (1.0, 1e6),
    "max_cells": (3, 10_000),
    "boundary_tol": (0.0, 1.0),
    "logprob_tol": (0.0, 10.0),
}


def _check(where: str, key: str, v: Any, typ: type | tuple[type, ...], want: str, ok: bool = True) -> Any:
    if isinstance(v, bool) or not isinstance(v, typ) or not ok:
        raise SuiteError(f"{where}: key {key!r} must be {want}, got {v!r}")
    return v


def _setting(raw: Any, i: int, where: str) -> Setting:
    w = f"{where}.settings[{i}]"
    if not isinstance(raw, dict):
        raise SuiteError(f"{w}: must be a table")
    stray = sorted(set(raw) - set(_SETTING_KEYS))
    if stray:
        from harness.registry import unknown

        raise SuiteError(f"{w}: {unknown('key', stray[0], _SETTING_KEYS)}")
    sid = _check(w, "id", raw.get("id"), str, "a non-empty string", bool(raw.get("id")))
    param = _check(
        w, "param", raw.get("param"), str, "one of " + ", ".join(PARAMS_ROWS), raw.get("param") in PARAMS_ROWS
    )
    step = _check(
        w, "step", raw.get("step", 0), int, "an int in 0..4", 0 <= int(raw.get("step", 0) or 0) <= 4
    )
    num = (int, float)
    t = float(
        _check(
            w,
            "temperature",
            raw.get("temperature", 1.0),
            num,
            "a number > 0",
            float(raw.get("temperature", 1.0)) > 0,
        )
    )
    k = _check(w, "top_k", raw.get("top_k", 0), int, "an int >= 0", int(raw.get("top_k", 0)) >= 0)
    p = float(
        _check(
            w,
            "top_p",
            raw.get("top_p", 1.0),
            num,
            "a number in (0, 1]",
            0 < float(raw.get("top_p", 1.0)) <= 1,
        )
    )
    mp = float(
        _check(
            w,
            "min_p",
            raw.get("min_p", 0.0),
            num,
            "a number in [0, 1)",
            0 <= float(raw.get("min_p", 0.0)) < 1,
        )
    )
    rp = float(
        _check(
            w,
            "repetition_penalty",
            raw.get("repetition_penalty", 1.0),
            num,
            "a number > 0",
            float(raw.get("repetition_penalty", 1.0)) > 0,
        )
    )
    pp = float(
        _check(
            w,
            "presence_penalty",
            raw.get("presence_penalty", 0.0),
            num,
            "a number",
        )
    )
    fp = float(_check(w, "frequency_penalty", raw.get("frequency_penalty", 0.0), num, "a number"))
    s = Sampling(
        step + 1,
        1,
        t,
        0,
        top_p=p,
        top_k=k,
        min_p=mp,
        repetition_penalty=rp,
        presence_penalty=pp,
        frequency_penalty=fp,
    )
    if param != "order" and getattr(s, param) == getattr(Sampling(1, temperature=1.0), param):
        raise SuiteError(f"{w} ({sid}): param is {param!r} but the setting leaves {param} at its default")
    if param == "order" and (t == 1.0 or (p == 1.0 and mp == 0.0 and k == 0)):
        raise SuiteError(
            f"{w} ({sid}): an 'order' setting needs a temperature other than 1 and a "
            f"truncation (top_p, min_p or top_k): otherwise every order agrees"
        )
    return Setting(sid, param, s, step)


def verdict_names(raw: Mapping[str, Any]) -> list[str]:
    """Every verdict name a (raw, parsed-TOML) sampling suite can produce: one per parameter a
    setting exercises, the seeds and the logprobs (what FEATURES.md rows may name in ``prove``)."""
    table = raw.get(TABLE) if isinstance(raw.get(TABLE), Mapping) else {}
    rows = table.get("settings", []) if isinstance(table, Mapping) else []
    params = [r.get("param") for r in rows if isinstance(r, Mapping)]
    return [*dict.fromkeys(f"sampling.{p}" for p in params if isinstance(p, str)),
            "sampling.seed", "sampling.logprobs"]


def gate_settings(suite: Suite) -> GateSettings:
    """The validated ``[sampling_gate]`` table of ``suite``: its settings and its bars."""
    where = f"{suite.path} [{TABLE}]"
    raw = suite.extra.get(TABLE)
    if not isinstance(raw, dict):
        other = f" (suite {suite.name!r} is of kind {suite.kind!r})" if suite.kind != "sampling" else ""
        raise SuiteError(f"{suite.path}: a sampling suite needs a [{TABLE}] table with its settings{other}")
    stray = sorted(set(raw) - set(_GATE_KEYS) - set(_BARS))
    if stray:
        from harness.registry import unknown

        raise SuiteError(f"{where}: {unknown('key', stray[0], [*_GATE_KEYS, *_BARS])}")
    kw: dict[str, Any] = {}
    for key, (typ, want) in _GATE_KEYS.items():
        if key in raw and key != "settings":
            v = _check(where, key, raw[key], typ, want)
            low = {"positions_per_case": 1, "max_draws": 20, "repeat_draws": 1}.get(key, 0)
            kw[key] = _check(where, key, v, typ, want, v >= low)
    settings = tuple(
        _setting(r, i, where)
        for i, r in enumerate(
            _check(
                where,
                "settings",
                raw.get("settings"),
                list,
                _GATE_KEYS["settings"][1],
                bool(raw.get("settings")),
            )
        )
    )
    ids = [s.id for s in settings]
    dup = next((x for x in ids if ids.count(x) > 1), None)
    if dup:
        raise SuiteError(f"{where}: two settings have id {dup!r}")
    for key, (lo, hi) in _BARS.items():
        if key in raw:
            v = _check(where, key, raw[key], (int, float), f"a number in [{lo:g}, {hi:g}]")
            if not lo <= v <= hi or (key == "alpha" and v >= 0.5):
                raise SuiteError(f"{where}: key {key!r} must be in [{lo:g}, {hi:g}], got {v!r}")
            kw[key] = int(v) if key == "max_cells" else float(v)
    return GateSettings(settings, **kw)

