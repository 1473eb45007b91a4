"""The suite's settings (:mod:`harness.sampling.settings`) and the oracle's rows -> the gate's tests.

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

import numpy as np

from harness.abilities import SamplePass, SampleRequest
from harness.api import Case, Sampling
from harness.sampling import gof
from harness.sampling.settings import GateSettings, Setting
from harness.sampling.transforms import CHAINS, PARAMETERS, Chain, History, Reference, softmax, transform

SEED_SPACING = 1_000_003
"""Test i draws with seeds ``seed + i * SEED_SPACING + j``: no two tests share a seed."""


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
