"""The suite's settings (:mod:`harness.kinds.sampling.settings`) and the oracle's rows -> the gate's tests.

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
``alpha / m`` with probability ``power`` (:func:`harness.kinds.sampling.gof.draws_for`, and
:data:`~harness.kinds.sampling.draws.PLAN_MARGIN`), divided by the chance of the conditioning path,
capped at ``max_draws``; the record states every test's exact detectable TV, and so says when the cap bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from harness.abilities import SamplePass, SampleRequest
from harness.api import SAMPLER_PARAMETERS, Case, Sampling
from harness.kinds.sampling import faults, gof
from harness.kinds.sampling.draws import MIN_JUDGED, OracleRows, judged_draws
from harness.kinds.sampling.settings import GateSettings, Setting
from harness.kinds.sampling.sites import ControlSite, Site, control_draws, control_site, site_record
from harness.sampling.transforms import CHAINS, Chain, Reference, softmax

SEED_SPACING = 1_000_003
"""Test i draws with seeds ``seed + i * SEED_SPACING + j``: no two tests share a seed."""


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
    control: bool = False
    """Its position was chosen, and its draws sized, for the setting's planted faults
    (:class:`ControlSite`), not (only) for the target TV."""

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
    sites: tuple[ControlSite, ...] = ()
    """Per setting: where its planted faults are tested, what they move there, the power."""
    passed_over: tuple[str, ...] = ()
    """``<case>@<t>/<setting>: why``: least decided positions a ``step`` setting moved past, its
    path too unlikely there (:func:`positions_for`)."""

    @property
    def level(self) -> float:
        """The Bonferroni level every stated power is computed at (Holm's first step)."""
        return self.gs.alpha / max(1, sum(t.runs for t in self.tests))

    def passes(self, lanes: Sequence[str] = ("repeat", "alone")) -> tuple[SamplePass, ...]:
        """``main``: every test, then the determinism requests; ``repeat``: those again, in the
        reverse order, so that each follows another request than it did in ``main`` (a seeded draw
        must not depend on what ran before it: llama.cpp's prefix cache made one); ``alone``: each
        in a call of its own."""
        main = tuple(t.request() for t in self.tests if t.runs)
        det = tuple(t.request(self.gs.repeat_draws, f"{t.id}#det") for t in self.det)
        out = [SamplePass("main", main + det)]
        if "repeat" in lanes:
            out.append(SamplePass("repeat", det[::-1]))
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


def ranked(o: OracleRows, gs: GateSettings) -> list[int]:
    """Every candidate position, the least decided first (highest entropy of the oracle's raw
    distribution): a position where one token takes all the mass tests nothing but support."""

    def entropy(t: int) -> float:
        p = softmax(o.rows[t])
        return float(-(p[p > 0] * np.log(p[p > 0])).sum())

    return sorted(candidates(o.case, o.greedy, gs), key=entropy, reverse=True)


def positions(o: OracleRows, gs: GateSettings) -> list[int]:
    """The ``positions_per_case`` least decided candidates (:func:`ranked`)."""
    return sorted(ranked(o, gs)[: gs.positions_per_case])


def positions_for(
    o: OracleRows, s: Setting, gs: GateSettings, chain: Chain
) -> tuple[list[int], list[str]]:
    """The positions setting ``s`` is tested at in case ``o``, and what was passed over: the
    :func:`positions`, except that a setting drawing ``step`` > 0 tokens before the judged one
    moves on down :func:`ranked` past a position where the oracle's path is too unlikely under it
    to be judged (:func:`_unlikely`): the next least decided one takes its place, block-aligned
    first, then any."""
    order = ranked(o, gs)
    if s.step == 0:
        return sorted(order[: gs.positions_per_case]), []
    chosen: list[int] = []
    unlikely: list[tuple[int, str]] = []
    # the block-aligned candidates first; then any position (a prefix off the block boundary costs
    # an engine with a block prefix cache up to a block of prefill per draw, as a control site does)
    anywhere = ranked(o, replace(gs, align=1))
    for t in order + [t for t in anywhere if t not in order]:
        if len(chosen) == gs.positions_per_case:
            break
        _prefix, path, _rows, _refs, p_path = _path_at(o, t, s, chain, gs)
        why = _unlikely(p_path, path, gs)
        if why is None:
            chosen.append(t)
        else:
            unlikely.append((t, why))
    # too few judgeable positions: the least decided unlikely ones are kept, as skips that say why
    kept = unlikely[: gs.positions_per_case - len(chosen)]
    passed = [f"{o.case.id}@{t}/{s.id}: {why}" for t, why in unlikely[len(kept):]]
    return sorted(chosen + [t for t, _ in kept]), passed


def _path_at(
    o: OracleRows, t: int, s: Setting, chain: Chain, gs: GateSettings
) -> tuple[tuple[int, ...], tuple[int, ...], list[np.ndarray], list[Reference], float]:
    """(prefix, path, raw rows, references, the path's chance) of setting ``s`` at position t."""
    prefix = tuple(o.case.prompt_ids) + tuple(o.greedy[:t])
    path = tuple(o.greedy[t : t + s.step])
    rows = [o.rows[t + j] for j in range(s.step + 1)]
    refs = faults.references(rows, s.sampling, prefix, path, chain, gs.boundary_tol)
    return prefix, path, rows, refs, faults.path_probability(refs, path)


def _unlikely(p_path: float, path: Sequence[int], gs: GateSettings) -> str | None:
    """Why a test on this path is not drawn, or None: capped draws would judge fewer than
    :data:`MIN_JUDGED` (3.1 standard deviations to spare)."""
    expect = gs.max_draws * p_path - 3.1 * math.sqrt(gs.max_draws * p_path * (1 - p_path))
    if expect >= MIN_JUDGED:
        return None
    return (f"the oracle's path {list(path)} has probability {p_path:.2g} under this setting: "
            f"{gs.max_draws} draws would judge fewer than {MIN_JUDGED}")


def rows_needed(
    cases: Sequence[Case], greedy: Mapping[str, Sequence[int]], gs: GateSettings
) -> dict[str, list[int]]:
    """Per case: the oracle rows the tests may read — every position of the greedy continuation,
    since a setting's planted faults may be judged at any of them (:func:`control_site`)."""
    return {c.id: list(range(len(greedy[c.id]))) for c in cases}


@dataclass(eq=False)
class _Entry:
    o: OracleRows
    t: int
    s: Setting
    control: bool = False


def make_plan(
    oracle: Sequence[OracleRows],
    gs: GateSettings,
    chain: Chain | str,
    unsupported: Mapping[str, str] | None = None,
) -> Plan:
    """The tests of the gate for an engine following ``chain`` (its references and draws): the
    ``positions_per_case`` least decided block-aligned positions of every case for every setting,
    and per setting the position where its planted faults are judged
    (:func:`~harness.kinds.sampling.sites.control_site`)."""
    chain = CHAINS.get(chain) if isinstance(chain, str) else chain
    missing = {**dict(chain.unsupported), **dict(unsupported or {})}
    entries: list[_Entry] = []
    skipped = []
    passed: list[str] = []
    for o in oracle:
        if not positions(o, gs):
            skipped.append(
                f"{o.case.id}: no position t with len(prompt) + t = 1 (mod {gs.align}) inside "
                f"its {len(o.greedy)} greedy tokens"
            )
        for s in gs.settings:  # a refused setting is never drawn: nothing to move past
            pos, over = ((positions(o, gs), []) if _refusal(s, missing) is not None
                         else positions_for(o, s, gs, chain))
            entries += [_Entry(o, t, s) for t in pos]
            passed += over
    # the sites are chosen at the level of the largest family they can make (a bound: the final
    # level is that or higher, so the power only grows)
    bound = gs.alpha / max(1, len(entries) + len(gs.settings))
    found: dict[str, Site | str] = {}
    for s in gs.settings:
        if _refusal(s, missing) is not None or not faults.of(s.param):
            continue
        site = control_site(oracle, s, gs, chain, bound)
        found[s.id] = site
        if isinstance(site, str):
            continue
        same = next((e for e in entries if e.o is site.o and e.t == site.t and e.s is s), None)
        if same is not None:
            same.control = True
        else:
            entries.append(_Entry(site.o, site.t, s, True))
    built = []
    for e in entries:
        prefix, path, rows, refs, p_path = _path_at(e.o, e.t, e.s, chain, gs)
        skip = _unlikely(p_path, path, gs)
        built.append((e, prefix, path, refs, rows, p_path, _refusal(e.s, missing), skip))
    level = gs.alpha / max(1, sum(1 for b in built if b[6] is None and b[7] is None))
    tests, det, seen, sites = [], [], set(), []
    for i, (e, prefix, path, refs, rows, p_path, refusal, skip) in enumerate(built):
        o, t, s = e.o, e.t, e.s
        judged, draws = judged_draws(refs[-1], p_path, level, gs) if skip is None else (0, 0)
        if e.control and skip is None:
            site = found[s.id]
            assert isinstance(site, Site)
            c_judged, c_draws, power = control_draws(refs, site.alts, path, p_path, judged, level, gs)
            judged, draws = max(judged, c_judged), max(draws, c_draws)  # never fewer than the target's
            sites.append(site_record(s, f"{o.case.id}@{t}/{s.id}", site, power, draws, gs))
        planned = gof.cells_for(refs[-1].probs, judged, gs.min_expected, gs.max_cells, refs[-1].ranked)
        test = Test(f"{o.case.id}@{t}/{s.id}", o.case.id, t, s, prefix, path, tuple(refs),
                    tuple(rows), p_path, draws, judged, gs.seed + i * SEED_SPACING, planned, refusal,
                    skip, e.control)
        tests.append(test)
        if s.id not in seen and test.runs:
            seen.add(s.id)
            det.append(test)
    for s in gs.settings:
        why = found.get(s.id)
        if isinstance(why, str):
            n = sum(max(0, len(o.greedy) - s.step) for o in oracle)
            sites.append(ControlSite(s.id, s.param, None, (), 0.0, 0, False, n, why))
    return Plan(gs, chain, tuple(tests), tuple(det), tuple(skipped), tuple(sites), tuple(passed))

def _refusal(s: Setting, missing: Mapping[str, str]) -> str | None:
    neutral = Sampling(1, temperature=1.0)
    why = [missing[p] for p in SAMPLER_PARAMETERS
           if p in missing and getattr(s.sampling, p) != getattr(neutral, p)]
    return "; ".join(why) or None
