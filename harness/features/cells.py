"""Records -> cells: which record a cell shows, and what it says about the row.

A cell shows the **newest record that is current for HEAD** for its (row, model, candidate) and
that no other record supersedes. A newer record that is stale — made on a branch that was never
merged, on uncommitted changes, against goldens since re-recorded — is mentioned beside it, never
shown instead of it; only when no record is current does the cell show the newest stale one, ⌛ with
why. Legend: see :data:`SYMBOL`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from harness.excerpt import INLINE, clip
from harness.features.catalog import Catalog, Column, Row
from harness.features.sources import Broken, Loaded, newest_first, slug_matches, spec_matches, superseded
from harness.kinds.registered import is_summary, staleness
from harness.records import Record, failed_positive, vacuous_reasons
from harness.staleness import Current, oracle_reasons
from harness.workspace import Workspace

State = Literal["pass", "partial", "todo", "na", "refused", "stale", "vacuous", "fail"]
SYMBOL: dict[str, str] = {"pass": "✅", "partial": "◐", "todo": "☐", "na": "n/a", "refused": "⛔",
                          "stale": "⌛", "vacuous": "VACUOUS", "fail": "❌"}
WORST: tuple[str, ...] = ("pass", "na", "todo", "stale", "refused", "partial", "vacuous", "fail")
"""States from best to worst: a cell that stands for several records shows the worst."""
WARN = "⚠"
ORACLE = "oracle"
"""The oracle column's key."""


def release_of(rec: Record) -> str:
    """The engine release a record ran: the version the engine reported, or, for an engine that died
    before it could say (``unknown``), the release its spec named (``vllm@0.22.1/...``)."""
    version = rec.candidate.version
    if version and version != "unknown":
        return version
    named = re.match(r"[\w.-]+@([^/:,]+)", rec.candidate.name)
    return named.group(1) if named else (version or "unknown")


def release_key(version: str) -> tuple[int, ...]:
    """An engine release's order: ``0.9.0`` before ``0.26.0``."""
    return tuple(int(x) if x.isdigit() else 0 for x in version.split("."))


def device_class(rec: Record) -> str | None:
    """The device class the candidate ran on: the engine's own when it reports one (transformers
    on CUDA), else the harness host's."""
    own = rec.candidate.environment.get("device_class") if rec.candidate.environment else None
    return str(own or rec.device.get("class") or "") or None


@dataclass(frozen=True, slots=True)
class Cell:
    state: State
    text: str
    """The named gap, reason or count shown after the symbol."""
    record: str | None = None
    """The cited record's path (relative to the root)."""
    sha: str | None = None
    """The harness SHA the record ran on."""
    candidate_sha: str | None = None
    warnings: tuple[str, ...] = ()
    device: str | None = None
    """The device class of the evidence (where the candidate ran)."""
    newer: tuple[tuple[str, str], ...] = ()
    """(path, why stale) of newer records that are stale (e.g. made on an unmerged branch):
    mentioned beside the current one, never shown instead of it."""
    releases: tuple[str, ...] = ()
    """For a glob column matched by several releases: each release's label (``0.26.0 ◐ (why)``), in
    release order; ``text`` joins them."""
    count: str = ""
    """The short count a page shows after the symbol: proving verdicts passed of judged (``8/8``),
    or releases passing of releases for a glob column; empty where nothing was counted."""

    @property
    def symbol(self) -> str:
        return SYMBOL[self.state]


def refusal_reason(rec: Record) -> str:
    reason = rec.extra.get("engine_refused")
    if not reason:
        v = next((v for v in rec.verdicts if v.status == "refused"), None)
        reason = (v.evidence.get("reason") or v.summary) if v else rec.summary
    return str(reason).splitlines()[0] if reason else "refused"


def _cases(ids: Sequence[str], n: int = 3) -> str:
    return ", ".join(ids[:n]) + (" …" if len(ids) > n else "")


