"""The feature catalog (``features.toml``): rows are features, columns are candidates.

A row names the suite and the comparators that prove it, and the models it is shown for side by
side; a column names a candidate spec (a glob such as ``vllm@*`` matches every release). A row may
give a column another spec (a configuration of that engine) or say why the column does not apply; a
section may say it once for all its rows (``na`` on the section, a row's own entry wins). A column
may name the models it cannot be run for where the harness runs (``cannot_run``): a cell of such a
model with no record says why instead of ☐.
Every error names the file and the key (:mod:`harness.tomlcheck`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.registry import unknown
from harness.tomlcheck import (
    InvalidTOML,
    Where,
    check_keys,
    load_toml,
    need_list,
    need_str,
    need_table,
    need_tables,
)
from harness.workspace import Workspace

CATALOG = "features.toml"
ORACLE_KEY = "oracle"
"""``na = { oracle = "why" }``: the oracle column does not apply to a row (a kind without goldens)."""


class CatalogError(InvalidTOML):
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
    cannot_run: Mapping[str, str] = field(default_factory=dict)
    """Model -> why no run of this column can be made where the harness runs (a GPU column and a
    checkpoint that cannot travel to the GPU machine). Only a cell with no record says so: a record,
    wherever it was made, speaks for itself."""


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


def _string_table(d: Mapping[str, Any], key: str, where: Where) -> dict[str, str]:
    """A table of strings (``cannot_run = { model = "why" }``)."""
    v = need_table(d, key, where, {})
    for k in v:
        need_str(v, k, where / key)
    return dict(v)


def _columns_table(d: Mapping[str, Any], key: str, where: Where, columns: Iterable[str]) -> dict[str, str]:
    """A row's or section's ``na``, a row's ``candidates``: column key = string."""
    v = _string_table(d, key, where)
    cols = list(columns)
    for k in v:
        if k not in cols:
            raise (where / key / k).fail(str(unknown("column", k, cols)))
    return v


def _suite_comparators(ws: Workspace, suite: str) -> list[str] | None:
    p = ws.suites / f"{suite}.toml"
    try:
        raw = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    comp = raw.get("compare")
    kv = raw.get("kv")
    if isinstance(kv, dict) and isinstance(kv.get("load"), dict):  # the KV load lane names its own
        from harness.kinds.kv.settings import LOAD_VERDICTS

        return list(LOAD_VERDICTS)
    if isinstance(kv, dict) and isinstance(kv.get("faults"), dict):  # the fault lane: one per fault
        from harness.kinds.kv.faults.inject import BY_NAME
        from harness.kinds.kv.faults.verdict import comparator

        return [comparator(f) for f in kv["faults"].get("faults", list(BY_NAME))]
    if raw.get("kind") == "invariance":  # its verdicts are named per variant and tier
        from harness.kinds.invariance.settings import verdict_names

        return verdict_names(raw)
    if raw.get("kind") == "sampling":  # its verdicts are named per parameter
        from harness.kinds.sampling.settings import verdict_names as sampling_verdicts

        return sampling_verdicts(raw)
    if raw.get("kind") == "rl":  # its judges, and one verdict per barred figure
        from harness.kinds.rl.settings import verdict_names as rl_verdicts

        return rl_verdicts(raw)
    if raw.get("kind") == "spec":  # greedy, sampled, and a planted control's catch
        from harness.kinds.spec.settings import VERDICTS as spec_verdicts

        return list(spec_verdicts)
    if raw.get("kind") == "api":  # one comparator per facet of its [api] table
        api = raw.get("api")
        facets = api.get("facets") if isinstance(api, dict) else None
        return [f"api.{f}" for f in facets] if isinstance(facets, list) else []
    return list(comp) if isinstance(comp, dict) else []


