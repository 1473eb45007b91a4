"""A sampling suite's ``[sampling_gate]`` table: its settings (one sampler configuration each, and
the FEATURES.md row it exercises) and its bars, validated with errors naming the file, the table and
the key. :mod:`harness.kinds.sampling.plan` turns them into tests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.api import SAMPLER_PARAMETERS, Sampling
from harness.suites import Suite, SuiteError
from harness.tomlcheck import (
    Where,
    check_keys,
    need_choice,
    need_int,
    need_number,
    need_str,
    need_table,
    need_tables,
)

MIN_EXPECTED = 5.0
"""Smallest expected count of a cell of its own (a fit's default)."""
MAX_CELLS = 16
"""Cells per fit, the pooled rest included (a fit's default)."""
TABLE = "sampling_gate"
PARAMS_ROWS = (*SAMPLER_PARAMETERS, "order")
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
    control_power: float = 0.999
    """The power every planted fault of a setting is planned for at its site (the vacuous-gate
    guard: a control that passes makes the record vacuous, so a guard of eight controls wants
    each of them far above ``power``)."""
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
                    "control_power",
                    "target_tv",
                    "min_expected",
                    "max_cells",
                    "boundary_tol",
                    "logprob_tol",
                )
            },
        }


_GATE_INTS: Mapping[str, int] = {
    "positions_per_case": 1,
    "align": 0,
    "max_draws": 20,
    "repeat_draws": 1,
    "control_repetitions": 0,
    "seed": 0,
}
"""The integer keys of ``[sampling_gate]`` and the least value of each."""
_SETTING_KEYS = ("id", "param", "step", *SAMPLER_PARAMETERS)
_BARS: Mapping[str, tuple[float, float]] = {
    "alpha": (1e-6, 0.5),
    "power": (0.5, 0.9999),
    "control_power": (0.5, 0.99999),
    "target_tv": (1e-4, 1.0),
    "min_expected": (1.0, 1e6),
    "max_cells": (3, 10_000),
    "boundary_tol": (0.0, 1.0),
    "logprob_tol": (0.0, 10.0),
}


def _setting(raw: dict[str, Any], w: Where) -> Setting:
    check_keys(raw, w, _SETTING_KEYS)
    sid = need_str(raw, "id", w)
    param = need_choice(raw, "param", w, PARAMS_ROWS)
    step = need_int(raw, "step", w, 0, lo=0, hi=4)
    t = need_number(raw, "temperature", w, 1.0, lo=0, lo_open=True)
    k = need_int(raw, "top_k", w, 0, lo=0)
    p = need_number(raw, "top_p", w, 1.0, lo=0, hi=1, lo_open=True)
    mp = need_number(raw, "min_p", w, 0.0, lo=0, hi=1)
    if mp >= 1:
        raise (w / "min_p").fail(f"expected a number in [0, 1), got {raw['min_p']!r}")
    rp = need_number(raw, "repetition_penalty", w, 1.0, lo=0, lo_open=True)
    pp = need_number(raw, "presence_penalty", w, 0.0)
    fp = need_number(raw, "frequency_penalty", w, 0.0)
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
        raise (w / "param").fail(f"is {param!r} but setting {sid!r} leaves {param} at its default")
    if param == "order" and (t == 1.0 or (p == 1.0 and mp == 0.0 and k == 0)):
        raise (w / "param").fail(
            f"setting {sid!r}: an 'order' setting needs a temperature other than 1 and a "
            f"truncation (top_p, min_p or top_k): otherwise every order agrees"
        )
    return Setting(sid, param, s, step)


def verdict_names(raw: Mapping[str, Any]) -> list[str]:
    """Every verdict name a (raw, parsed-TOML) sampling suite can produce: one per parameter a
    setting exercises, the seeds and the logprobs (what FEATURES.md rows may name in ``prove``)."""
    table = raw.get(TABLE) if isinstance(raw.get(TABLE), Mapping) else {}
    rows = table.get("settings", []) if isinstance(table, Mapping) else []
    params = [r.get("param") for r in rows if isinstance(r, Mapping)]
    return [
        *dict.fromkeys(f"sampling.{p}" for p in params if isinstance(p, str)),
        "sampling.seed",
        "sampling.logprobs",
    ]


def gate_settings(suite: Suite) -> GateSettings:
    """The validated ``[sampling_gate]`` table of ``suite``: its settings and its bars."""
    top = Where(suite.path, error=SuiteError)
    if not isinstance(suite.extra.get(TABLE), dict):
        other = f" (suite {suite.name!r} is of kind {suite.kind!r})" if suite.kind != "sampling" else ""
        raise top.fail(f"a sampling suite needs a [{TABLE}] table with its settings{other}")
    raw = need_table(suite.extra, TABLE, top)
    where = top / TABLE
    check_keys(raw, where, [*_GATE_INTS, "settings", *_BARS])
    kw: dict[str, Any] = {k: need_int(raw, k, where, lo=lo) for k, lo in _GATE_INTS.items() if k in raw}
    settings = tuple(_setting(r, w) for w, r in need_tables(raw, "settings", where))
    ids = [s.id for s in settings]
    dup = next((x for x in ids if ids.count(x) > 1), None)
    if dup:
        raise (where / "settings").fail(f"two settings have id {dup!r}")
    for key, (lo, hi) in _BARS.items():
        if key in raw:
            v = need_number(raw, key, where, lo=lo, hi=hi)
            if key == "alpha" and v >= 0.5:
                raise (where / key).fail(f"expected a number in [{lo:g}, {hi:g}), got {v!r}")
            kw[key] = int(v) if key == "max_cells" else v
    return GateSettings(settings, **kw)