def tally(rec: Record, prove: Sequence[str]) -> str:
    """Proving verdicts passed of those judged (``5/8``), as :func:`judge_record` counts them: a lane
    the engine never promised is left out unless nothing else was judged; "" when none was judged."""
    good = total = 0
    for c in prove:
        vs = [v for v in rec.verdicts if v.comparator == c]
        vs = [v for v in vs if not v.evidence.get("not_promised")] or vs
        vs = [v for v in vs if v.status != "skip"]
        good += sum(v.status == "pass" for v in vs)
        total += len(vs)
    return f"{good}/{total}" if total else ""


def judge_record(rec: Record, prove: Sequence[str]) -> tuple[State, str]:
    """What ``rec`` says about a row proven by ``prove``, before staleness."""
    if rec.outcome == "refused":
        return "refused", refusal_reason(rec)
    if rec.outcome == "error":
        v = next((v for v in rec.verdicts if v.status == "error"), None)
        return "fail", "engine error: " + (v.summary if v else rec.summary)
    missing = [c for c in prove if not any(v.comparator == c for v in rec.verdicts)]
    if missing:
        return "todo", f"the record has no {', '.join(missing)} verdicts"
    proving = [v for v in rec.verdicts if v.comparator in prove]
    if all(v.status == "refused" for v in proving):  # one part of a run refused (an invariance variant)
        reason = proving[0].evidence.get("reason") or proving[0].summary
        return "refused", str(reason).splitlines()[0] if reason else "refused"
    vac = vacuous_reasons(rec.controls, prove)
    if vac:
        return "vacuous", vac[0]
    gaps, passed_all, failed_all, skipped_all = [], True, True, True
    for c in prove:
        vs = [v for v in rec.verdicts if v.comparator == c]
        # a lane the engine never promised (a batch-invariant seed where one generator serves the
        # whole call) is no gap in what it does promise, unless nothing else was judged
        vs = [v for v in vs if not v.evidence.get("not_promised")] or vs
        good = [v for v in vs if v.status == "pass"]
        bad = [v.case_id for v in vs if v.status in ("fail", "error", "refused")]
        skip = [v for v in vs if v.status == "skip"]
        passed_all &= len(good) == len(vs)
        failed_all &= not good
        skipped_all &= len(skip) == len(vs)
        if len(good) != len(vs):
            gap = f"{c} {len(good)}/{len(vs)}"
            if bad:
                gap += f" ({_cases(bad)})"
            if skip:
                gap += f", {len(skip)} skipped"
            gaps.append(gap)
    if skipped_all:
        first = next(v for v in rec.verdicts if v.comparator in prove)
        if first.evidence.get("impossible"):  # the engine cannot return what the comparator needs
            return "refused", f"impossible: {first.evidence['impossible']}"
        return "todo", f"not judged: {first.summary}"
    if passed_all:
        def n(c: str) -> int:
            return sum(v.comparator == c and not v.evidence.get("not_promised") for v in rec.verdicts)

        counts = ", ".join(f"{c} {n(c)}/{n(c)}" for c in prove)
        fp = failed_positive(rec.controls, prove)
        if fp:
            return "partial", f"{counts}; {fp[0]}"
        if not any(c.comparator in prove for c in rec.controls):
            return "partial", f"{counts}; unguarded: no mutation controls recorded"
        return "pass", counts
    return ("fail" if failed_all else "partial"), "; ".join(gaps)


@dataclass(frozen=True, slots=True)
class Table:
    """Everything the two pages are rendered from (also what the tests look at)."""

    catalog: Catalog
    pin: str | None
    cells: Mapping[tuple[str, str, str], Cell]
    """(row id, model, column key or ORACLE) -> cell."""
    records: tuple[Loaded, ...]
    broken: tuple[Broken, ...]
    cited: tuple[str, ...]

    def cell(self, row: str, column: str, model: str | None = None) -> Cell:
        """One cell; ``model`` may be left out for a row shown for one model only."""
        if model is None:
            models = {m for (r, m, _c) in self.cells if r == row}
            if len(models) != 1:
                raise KeyError(f"row {row!r} is shown for {sorted(models)}: name the model")
            model = next(iter(models))
        return self.cells[(row, model, column)]