TOP_KEYS = ("title", "intro", "models", "columns", "sections")
COLUMN_KEYS = ("key", "title", "candidate", "repo", "cannot_run")
SECTION_KEYS = ("title", "rows", "note", "na")
ROW_KEYS = ("id", "title", "suite", "prove", "na", "candidates", "note", "model", "models")


def load_catalog(path: Path, ws: Workspace | None = None) -> Catalog:
    """Parse and validate features.toml. Every error names the file and the key."""
    raw = load_toml(path, CatalogError, "no feature catalog (write one, see docs/records.md)")
    top = Where(path, error=CatalogError)
    check_keys(raw, top, TOP_KEYS)
    ws = ws or Workspace(path.parent)
    columns: list[Column] = []
    cannot_run: dict[str, tuple[Where, dict[str, str]]] = {}
    for where, c in need_tables(raw, "columns", top):
        check_keys(c, where, COLUMN_KEYS)
        key = need_str(c, "key", where)
        if any(x.key == key for x in columns):
            raise (where / "key").fail(f"duplicate column key {key!r}")
        repo = need_str(c, "repo", where, None)
        cannot_run[key] = (where, _string_table(c, "cannot_run", where))
        columns.append(Column(key, need_str(c, "title", where, key), need_str(c, "candidate", where),
                              (ws.root / repo).resolve() if repo else None))
    keys = [c.key for c in columns]
    default_models = tuple(need_list(raw, "models", top, [], nonempty=False, what="model names"))
    rows: list[Row] = []
    for where, s in need_tables(raw, "sections", top):
        check_keys(s, where, SECTION_KEYS)
        title = need_str(s, "title", where)
        need_str(s, "note", where, "", nonempty=False)
        section_na = _columns_table(s, "na", where, [*keys, ORACLE_KEY])
        for rw, r in need_tables(s, "rows", where):
            check_keys(r, rw, ROW_KEYS)
            rid = need_str(r, "id", rw)
            if any(x.id == rid for x in rows):
                raise (rw / "id").fail(f"duplicate row id {rid!r}")
            prove = need_list(r, "prove", rw, what="comparator names")
            suite = need_str(r, "suite", rw)
            have = _suite_comparators(ws, suite)
            if have is not None:
                for p in prove:
                    if p not in have:
                        raise (rw / "prove").fail(f"row {rid!r}: suite {suite!r} has no comparator {p!r} "
                                                  f"(its [compare] names {', '.join(have) or 'none'})")
            na = {**section_na, **_columns_table(r, "na", rw, [*keys, ORACLE_KEY])}
            cands = _columns_table(r, "candidates", rw, keys)
            note = need_str(r, "note", rw, "", nonempty=False)
            models = _models(r, rw, default_models)
            rows.append(Row(rid, need_str(r, "title", rw), title, models, suite, tuple(prove), cands, na,
                            note))
    shown = list(dict.fromkeys(m for r in rows for m in r.models))
    for col in columns:
        where, table = cannot_run[col.key]
        for model in table:
            if model not in shown:
                raise (where / "cannot_run" / model).fail(str(unknown("model", model, shown)))
    columns = [Column(c.key, c.title, c.candidate, c.repo, cannot_run[c.key][1]) for c in columns]
    title = need_str(raw, "title", top, "Features")
    intro = need_str(raw, "intro", top, "", nonempty=False)
    return Catalog(path, title, intro.strip(), tuple(columns), tuple(rows), default_models)


def _models(d: Mapping[str, Any], where: Where, default: tuple[str, ...]) -> tuple[str, ...]:
    """A row's ``model = "x"`` or ``models = ["x", "y"]``; neither: the catalog's ``models``."""
    if "model" in d and "models" in d:
        raise (where / "models").fail("give 'model' or 'models', not both")
    if "model" in d:
        return (need_str(d, "model", where),)
    if "models" not in d and not default:
        raise (where / "models").fail("missing (expected a non-empty list of model names, or set the "
                                      "catalog's top-level 'models')")
    return tuple(need_list(d, "models", where, list(default), unique=True, what="model names"))
