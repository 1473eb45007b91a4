"""The suite's ``[sampling_gate]`` table (settings and bars) -> the gate's tests.

A **test** is (case, position t, setting): the prefix is the case's prompt followed by the oracle's
first t greedy tokens (teacher forcing), the setting's parameters are the sampler's, and the judged
token is drawn ``step`` tokens after the prefix. With ``step`` > 0 every draw takes ``step + 1``
tokens and only the draws whose first ``step`` tokens are the oracle's greedy ones are judged
(the oracle's logits are known for that path only): that is how a penalty that sees only the
tokens the engine drew itself (vLLM's presence and frequency penalties, all of llama-cpp-python's)
gets something to see. ``step = 2`` on a repetitive case gives a count of 2 (frequency != presence).

Positions are the ``positions_per_case`` t, among those whose prefix length is ``1 (mod align)``,
where the oracle is least decided: every block of such a prefix but one token is full, so an engine
with a block prefix cache (vLLM's 32-token blocks) computes one token per draw instead of up to a
block, and a position with entropy tests more than the support.

Each test draws enough for its fit to detect ``target_tv`` at the Holm-Bonferroni level
``alpha / m`` with probability ``power`` (:func:`harness.sampling.gof.draws_for`, and
:data:`PLAN_MARGIN`), divided by the chance of the conditioning path, capped at ``max_draws``; the
record states every test's exact detectable TV, and so says when the cap bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from harness.api import Case, SamplePass, SampleRequest, Sampling
from harness.sampling import gof
from harness.sampling.transforms import CHAINS, PARAMETERS, Chain, History, Reference, softmax, transform
from harness.suites import Suite, SuiteError

TABLE = "sampling_gate"
PARAMS_ROWS = (*PARAMETERS, "order")
"""What a setting may claim to exercise (one FEATURES.md row each): a parameter, or ``order`` (a
truncation with a temperature other than 1, where the engines' orders disagree)."""
SEED_SPACING = 1_000_003
"""Test i draws with seeds ``seed + i * SEED_SPACING + j``: no two tests share a seed."""


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
    min_expected: float = gof.MIN_EXPECTED
    max_cells: int = gof.MAX_CELLS
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
        raise SuiteError(f"{suite.path}: a sampling suite needs a [{TABLE}] table with its settings")
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


@dataclass(frozen=True, slots=True)
class OracleRows:
    """What the oracle established for one case: its greedy continuation and its raw logits."""

    case: Case
    greedy: tuple[int, ...]
    rows: Mapping[int, np.ndarray]
    """Position t -> [V] float32 raw logits predicting greedy[t] from prompt + greedy[:t]."""


@dataclass(frozen=True, slots=True, eq=False)
class Test:
    id: str
    """``<case>@<t>/<setting>``: a verdict's case id."""
    case_id: str
    position: int
    setting: Setting
    prefix: tuple[int, ...]
    path: tuple[int, ...]
    """The oracle's tokens the draw must follow before the judged one (``step`` of them)."""
    references: tuple[Reference, ...]
    """One per step: the distribution of the token drawn at that step, given the path so far."""
    raw: tuple[np.ndarray, ...]
    """One per step: the oracle's raw logits there (the raw-logprob reference)."""
    p_path: float
    draws: int
    """Draws requested: enough for ``judged`` of them to follow the path (probability 0.999)."""
    judged: int
    """Draws judged: the first ``judged`` that followed the path (all draws when ``step`` is 0)."""
    seed: int
    planned: gof.Cells
    """The cells of the fit of ``judged`` draws (what the power is stated for)."""
    refused: str | None = None
    """Why the engine cannot run it (a parameter it does not have)."""
    skip: str | None = None
    """Why it is not drawn: the oracle's path is so unlikely under the setting that the capped
    draws would judge fewer than :data:`MIN_JUDGED`."""

    @property
    def runs(self) -> bool:
        return self.refused is None and self.skip is None

    @property
    def reference(self) -> Reference:
        """The judged token's reference."""
        return self.references[-1]

    def request(self, n: int | None = None, key: str | None = None) -> SampleRequest:
        return SampleRequest(
            key or self.id,
            self.prefix,
            replace(self.setting.sampling, seed=self.seed),
            self.draws if n is None else n,
            self.path,
        )


@dataclass(frozen=True, slots=True, eq=False)
class Plan:
    gs: GateSettings
    chain: Chain
    tests: tuple[Test, ...]
    det: tuple[Test, ...] = ()
    """One test per setting whose first ``repeat_draws`` draws also run in the determinism lanes."""
    skipped: tuple[str, ...] = field(default_factory=tuple)

    @property
    def level(self) -> float:
        """The Bonferroni level every stated power is computed at (Holm's first step)."""
        return self.gs.alpha / max(1, sum(t.runs for t in self.tests))

    def passes(self, lanes: Sequence[str] = ("repeat", "alone")) -> tuple[SamplePass, ...]:
        main = tuple(t.request() for t in self.tests if t.runs)
        det = tuple(t.request(self.gs.repeat_draws, f"{t.id}#det") for t in self.det)
        out = [SamplePass("main", main + det)]
        if "repeat" in lanes:
            out.append(SamplePass("repeat", det))
        if "alone" in lanes:
            out.append(SamplePass("alone", det, alone=True))
        return tuple(out)

    @property
    def total_draws(self) -> int:
        return sum(t.draws for t in self.tests if t.runs)


def candidates(case: Case, greedy: Sequence[int], gs: GateSettings) -> list[int]:
    """Every position t whose prefix length is 1 (mod align) and whose path of ``max_step`` tokens
    still lies inside the greedy continuation."""
    last = len(greedy) - 1 - gs.max_step
    return [t for t in range(max(0, last + 1)) if gs.align <= 1 or (len(case.prompt_ids) + t) % gs.align == 1]


def positions(o: OracleRows, gs: GateSettings) -> list[int]:
    """The ``positions_per_case`` candidates where the oracle is least decided (highest entropy of
    its raw distribution): a position where one token takes all the mass tests nothing but support."""

    def entropy(t: int) -> float:
        p = softmax(o.rows[t])
        return float(-(p[p > 0] * np.log(p[p > 0])).sum())

    return sorted(
        sorted(candidates(o.case, o.greedy, gs), key=entropy, reverse=True)[: gs.positions_per_case]
    )


def rows_needed(
    cases: Sequence[Case], greedy: Mapping[str, Sequence[int]], gs: GateSettings
) -> dict[str, list[int]]:
    """Per case: the oracle rows the tests may read (each candidate position and the ``max_step``
    after it)."""
    return {
        c.id: sorted({t + j for t in candidates(c, greedy[c.id], gs) for j in range(gs.max_step + 1)})
        for c in cases
    }


def make_plan(
    oracle: Sequence[OracleRows],
    gs: GateSettings,
    chain: Chain | str,
    unsupported: Mapping[str, str] | None = None,
) -> Plan:
    """The tests of the gate for an engine following ``chain`` (its references and draws)."""
    chain = CHAINS.get(chain) if isinstance(chain, str) else chain
    missing = {**dict(chain.unsupported), **dict(unsupported or {})}
    raw_tests = []
    skipped = []
    for o in oracle:
        pos = positions(o, gs)
        if not pos:
            skipped.append(
                f"{o.case.id}: no position t with len(prompt) + t = 1 (mod {gs.align}) inside "
                f"its {len(o.greedy)} greedy tokens"
            )
        for t in pos:
            for s in gs.settings:
                raw_tests.append((o, t, s))
    built = []
    for o, t, s in raw_tests:
        prefix = tuple(o.case.prompt_ids) + tuple(o.greedy[:t])
        path = tuple(o.greedy[t : t + s.step])
        refs, p_path = [], 1.0
        for j in range(s.step + 1):
            hist = History(prefix + path[:j], path[:j])
            refs.append(transform(o.rows[t + j], s.sampling, hist, chain, tol=gs.boundary_tol))
            if j < s.step:
                p_path *= float(refs[-1].probs[path[j]])
        expect = gs.max_draws * p_path - 3.1 * math.sqrt(gs.max_draws * p_path * (1 - p_path))
        skip = None if expect >= MIN_JUDGED else (
            f"the oracle's path {list(path)} has probability {p_path:.2g} under this setting: "
            f"{gs.max_draws} draws would judge fewer than {MIN_JUDGED}")
        built.append((o, t, s, prefix, path, refs, p_path, _refusal(s, missing), skip))
    level = gs.alpha / max(1, sum(1 for b in built if b[7] is None and b[8] is None))
    tests, det, seen = [], [], set()
    for i, (o, t, s, prefix, path, refs, p_path, refusal, skip) in enumerate(built):
        judged, draws = judged_draws(refs[-1], p_path, level, gs) if skip is None else (0, 0)
        planned = gof.cells_for(refs[-1].probs, judged, gs.min_expected, gs.max_cells, refs[-1].ranked)
        raws = tuple(o.rows[t + j] for j in range(s.step + 1))
        test = Test(f"{o.case.id}@{t}/{s.id}", o.case.id, t, s, prefix, path, tuple(refs), raws, p_path,
                    draws, judged, gs.seed + i * SEED_SPACING, planned, refusal, skip)
        tests.append(test)
        if s.id not in seen and test.runs:
            seen.add(s.id)
            det.append(test)
    return Plan(gs, chain, tuple(tests), tuple(det), tuple(skipped))


MIN_JUDGED = 20
"""A test whose capped draws would follow the oracle's path fewer times than this is not drawn."""
PLAN_MARGIN = 1.1
"""Draws are planned by the asymptotic critical value, then 10 % more, then checked by the exact
(Monte Carlo) one and grown until it meets the target too. The judge states the exact detectable TV
of every test it judged."""


def judged_draws(ref: Reference, p_path: float, level: float, gs: GateSettings) -> tuple[int, int]:
    """(draws judged, draws requested) for a fit of ``ref`` to detect ``target_tv``; the requests
    cover the path's chance with 3.1 standard deviations to spare (the cap wins)."""
    n = gof.draws_for(
        ref.probs,
        gs.target_tv,
        level,
        gs.power,
        cap=gs.max_draws,
        min_expected=gs.min_expected,
        max_cells=gs.max_cells,
    )
    if int(np.count_nonzero(ref.probs > 0)) > 1:
        n = min(gs.max_draws, math.ceil(n * PLAN_MARGIN))
    for _ in range(4):  # the exact critical value may still want more: TV shrinks as 1/sqrt(n)
        cells = gof.cells_for(ref.probs, n, gs.min_expected, gs.max_cells, ref.ranked)
        if cells.method != "chi2" or n >= gs.max_draws:
            break
        d = gof.detectable_tv(cells, level, gs.power)
        if d <= gs.target_tv:
            break
        n = min(gs.max_draws, math.ceil(n * (d / gs.target_tv) ** 2 * 1.02))
    if p_path >= 1.0:
        return n, n
    if p_path <= 0.0:
        return 0, gs.max_draws
    draws = math.ceil((n + 3.1 * math.sqrt(n * (1 - p_path))) / p_path)
    if draws > gs.max_draws:
        sd = math.sqrt(gs.max_draws * p_path * (1 - p_path))
        return max(1, int(gs.max_draws * p_path - 3.1 * sd)), gs.max_draws
    return n, draws


def _refusal(s: Setting, missing: Mapping[str, str]) -> str | None:
    neutral = Sampling(1, temperature=1.0)
    why = [missing[p] for p in PARAMETERS if p in missing and getattr(s.sampling, p) != getattr(neutral, p)]
    return "; ".join(why) or None
