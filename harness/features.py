"""Records -> FEATURES.md and SUPPORTED_MODELS.md: tables that are generated, never hand-kept.

Inputs are the catalog (``features.toml``: rows, columns, which suite and comparators prove each
row) and the records under ``reports/records/``; nothing else is read except what staleness needs
(the oracle pin, suites, committed goldens, models, git; see :mod:`harness.staleness`).

A cell is the verdict of the newest record for its (model, suite, candidate) that no other record
supersedes. Records are never rewritten: a correction is a newer record, or one that names older
ids in ``extra["supersedes"]``. Every cell cites its record and the SHA it ran on, and the generator
refuses to write a table that cites a record that does not exist. A malformed or truncated record
is reported by path in a warning cell and the warnings section; it never stops the generator.

Legend (see :data:`SYMBOL`): ✅ gated pass · ◐ partial, with the named gap · ☐ not yet · n/a ·
⛔ refused, with the engine's reason · ⌛ stale, with why (never ✅) · VACUOUS: a planted mutation
passed, so the gate could not have failed · ❌ gated fail or engine error · ⚠ unreadable record.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
import tomllib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.controls import failed_positive, vacuous_reasons
from harness.records import Record, RecordError, iter_record_paths, load_record
from harness.registry import unknown
from harness.staleness import Current, oracle_reasons, staleness
from harness.workspace import Workspace

CATALOG = "features.toml"
FEATURES_MD = "FEATURES.md"
SUPPORTED_MD = "SUPPORTED_MODELS.md"
REGENERATE = "make features"

State = Literal["pass", "partial", "todo", "na", "refused", "stale", "vacuous", "fail"]
SYMBOL: dict[str, str] = {"pass": "✅", "partial": "◐", "todo": "☐", "na": "n/a", "refused": "⛔",
                          "stale": "⌛", "vacuous": "VACUOUS", "fail": "❌"}
WARN = "⚠"
OUTCOMES = ("pass", "fail", "error", "refused", "skip", "vacuous")
STATUSES = ("pass", "fail", "error", "refused", "skip")


class CatalogError(ValueError):
    """A malformed features.toml; the message names the file and the field."""


class CitationError(RuntimeError):
    """A generated table cites a record that does not exist (a generator bug: nothing is written)."""


# ---------------------------------------------------------------------------------------------
# the catalog


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    title: str
    candidate: str
    """The candidate spec whose records fill this column (``Record.candidate.name``); a glob such as
    ``vllm-server*`` matches every option string of one engine."""
    repo: Path | None = None
    """The candidate's own git repository, for candidates that record their SHA."""


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    title: str
    section: str
    model: str
    suite: str
    prove: tuple[str, ...]
    """Comparators whose verdicts prove the row (all must pass on every case for ✅)."""
    candidates: Mapping[str, str] = field(default_factory=dict)
    """Column key -> the candidate spec for this row when it is not the column's (a configuration)."""
    na: Mapping[str, str] = field(default_factory=dict)
    """Column key -> why the row does not apply to that engine."""
    note: str = ""

    def spec(self, col: Column) -> str:
        return self.candidates.get(col.key, col.candidate)


@dataclass(frozen=True, slots=True)
class Catalog:
    path: Path
    title: str
    intro: str
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]

    def row(self, row_id: str) -> Row:
        for r in self.rows:
            if r.id == row_id:
                return r
        raise unknown("feature", row_id, [r.id for r in self.rows])

    @property
    def sections(self) -> list[str]:
        return list(dict.fromkeys(r.section for r in self.rows))


