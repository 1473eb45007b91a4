"""The feature catalog (``features.toml``): rows are features, columns are candidates.

A row names the suite and the comparators that prove it, and the models it is shown for side by
side; a column names a candidate spec (a glob such as ``vllm@*`` matches every release). A row may
give a column another spec (a configuration of that engine) or say why the column does not apply.
Every error names the file and the field.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.registry import unknown
from harness.workspace import Workspace

CATALOG = "features.toml"
ORACLE_KEY = "oracle"
"""``na = { oracle = "why" }``: the oracle column does not apply to a row (a kind without goldens)."""


class CatalogError(ValueError):
    """A malformed features.toml; the message names the file and the field."""


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
    models: tuple[str, ...]
    """The models the feature is shown for, side by side (one line each)."""
    suite: str
    prove: tuple[str, ...]
    """Comparators whose verdicts prove the row (all must pass on every case for ✅). An invariance
    suite's verdicts are named per variant and tier: ``inv_batch.bit_exact``, ``inv_batch.near_tie``."""
    candidates: Mapping[str, str] = field(default_factory=dict)
    """Column key -> the candidate spec for this row when it is not the column's (a configuration)."""
    na: Mapping[str, str] = field(default_factory=dict)
    """Column key (or ``oracle``) -> why the row does not apply to that engine."""
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
    models: tuple[str, ...] = ()
    """The catalog's default models: every row without its own ``model``/``models`` shows these."""

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
    kv = raw.get("kv")
    if isinstance(kv, dict) and isinstance(kv.get("load"), dict):  # the KV load lane names its own
        from harness.kv.settings import LOAD_VERDICTS

        return list(LOAD_VERDICTS)
    if raw.get("kind") == "invariance":  # its verdicts are named per variant and tier
        from harness.invariance.settings import verdict_names

        return verdict_names(raw)
    if raw.get("kind") == "sampling":  # its verdicts are named per parameter
        from harness.sampling.settings import verdict_names as sampling_verdicts

        return sampling_verdicts(raw)
    return list(comp) if isinstance(comp, dict) else []


def load_catalog(path: Path, ws: Workspace | None = None) -> Catalog:
    """Parse and validate features.toml. Every error names the file and the field."""
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise CatalogError(f"{path}: no feature catalog (write one, see docs/records.md)") from None
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
    default_models = raw.get("models", [])
    if not isinstance(default_models, list) or not all(isinstance(m, str) and m for m in default_models):
        raise CatalogError(f"{path}: field 'models' must be a list of model names")
    default_models = tuple(default_models)
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
            na = _table(r, "na", rw, [*keys, ORACLE_KEY])
            cands = _table(r, "candidates", rw, keys)
            note = r.get("note", "")
            if not isinstance(note, str):
                raise CatalogError(f"{rw}: field 'note' must be a string")
            models = _models(r, rw, default_models)
            rows.append(Row(rid, _str(r, "title", rw), title, models, suite, tuple(prove), cands, na, note))
    title = raw.get("title", "Features")
    intro = raw.get("intro", "")
    if not isinstance(title, str) or not isinstance(intro, str):
        raise CatalogError(f"{path}: fields 'title' and 'intro' must be strings")
    return Catalog(path, title, intro.strip(), tuple(columns), tuple(rows), default_models)


def _models(d: Mapping[str, Any], where: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """A row's ``model = "x"`` or ``models = ["x", "y"]``; neither: the catalog's ``models``."""
    if "model" in d and "models" in d:
        raise CatalogError(f"{where}: give 'model' or 'models', not both")
    if "model" in d:
        return (_str(d, "model", where),)
    v = d.get("models", list(default))
    if not isinstance(v, list) or not v or not all(isinstance(m, str) and m for m in v):
        raise CatalogError(f"{where}: field 'models' must be a non-empty list of model names "
                           "(or set the catalog's top-level 'models')")
    if len(set(v)) != len(v):
        raise CatalogError(f"{where}: field 'models' names a model twice")
    return tuple(v)