class Judge:
    """Turns records into cells against the tree as it is now."""

    def __init__(self, ws: Workspace, catalog: Catalog, records: Sequence[Loaded],
                 broken: Sequence[Broken] = (), what_if: Callable[[Current], Current] | None = None) -> None:
        """``what_if``: judge against another tree than this one (``harness repin``: another pin)."""
        self.ws, self.catalog = ws, catalog
        self.records = [lr for lr in records if not is_summary(lr.record)]
        self.broken = list(broken)
        repos = {c.candidate: c.repo for c in catalog.columns if c.repo is not None}
        for r in catalog.rows:
            for k, spec in r.candidates.items():
                col = next(c for c in catalog.columns if c.key == k)
                if col.repo is not None:
                    repos[spec] = col.repo
        self.current = Current.of(ws, repos) if what_if is None else what_if(Current.of(ws, repos))
        self.sup = superseded(self.records)
        self._stale: dict[str, list[str]] = {}

    def stale(self, lr: Loaded) -> list[str]:
        if lr.path not in self._stale:
            self._stale[lr.path] = staleness(lr.record, self.current)
        return self._stale[lr.path]

    def matching(self, row: Row, model: str, spec: str | None) -> list[Loaded]:
        """Records of the row's suite for ``model`` (and candidate ``spec``), newest first."""
        return newest_first(lr for lr in self.records
                            if lr.record.model.get("name") == model
                            and lr.record.suite.get("name") == row.suite
                            and (spec is None or spec_matches(lr.record.candidate.name, spec)))

    def shown(self, row: Row, model: str, spec: str | None) -> tuple[Loaded | None, list[Loaded]]:
        """(the record the cell shows, the newer stale records mentioned beside it)."""
        live = [lr for lr in self.matching(row, model, spec) if lr.record.id not in self.sup]
        for i, lr in enumerate(live):
            if not self.stale(lr):
                return lr, live[:i]
        return (live[0], []) if live else (None, [])

    def warnings(self, row: Row, model: str, spec: str | None) -> tuple[str, ...]:
        model_dir = model.strip("/").replace("/", "--")
        specs = [row.spec(c) for c in self.catalog.columns]
        out = []
        for b in self.broken:
            if b.model != model_dir or b.suite != row.suite:
                continue
            if (spec is None or slug_matches(b.slug, spec)
                    or not any(slug_matches(b.slug, s) for s in specs)):
                out.append(f"{WARN} unreadable record {b.path}")
        return tuple(out)

    def _newer(self, newer: Sequence[Loaded]) -> tuple[tuple[str, str], ...]:
        return tuple((lr.path, "; ".join(self.stale(lr))) for lr in newer)

    def cell(self, row: Row, model: str, col: Column) -> Cell:
        spec = row.spec(col)
        warn = self.warnings(row, model, spec)
        if col.key in row.na:
            return Cell("na", row.na[col.key], warnings=warn)
        if (several := self.several(row, model, spec)) is not None:
            return several
        lr, newer = self.shown(row, model, spec)
        if lr is None:
            if model in col.cannot_run:  # no run can be made here: say why rather than "not yet"
                return Cell("na", f"cannot be run here: {col.cannot_run[model]}", warnings=warn)
            # the same words whether or not the suite file exists yet: the page must not depend on
            # uncommitted files
            return Cell("todo", f"no record for {spec}", warnings=warn)
        rec = lr.record
        state, text = judge_record(rec, row.prove)
        if state == "pass" and (unproven := self.not_told_apart(row, model, rec)):
            state, text = "partial", f"{text}; {unproven}"
        counted = state in ("pass", "partial", "fail", "vacuous") and rec.outcome != "error"
        count = tally(rec, row.prove) if counted else ""
        why = self.stale(lr)
        if why:
            text = f"{'; '.join(why)} (was {SYMBOL[state]} {text})"
            state, count = "stale", ""
        return Cell(state, text, lr.path, rec.harness.get("sha"), rec.candidate.sha, warn,
                    device_class(rec), self._newer(newer), count=count)

    def not_told_apart(self, row: Row, model: str, rec: Record) -> str | None:
        """A planted control caught (a proving verdict naming its ``stock`` candidate) proves the gate
        bites only if some test it failed passes in the stock candidate's record of the same suite;
        a catch where the engine fails on its own is no proof. None when it is told apart."""
        for v in rec.verdicts:
            stock = v.evidence.get("stock") if v.comparator in row.prove and v.status == "pass" else None
            if not stock:
                continue
            own, _ = self.shown(row, model, str(stock))
            if own is None:
                return f"no {stock} record of {row.suite} to tell the planted fault from the engine's own"
            passed = {(x.comparator, x.case_id) for x in own.record.verdicts if x.status == "pass"}
            caught = [(x.comparator, x.case_id) for x in rec.verdicts
                      if x.status == "fail" and x.comparator not in row.prove]
            if not any(c in passed for c in caught):
                where = ", ".join(sorted({c for c, _ in caught}))
                return (f"not told apart: caught only by {where} tests that {stock} fails without the "
                        f"fault ({own.path})")
        return None

    def several(self, row: Row, model: str, spec: str | None) -> Cell | None:
        """A glob column (``vllm@*``) matched by records of several engine releases: one cell that
        names each release's newest current record, the worst state leading; None otherwise (one
        release, or several configurations of one: the newest record speaks, as for any column)."""
        if spec is None or not any(ch in spec for ch in "*?["):
            return None
        live = [lr for lr in self.matching(row, model, spec) if lr.record.id not in self.sup]
        versions = list(dict.fromkeys(release_of(lr.record) for lr in live))
        if len(versions) < 2:
            return None
        parts: list[tuple[tuple[int, ...], str, State, Loaded]] = []
        for v in versions:
            mine = [lr for lr in live if release_of(lr.record) == v]
            lr = next((x for x in mine if not self.stale(x)), mine[0])
            state, text = judge_record(lr.record, row.prove)
            if self.stale(lr):
                state, text = "stale", "; ".join(self.stale(lr))
            version = release_of(lr.record)
            label = f"{version} {SYMBOL[state]}" + ("" if state == "pass" else f" ({clip(text, INLINE)})")
            parts.append((release_key(version), label, state, lr))
        parts.sort(key=lambda p: p[0])
        worst = max((p[2] for p in parts), key=WORST.index)
        newest = newest_first(p[3] for p in parts)[0]
        rec = newest.record
        return Cell(worst, f"{len(parts)} releases: " + ", ".join(p[1] for p in parts), newest.path,
                    rec.harness.get("sha"), rec.candidate.sha, self.warnings(row, model, spec),
                    device_class(rec), releases=tuple(p[1] for p in parts),
                    count=f"{sum(p[2] == 'pass' for p in parts)}/{len(parts)}")

    def oracle_cell(self, row: Row, model: str) -> Cell:
        if ORACLE in row.na:
            return Cell("na", row.na[ORACLE])
        live = [lr for lr in self.matching(row, model, None) if lr.record.id not in self.sup
                and lr.record.oracle.get("pin")]
        good = [lr for lr in live if not oracle_reasons(lr.record, self.current)]
        lr = good[0] if good else (live[0] if live else None)
        if lr is None:
            return Cell("todo", "no goldens judged by a record yet", warnings=self.warnings(row, model, None))
        rec = lr.record
        made = str(rec.oracle.get("golden_created") or "")[:10]
        oracle_device = (rec.oracle.get("device") or {}).get("class")
        if not good:
            why = "; ".join(oracle_reasons(rec, self.current))
            return Cell("stale", why, lr.path, rec.harness.get("sha"))
        return Cell("pass", f"goldens {rec.oracle.get('pin')}" + (f", recorded {made}" if made else ""),
                    lr.path, rec.harness.get("sha"), device=str(oracle_device) if oracle_device else None)

    def table(self) -> Table:
        cells: dict[tuple[str, str, str], Cell] = {}
        for row in self.catalog.rows:
            for model in row.models:
                for col in self.catalog.columns:
                    cells[(row.id, model, col.key)] = self.cell(row, model, col)
                cells[(row.id, model, ORACLE)] = self.oracle_cell(row, model)
        cited = tuple(sorted({c.record for c in cells.values() if c.record}
                             | {path for c in cells.values() for path, _ in c.newer}))
        return Table(self.catalog, self.current.pin, cells, tuple(self.records), tuple(self.broken),
                     cited)