def _str(d: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    if key not in d:
        if default is not None:
            return default
        raise CatalogError(f"{where}: missing field {key!r}")
    v = d[key]
    if not isinstance(v, str) or not v.strip():
        raise CatalogError(f"{where}: field {key!r} must be a non-empty string, got {v!r}")
    return v


def _table(d: Mapping[str, Any], key: str, where: str, columns: Iterable[str]) -> dict[str, str]:
    v = d.get(key, {})
    if not isinstance(v, dict):
        raise CatalogError(f"{where}: field {key!r} must be a table of column = string")
    cols = list(columns)
    for k, x in v.items():
        if k not in cols:
            raise CatalogError(f"{where}.{key}: {unknown('column', k, cols)}")
        if not isinstance(x, str):
            raise CatalogError(f"{where}.{key}.{k}: must be a string, got {x!r}")
    return dict(v)


def _suite_comparators(ws: Workspace, suite: str) -> list[str] | None:
    p = ws.suites / f"{suite}.toml"
    try:
        raw = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    comp = raw.get("compare")
    return list(comp) if isinstance(comp, dict) else []


def load_catalog(path: Path, ws: Workspace | None = None) -> Catalog:
    """Parse and validate features.toml. Every error names the file and the field."""
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise CatalogError(f"{path}: no feature catalog (write one, see README 'FEATURES.md')") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise CatalogError(f"{path}: not valid TOML: {e}") from None
    ws = ws or Workspace(path.parent)
    columns: list[Column] = []
    cols_raw = raw.get("columns")
    if not isinstance(cols_raw, list) or not cols_raw:
        raise CatalogError(f"{path}: [[columns]] must name at least one candidate")
    for i, c in enumerate(cols_raw):
        where = f"{path} columns[{i}]"
        if not isinstance(c, dict):
            raise CatalogError(f"{where}: must be a table")
        key = _str(c, "key", where)
        if any(x.key == key for x in columns):
            raise CatalogError(f"{where}: duplicate column key {key!r}")
        repo = c.get("repo")
        if repo is not None and not isinstance(repo, str):
            raise CatalogError(f"{where}: field 'repo' must be a path string")
        columns.append(Column(key, _str(c, "title", where, key), _str(c, "candidate", where),
                              (ws.root / repo).resolve() if repo else None))
    keys = [c.key for c in columns]
    rows: list[Row] = []
    secs = raw.get("sections")
    if not isinstance(secs, list) or not secs:
        raise CatalogError(f"{path}: [[sections]] must hold at least one section")
    for i, s in enumerate(secs):
        where = f"{path} sections[{i}]"
        if not isinstance(s, dict):
            raise CatalogError(f"{where}: must be a table")
        title = _str(s, "title", where)
        srows = s.get("rows")
        if not isinstance(srows, list) or not srows:
            raise CatalogError(f"{where} ({title}): [[sections.rows]] must hold at least one row")
        for j, r in enumerate(srows):
            rw = f"{where}.rows[{j}]"
            if not isinstance(r, dict):
                raise CatalogError(f"{rw}: must be a table")
            rid = _str(r, "id", rw)
            rw = f"{rw} ({rid})"
            if any(x.id == rid for x in rows):
                raise CatalogError(f"{rw}: duplicate row id {rid!r}")
            prove = r.get("prove")
            if (not isinstance(prove, list) or not prove
                    or not all(isinstance(p, str) and p for p in prove)):
                raise CatalogError(f"{rw}: field 'prove' must be a non-empty list of comparator names")
            suite = _str(r, "suite", rw)
            have = _suite_comparators(ws, suite)
            if have is not None:
                for p in prove:
                    if p not in have:
                        raise CatalogError(f"{rw}: suite {suite!r} has no comparator {p!r} "
                                           f"(its [compare] names {', '.join(have) or 'none'})")
            na = _table(r, "na", rw, keys)
            cands = _table(r, "candidates", rw, keys)
            note = r.get("note", "")
            if not isinstance(note, str):
                raise CatalogError(f"{rw}: field 'note' must be a string")
            rows.append(Row(rid, _str(r, "title", rw), title, _str(r, "model", rw), suite,
                            tuple(prove), cands, na, note))
    title = raw.get("title", "Features")
    intro = raw.get("intro", "")
    if not isinstance(title, str) or not isinstance(intro, str):
        raise CatalogError(f"{path}: fields 'title' and 'intro' must be strings")
    return Catalog(path, title, intro.strip(), tuple(columns), tuple(rows))


# ---------------------------------------------------------------------------------------------
# records


@dataclass(frozen=True, slots=True)
class Loaded:
    path: str
    """Relative to the workspace root, with forward slashes: what a cell links to."""
    record: Record


@dataclass(frozen=True, slots=True)
class Broken:
    path: str
    error: str
    model: str
    """The model/suite folders it sits in, and the candidate slug of its file name (may be '')."""
    suite: str
    slug: str


def candidate_slug(spec: str) -> str:
    """The candidate part of a record's file name (as :func:`harness.records.new_record_id` makes it)."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", spec).strip("-")[:40] or "candidate"


def spec_matches(name: str, spec: str) -> bool:
    """A record's candidate ``name`` against a catalog spec: exact, or a glob (``vllm-server*``)."""
    return fnmatch.fnmatchcase(name, spec) if any(ch in spec for ch in "*?[") else name == spec


def slug_matches(slug: str, spec: str) -> bool:
    """A record file name's candidate slug against a catalog spec (for unreadable records)."""
    if not any(ch in spec for ch in "*?["):
        return slug == candidate_slug(spec)
    return fnmatch.fnmatchcase(slug, re.sub(r"[^A-Za-z0-9.*?]+", "-", spec).strip("-"))


def _check(rec: Record) -> None:
    """Reject records that parse but cannot be judged (wrong types, unknown outcome or status)."""
    if rec.outcome not in OUTCOMES:
        raise TypeError(f"outcome {rec.outcome!r} is not one of {', '.join(OUTCOMES)}")
    for name, v in (("created", rec.created), ("model.name", rec.model.get("name")),
                    ("suite.name", rec.suite.get("name")), ("candidate.name", rec.candidate.name)):
        if not isinstance(v, str) or not v:
            raise TypeError(f"field {name} must be a non-empty string, got {v!r}")
    for v in rec.verdicts:
        if v.status not in STATUSES:
            raise TypeError(f"verdict {v.case_id}/{v.comparator}: status {v.status!r}")
    if not isinstance(rec.oracle, Mapping) or not isinstance(rec.harness, Mapping):
        raise TypeError("fields oracle and harness must be tables")


def tracked_records(ws: Workspace) -> list[Path] | None:
    """The record files git tracks (the index), or None outside git."""
    try:
        r = subprocess.run(["git", "-C", str(ws.root), "ls-files", "-z", "--", "reports/records"],
                           capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return sorted(ws.root / p for p in r.stdout.decode().split("\0") if p.endswith(".json"))


def load_records(ws: Workspace, paths: Iterable[Path] | None = None
                 ) -> tuple[list[Loaded], list[Broken]]:
    """Every record under reports/records/ (or ``paths``): the readable ones and the broken ones."""
    ok: list[Loaded] = []
    bad: list[Broken] = []
    for p in sorted(paths) if paths is not None else iter_record_paths(ws.records):
        rel = p.relative_to(ws.root).as_posix() if p.is_relative_to(ws.root) else p.as_posix()
        try:
            rec = load_record(p)
            _check(rec)
        except (RecordError, TypeError, AttributeError, ValueError, OSError) as e:
            msg = str(e).replace(str(p), "").strip(": ") or type(e).__name__
            parts = p.stem.split("_")
            bad.append(Broken(rel, msg[:200], p.parent.parent.name, p.parent.name,
                              "_".join(parts[2:-1]) if len(parts) >= 4 else ""))
            continue
        ok.append(Loaded(rel, rec))
    return ok, bad


def superseded(records: Sequence[Loaded]) -> dict[str, str]:
    """Record id -> the id of the record that names it in ``extra["supersedes"]``."""
    out = {}
    for lr in records:
        sup = lr.record.extra.get("supersedes", ())
        for rid in [sup] if isinstance(sup, str) else (sup if isinstance(sup, list) else ()):
            out[str(rid)] = lr.record.id
    return out


def newest_first(records: Iterable[Loaded]) -> list[Loaded]:
    return sorted(records, key=lambda lr: (lr.record.created, lr.record.id), reverse=True)


# ---------------------------------------------------------------------------------------------
# cells


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
    vac = vacuous_reasons(rec.controls, prove)
    if vac:
        return "vacuous", vac[0]
    gaps, passed_all, failed_all, skipped_all = [], True, True, True
    for c in prove:
        vs = [v for v in rec.verdicts if v.comparator == c]
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
        return "todo", f"not judged: {first.summary}"
    if passed_all:
        counts = ", ".join(f"{c} {sum(v.comparator == c for v in rec.verdicts)}/"
                           f"{sum(v.comparator == c for v in rec.verdicts)}" for c in prove)
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
    cells: Mapping[tuple[str, str], Cell]
    """(row id, column key or ORACLE) -> cell."""
    records: tuple[Loaded, ...]
    broken: tuple[Broken, ...]
    cited: tuple[str, ...]


ORACLE = "oracle"


class Judge:
    """Turns records into cells against the tree as it is now."""

    def __init__(self, ws: Workspace, catalog: Catalog, records: Sequence[Loaded],
                 broken: Sequence[Broken] = ()) -> None:
        self.ws, self.catalog = ws, catalog
        self.records, self.broken = list(records), list(broken)
        repos = {c.candidate: c.repo for c in catalog.columns if c.repo is not None}
        for r in catalog.rows:
            for k, spec in r.candidates.items():
                col = next(c for c in catalog.columns if c.key == k)
                if col.repo is not None:
                    repos[spec] = col.repo
        self.current = Current.of(ws, repos)
        self.sup = superseded(self.records)
        self._stale: dict[str, list[str]] = {}

    def stale(self, lr: Loaded) -> list[str]:
        if lr.path not in self._stale:
            self._stale[lr.path] = staleness(lr.record, self.current)
        return self._stale[lr.path]

    def matching(self, row: Row, spec: str | None) -> list[Loaded]:
        """Records of the row's model+suite (and candidate ``spec``), newest first."""
        return newest_first(lr for lr in self.records
                            if lr.record.model.get("name") == row.model
                            and lr.record.suite.get("name") == row.suite
                            and (spec is None or spec_matches(lr.record.candidate.name, spec)))

    def current_record(self, row: Row, spec: str | None) -> Loaded | None:
        return next((lr for lr in self.matching(row, spec) if lr.record.id not in self.sup), None)

    def warnings(self, row: Row, spec: str | None) -> tuple[str, ...]:
        model_dir = row.model.strip("/").replace("/", "--")
        specs = [row.spec(c) for c in self.catalog.columns]
        out = []
        for b in self.broken:
            if b.model != model_dir or b.suite != row.suite:
                continue
            if (spec is None or slug_matches(b.slug, spec)
                    or not any(slug_matches(b.slug, s) for s in specs)):
                out.append(f"{WARN} unreadable record {b.path}")
        return tuple(out)

    def cell(self, row: Row, col: Column) -> Cell:
        spec = row.spec(col)
        warn = self.warnings(row, spec)
        if col.key in row.na:
            return Cell("na", row.na[col.key], warnings=warn)
        lr = self.current_record(row, spec)
        if lr is None:
            # the same words whether or not the suite file exists yet: the page must not depend on
            # uncommitted files
            return Cell("todo", f"no record for {spec}", warnings=warn)
        rec = lr.record
        state, text = judge_record(rec, row.prove)
        why = self.stale(lr)
        if why:
            text = f"{'; '.join(why)} (was {SYMBOL[state]} {text})"
            state = "stale"
        return Cell(state, text, lr.path, rec.harness.get("sha"), rec.candidate.sha, warn)

    def oracle_cell(self, row: Row) -> Cell:
        lr = self.current_record(row, None)
        if lr is None:
            return Cell("todo", "no goldens judged by a record yet", warnings=self.warnings(row, None))
        rec = lr.record
        why = oracle_reasons(rec, self.current)
        made = str(rec.oracle.get("golden_created") or "")[:10]
        if why:
            return Cell("stale", "; ".join(why), lr.path, rec.harness.get("sha"))
        return Cell("pass", f"goldens {rec.oracle.get('pin')}" + (f", recorded {made}" if made else ""),
                    lr.path, rec.harness.get("sha"))

    def table(self) -> Table:
        cells: dict[tuple[str, str], Cell] = {}
        for row in self.catalog.rows:
            for col in self.catalog.columns:
                cells[(row.id, col.key)] = self.cell(row, col)
            cells[(row.id, ORACLE)] = self.oracle_cell(row)
        cited = tuple(sorted({c.record for c in cells.values() if c.record}))
        return Table(self.catalog, self.current.pin, cells, tuple(self.records), tuple(self.broken),
                     cited)


# ---------------------------------------------------------------------------------------------
# markdown


def md(text: str) -> str:
    """One table cell's worth of text: no newlines, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def cite(path: str | None, sha: Any = None, candidate_sha: Any = None) -> str:
    if not path:
        return ""
    at = f" @ `{str(sha)[:10]}`" if sha else " @ no SHA"
    if candidate_sha:
        at += f", candidate `{str(candidate_sha)[:10]}`"
    return f"[record]({path}){at}"


def render_cell(c: Cell) -> str:
    parts = [f"{c.symbol} {md(c.text)}".strip()]
    if c.record:
        parts.append(cite(c.record, c.sha, c.candidate_sha))
    parts += [md(w) for w in c.warnings]
    return "<br>".join(parts)


HEADER = ("<!-- Generated by `{cmd}` from {catalog} and reports/records/. Do not edit by hand: "
          "tests/unit/test_features_committed.py fails when this file differs from the generator. -->")

LEGEND = ("**Legend.** ✅ gated pass · ◐ partial, with the named gap · ☐ not yet · n/a does not apply · "
          "⛔ refused, with the engine's reason · ⌛ stale, with why (a stale result is never ✅) · "
          "VACUOUS a planted mutation passed, so the gate could not have failed · ❌ gated fail or "
          "engine error · ⚠ unreadable record (reported, skipped)")

RULES = ("**Staleness, computed on every generation.** A cell is ⌛ when its record's candidate SHA is "
         "not an ancestor of the candidate repository's HEAD, its harness SHA is not an ancestor of "
         "this repository's HEAD (or the tree was dirty), the oracle pin changed since its goldens were "
         "recorded, the suite version or golden checksums changed, or the model digest changed. Each "
         "cell shows the newest record for its model, suite and candidate that no later record "
         "supersedes; records are never rewritten.")


def _n(k: int, word: str) -> str:
    return f"{k} {word}" + ("" if k == 1 else "s")


def render_features(t: Table) -> str:
    cat = t.catalog
    out = [HEADER.format(cmd=REGENERATE, catalog=cat.path.name), "", f"# {cat.title}", ""]
    if cat.intro:
        out += [cat.intro, ""]
    out += [LEGEND, "", f"**Oracle pin:** `{t.pin or 'missing'}` (requirements/oracle.txt).", "",
            RULES, ""]
    head = ["Feature", *(c.title for c in cat.columns), f"Oracle ({t.pin or 'no pin'})"]
    for sec in cat.sections:
        out += [f"## {sec}", "", "| " + " | ".join(md(h) for h in head) + " |",
                "|" + "---|" * len(head)]
        for row in (r for r in cat.rows if r.section == sec):
            what = f"{md(row.title)}<br><sub>`{row.id}` · {md(row.model)} / {md(row.suite)} · " \
                   f"{', '.join(row.prove)}</sub>"
            cells = [render_cell(t.cells[(row.id, c.key)]) for c in cat.columns]
            cells.append(render_cell(t.cells[(row.id, ORACLE)]))
            out.append("| " + " | ".join([what, *cells]) + " |")
        notes = [r for r in cat.rows if r.section == sec and r.note]
        if notes:
            out.append("")
            out += [f"- `{r.id}`: {' '.join(r.note.split())}" for r in notes]
        out.append("")
    if t.broken:
        out += ["## Unreadable records", ""]
        out += [f"- {WARN} `{b.path}`: {md(b.error)}" for b in t.broken]
        out.append("")
    counts = Counter(c.state for c in t.cells.values())
    tally = ", ".join(f"{counts[s]} {SYMBOL[s]}" for s in SYMBOL if counts[s])
    out += ["---", "", f"Generated from {_n(len(t.records), 'record')} ({len(t.broken)} unreadable); "
            f"{len(t.cited)} cited. {len(t.cells)} cells: {tally}. Regenerate with `{REGENERATE}`; "
            "see one row's records over time with `harness history FEATURE`.", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# supported models


@dataclass(frozen=True, slots=True)
class ModelRun:
    lr: Loaded
    state: State
    text: str
    stale: tuple[str, ...]


def _settings_text(s: Mapping[str, Any], skip: Iterable[str] = ()) -> str:
    items = [f"{k}={v}" for k, v in sorted(s.items()) if k not in set(skip)]
    return ", ".join(items) if items else "—"


def _differs(cand: Mapping[str, Any], oracle: Mapping[str, Any]) -> str:
    """The candidate's settings that are not the oracle's (what that configuration needs)."""
    d = {k: v for k, v in cand.items() if k not in oracle or oracle[k] != v}
    return _settings_text(d) if d else "as the oracle"


def render_supported(ws: Workspace, t: Table, judge: Judge) -> tuple[str, list[str]]:
    runs: list[ModelRun] = []
    for lr in newest_first(t.records):
        if lr.record.id in judge.sup:
            continue
        rec = lr.record
        state, text = judge_record(rec, rec.gates or tuple(dict.fromkeys(v.comparator
                                                                        for v in rec.verdicts)))
        runs.append(ModelRun(lr, state, text, tuple(judge.stale(lr))))
    cited: list[str] = []
    out = [HEADER.format(cmd=REGENERATE, catalog="reports/records/ only").replace(
        " and reports/records/", ""), "", "# Supported models", "",
           "Every model below passed a gate against the pinned vLLM oracle, judged by the harness on "
           "a commit in this repository's history, with the planted-mutation controls biting. A "
           "result that is stale, vacuous or failing is not listed as verified; it is listed below "
           "with the reason. Generated from records only.", "",
           f"**Oracle pin:** `{t.pin or 'missing'}`.", "", "## Verified models", "",
           "| Model | Architecture | Attention | vLLM | Candidates | Suites | Records |",
           "|---|---|---|---|---|---|---|"]
    models = list(dict.fromkeys(str(r.lr.record.model.get("name")) for r in runs))
    verified = {m: [r for r in runs if r.lr.record.model.get("name") == m and r.state == "pass"
                    and not r.stale] for m in models}
    for m in models:
        vs = verified[m]
        if not vs:
            continue
        recs = [r.lr.record for r in vs]
        versions = sorted({str(x.oracle.get("version")) for x in recs}
                          | {x.candidate.version for x in recs if x.candidate.engine == "vllm"})
        cands = sorted({f"{x.candidate.name} ({x.candidate.engine} {x.candidate.version})" for x in recs})
        suites = sorted({f"{x.suite.get('name')} v{x.suite.get('version')}" for x in recs})
        links = ", ".join(f"[{i + 1}]({r.lr.path})" for i, r in enumerate(vs))
        cited += [r.lr.path for r in vs]
        facts = recs[0].model
        attention = "; ".join(filter(None, (facts.get("attention", "—"), facts.get("experts"))))
        out.append(f"| {md(m)} | {md(recs[0].model.get('architecture', '—'))} | "
                   f"{md(attention)} | {', '.join(versions)} | "
                   f"{md('; '.join(cands))} | {', '.join(suites)} | {links} |")
    if not any(verified.values()):
        out.append("| — | | | | | | |")
    out += ["", "The vLLM column is the oracle release each model was verified against (and any vLLM "
            "release that ran as a candidate).", "", "## Settings per model", "",
            "| Model | vLLM | Block size | Chunk size | dtype | Oracle settings | Candidate | "
            "Candidate settings (beyond the oracle's) | Record |", "|---|---|---|---|---|---|---|---|---|"]
    rows = 0
    for m in models:
        seen = set()
        for r in verified[m]:
            x = r.lr.record
            o = dict(x.oracle.get("settings") or {})
            key = (str(x.oracle.get("version")), repr(sorted(o.items())), x.candidate.name,
                   repr(sorted(x.candidate.settings.items())))
            if key in seen:
                continue
            seen.add(key)
            chunk = o.get("chunk_size", x.candidate.settings.get("chunk_size", "—"))
            out.append(f"| {md(m)} | {x.oracle.get('version')} | {o.get('block_size', '—')} | {chunk} | "
                       f"{o.get('dtype', '—')} | "
                       f"{md(_settings_text(o, ('block_size', 'dtype', 'chunk_size')))} | "
                       f"{md(x.candidate.name)} | {md(_differs(x.candidate.settings, o))} | "
                       f"[record]({r.lr.path}) |")
            rows += 1
    if not rows:
        out.append("| — | | | | | | | | |")
    out += ["", "## Not verified", "", "| Model | Candidate | State | Why | Record |",
            "|---|---|---|---|---|"]
    nv = [r for r in runs if r.state not in ("pass", "refused") or (r.stale and r.state != "refused")]
    for r in nv:
        x = r.lr.record
        state, why = (("stale", "; ".join(r.stale) + f" (was {SYMBOL[r.state]} {r.text})") if r.stale
                      else (r.state, r.text))
        cited.append(r.lr.path)
        out.append(f"| {md(x.model.get('name'))} | {md(x.candidate.name)} | {SYMBOL[state]} | {md(why)} | "
                   f"{cite(r.lr.path, x.harness.get('sha'), x.candidate.sha)} |")
    if not nv:
        out.append("| — | | | | |")
    out += ["", "## Refused configurations", "",
            "| Model | Candidate | Settings | Reason (the engine's words) | Record |",
            "|---|---|---|---|---|"]
    refused = [r for r in runs if r.state == "refused"]
    for r in refused:
        x = r.lr.record
        cited.append(r.lr.path)
        why = r.text + (f" (⌛ stale: {'; '.join(r.stale)})" if r.stale else "")
        out.append(f"| {md(x.model.get('name'))} | {md(x.candidate.name)} | "
                   f"{md(_settings_text(x.candidate.settings))} | {md(why)} | "
                   f"{cite(r.lr.path, x.harness.get('sha'), x.candidate.sha)} |")
    if not refused:
        out.append("| — | | | | |")
    out += ["", "---", "", f"Generated from {_n(len(t.records), 'record')} ({len(t.broken)} unreadable). "
            f"Regenerate with `{REGENERATE}`.", ""]
    return "\n".join(out), cited


# ---------------------------------------------------------------------------------------------
# the whole thing


LINK = re.compile(r"\]\(([^)\s]+)\)")


def check_citations(ws: Workspace, *pages: str) -> list[str]:
    """Every link target in ``pages`` that does not exist under the root (empty: none is dead)."""
    dead = []
    for page in pages:
        for target in LINK.findall(page):
            if "://" in target or target.startswith("#"):
                continue
            if not (ws.root / target).is_file():
                dead.append(target)
    return sorted(set(dead))


@dataclass(frozen=True, slots=True)
class Generated:
    features: str
    supported: str
    table: Table

    def figures(self) -> dict[str, int]:
        counts = Counter(c.state for c in self.table.cells.values())
        return {"records": len(self.table.records), "unreadable": len(self.table.broken),
                "cited": len(self.table.cited), "cells": len(self.table.cells),
                **{s: counts[s] for s in SYMBOL}}


def generate(ws: Workspace, catalog: Catalog | None = None, paths: Iterable[Path] | None = None
             ) -> Generated:
    """Both pages from the catalog and the records (all on disk, or only ``paths``)."""
    catalog = catalog or load_catalog(ws.root / CATALOG, ws)
    records, broken = load_records(ws, paths)
    judge = Judge(ws, catalog, records, broken)
    table = judge.table()
    features = render_features(table)
    supported, _ = render_supported(ws, table, judge)
    dead = check_citations(ws, features, supported)
    if dead:
        raise CitationError("the generated tables cite records that do not exist: " + ", ".join(dead))
    return Generated(features, supported, table)


def write_pages(ws: Workspace, g: Generated) -> list[Path]:
    """Write FEATURES.md and SUPPORTED_MODELS.md; returns the files whose content changed."""
    changed = []
    for name, text in ((FEATURES_MD, g.features), (SUPPORTED_MD, g.supported)):
        p = ws.root / name
        if not p.exists() or p.read_text() != text:
            tmp = p.with_name(f".{name}.tmp")
            tmp.write_text(text)
            tmp.replace(p)
            changed.append(p)
    return changed


# ---------------------------------------------------------------------------------------------
# history


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    lr: Loaded
    cell: Cell
    current: bool
    """Whether this is the record the table shows now (the newest not superseded)."""
    superseded_by: str | None


def history(ws: Workspace, catalog: Catalog, row_id: str, column: str | None = None,
            paths: Iterable[Path] | None = None) -> list[HistoryEntry]:
    """Every record behind one row (optionally one column), newest first, each judged as of now."""
    row = catalog.row(row_id)
    cols = list(catalog.columns)
    if column is not None:
        cols = [c for c in cols if c.key == column]
        if not cols:
            raise unknown("column", column, [c.key for c in catalog.columns])
    records, broken = load_records(ws, paths)
    judge = Judge(ws, catalog, records, broken)
    specs = {row.spec(c) for c in cols}
    out = []
    currents = {judge.current_record(row, s).record.id for s in specs  # type: ignore[union-attr]
                if judge.current_record(row, s) is not None}
    newer: dict[str, str] = {}
    for lr in judge.matching(row, None):
        rec = lr.record
        if column is not None and not any(spec_matches(rec.candidate.name, s) for s in specs):
            continue
        state, text = judge_record(rec, row.prove)
        why = judge.stale(lr)
        if why:
            text, state = f"{'; '.join(why)} (was {SYMBOL[state]} {text})", "stale"
        sup = judge.sup.get(rec.id) or newer.get(rec.candidate.name)
        out.append(HistoryEntry(lr, Cell(state, text, lr.path, rec.harness.get("sha"), rec.candidate.sha),
                                rec.id in currents, sup if rec.id not in currents else None))
        newer.setdefault(rec.candidate.name, rec.id)
    return out


def history_table(row: Row, entries: Sequence[HistoryEntry]) -> Any:
    from rich.table import Table as RichTable
    from rich.text import Text

    style = {"pass": "green", "partial": "yellow", "stale": "dim", "vacuous": "bold magenta",
             "fail": "bold red", "refused": "yellow", "todo": "dim", "na": "dim"}
    t = RichTable(title=f"{row.id}: {row.title} — {row.model} / {row.suite} · {', '.join(row.prove)}"
                        " (newest first)")
    for col in ("created", "candidate", "state", "why / gap", "harness", "candidate SHA", "record"):
        t.add_column(col, overflow="fold")
    for e in entries:
        rec = e.lr.record
        state = Text(f"{e.cell.symbol} {e.cell.state}", style=style.get(e.cell.state, ""))
        if e.current:
            state.append(" (shown)", style="bold")
        elif e.superseded_by:
            state.append(f" (superseded by {e.superseded_by[:24]})", style="dim")
        t.add_row(rec.created, rec.candidate.name, state, e.cell.text,
                  str(rec.harness.get("sha") or "—")[:10] + ("+dirty" if rec.harness.get("dirty") else ""),
                  str(rec.candidate.sha or "—")[:10], e.lr.path)
    return t
