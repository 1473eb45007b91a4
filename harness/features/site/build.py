"""Build the results site into a folder: the pages, the records' JSON and plots beside them, the
script and the style. Everything is written to a scratch folder first and moved into place at the
end, so a failed build leaves the previous site as it was."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from harness.features.catalog import CATALOG, Catalog, load_catalog
from harness.features.cells import ORACLE, SYMBOL, WORST, Judge
from harness.features.site.data import SiteCell, SiteData, collect, device_of
from harness.features.site.svg import chart, sparkline
from harness.features.sources import load_records
from harness.records import Record
from harness.workspace import Workspace

SITE_DIR = "reports/site"
"""Where ``make site`` writes (not ``site/``: that is the documentation's, which mkdocs empties)."""
HERE = Path(__file__).parent
VIEWS = {"Sampling": "sampling.html", "API surface": "api.html"}
"""Sections of the catalog that also get a page of their own."""
SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True, slots=True)
class Built:
    out: Path
    pages: int
    records: int
    cells: int
    plots: int
    seconds: float


def reproduce(rec: Record, path: str) -> str:
    """The command that makes a record like this one again (the Makefile's front door)."""
    m, s, c = rec.model.get("name"), rec.suite.get("name"), rec.candidate.name
    kind = rec.kind
    if kind == "localize":
        return f"make localize RECORD={path}"
    if kind == "bisect":
        b = rec.extra.get("bisect") or {}
        return (f"make bisect MODEL={m} SUITE={s} GOOD={b.get('reference')} BAD={b.get('end')}"
                if b.get("over") == "releases" else f"harness bisect --model {m} --suite {s}  # {c}")
    if kind == "repin":
        return f"make repin VLLM={c.split('@')[-1]} MODEL={m} SUITE={s}"
    if kind == "ab":
        ab = rec.extra.get("ab") or {}
        return f"make ab MODEL={m} SUITE={s} A='{ab.get('a', 'vllm')}' B='{ab.get('b', c)}'"
    if kind == "invariance":
        return f"make invariance MODEL={m} SUITE={s} ENGINE='{c}'"
    if kind == "sampling":
        return f"make sampling MODEL={m} SUITE={s} CANDIDATE='{c}'"
    if kind in ("kv_roundtrip", "kv"):
        conn = rec.candidate.settings.get("connector")
        conn = "" if not conn or conn == "harness-store" else f" CONNECTOR={str(conn).rsplit(':', 1)[-1]}"
        if s == "kv_load":
            return f"make kv-load MODELS={m}"
        if s == "kv_faults":
            return f"make kv-faults MODEL={m} VLLM={rec.candidate.version}{conn}"
        return f"make matrix MODEL={m} SUITE={s} VLLM={rec.candidate.version}{conn}"
    if kind == "api":
        return f"make api MODEL={m} SUITE={s} CANDIDATE='{c}'"
    return f"make gate MODEL={m} SUITE={s} CANDIDATE='{c}'"


def _env() -> Any:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["json"] = lambda v: json.dumps(v, sort_keys=True, indent=1, default=str)
    env.filters["short"] = lambda v, n=10: str(v or "")[:n]
    return env


def page_of(rec_id: str) -> str:
    return SAFE.sub("-", rec_id) + ".html"


def _cell_view(sc: SiteCell) -> dict[str, Any]:
    c = sc.cell
    return {"key": sc.key, "row": sc.row.id, "model": sc.model, "col": sc.column, "state": c.state,
            "symbol": c.symbol, "count": c.count, "text": c.text, "device": c.device or "",
            "record": sc.shown, "page": page_of(sc.shown) if sc.shown else None,
            "sha": str(c.sha or "")[:10], "spark": sparkline(sc.points), "first_bad": list(sc.first_bad),
            "newer": list(c.newer), "warnings": list(c.warnings)}


def _matrix(data: SiteData, sections: Iterable[str]) -> list[dict[str, Any]]:
    """Sections -> rows (one per feature and model) -> a cell per column (n/a included)."""
    cat = data.catalog
    by_key = {sc.key: sc for sc in data.cells}
    out = []
    for sec in sections:
        rows = []
        for r in (r for r in cat.rows if r.section == sec):
            for model in r.models:
                cells = []
                for key in [*(c.key for c in cat.columns), ORACLE]:
                    sc = by_key.get(f"{r.id}--{model}--{key}")
                    na = data.table.cells[(r.id, model, key)].text
                    blank = {"col": key, "state": "na", "text": na, "device": ""}
                    cells.append(_cell_view(sc) if sc else blank)
                text = " ".join([r.id, r.title, model, sec, *(c.get("text", "") for c in cells)])
                rows.append({"row": r, "model": model, "cells": cells, "search": text.lower()})
        out.append({"title": sec, "rows": rows})
    return out


def _changes(data: SiteData) -> dict[str, Any]:
    """For the what-changed view: every SHA in HEAD's history that has records, and each cell's points."""
    shas = sorted({(p.order, p.sha, p.created[:10]) for sc in data.cells for p in sc.points
                   if p.order is not None}, key=lambda t: t[0])
    seen: dict[str, tuple[int, str, str]] = {}
    for t in shas:
        seen.setdefault(t[1], t)
    cells = [{"key": sc.key, "row": sc.row.id, "model": sc.model, "col": sc.column,
              "points": [[p.order, p.state, f"{SYMBOL[p.state]} {p.count}".strip(), page_of(p.record)]
                         for p in sc.points if p.order is not None]}
             for sc in data.cells if any(p.order is not None for p in sc.points)]
    orders = [t[0] for t in seen.values()]

    def shown(pts: list[list[Any]], order: int) -> str | None:
        older = [p[2] for p in pts if p[0] <= order]
        return older[-1] if older else None

    def flips(a: int, b: int) -> int:
        pairs = ((shown(c["points"], a), shown(c["points"], b)) for c in cells)
        return sum(1 for x, y in pairs if x and y and x != y)

    # the default "from": the newest SHA whose cells read otherwise than the newest's (the last change)
    start = next((o for o in reversed(orders[:-1]) if flips(o, orders[-1])), orders[0] if orders else None)
    return {"shas": [list(t) for t in seen.values()], "cells": cells, "from": start}


def _record_view(data: SiteData, lr: Any, plots: Mapping[str, list[str]]) -> dict[str, Any]:
    rec: Record = lr.record
    mine = data.by_record.get(rec.id, [])
    comparators: dict[str, list[int]] = {}
    for v in rec.verdicts:
        n = comparators.setdefault(v.comparator, [0, 0])
        n[0] += v.status == "pass"
        n[1] += 1
    return {"rec": rec, "path": lr.path, "json": page_of(rec.id).removesuffix(".html") + ".json",
            "command": reproduce(rec, lr.path), "device": device_of(rec), "plots": plots.get(rec.id, []),
            "comparators": comparators,
            "cells": [{**_cell_view(sc), "title": sc.row.title, "chart": chart(sc.points),
                       "points": [{"page": page_of(p.record), "sha": p.sha[:10], "state": p.state,
                                   "symbol": SYMBOL[p.state], "count": p.count, "text": p.text,
                                   "created": p.created, "this": p.record == rec.id} for p in sc.points]}
                      for sc in mine]}


def _glance(data: SiteData) -> list[dict[str, Any]]:
    cat: Catalog = data.catalog
    out = []
    for key, title in [*((c.key, c.title) for c in cat.columns), (ORACLE, "Oracle")]:
        cols = []
        for sec in cat.sections:
            cs = [sc.cell for sc in data.cells if sc.column == key and sc.row.section == sec]
            worst = max((c.state for c in cs), key=WORST.index) if cs else "na"
            cols.append({"state": worst, "symbol": SYMBOL[worst],
                         "count": f"{sum(c.state == 'pass' for c in cs)}/{len(cs)}" if cs else ""})
        out.append({"key": key, "title": title, "cols": cols})
    return out


def build_site(ws: Workspace, out: Path | None = None, paths: Iterable[Path] | None = None) -> Built:
    """Write the site into ``out`` (default ``reports/site/``) from features.toml and the records
    (all on disk, or only ``paths``)."""
    t0 = time.monotonic()
    out = out or ws.root / SITE_DIR
    catalog = load_catalog(ws.root / CATALOG, ws)
    loaded, broken = load_records(ws, paths)
    judge = Judge(ws, catalog, loaded, broken)
    table = judge.table()
    data = collect(ws, judge, table, loaded)
    env = _env()
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "records").mkdir(parents=True)
    (tmp / "plots").mkdir()
    shutil.copytree(HERE / "static", tmp / "static")
    plots: dict[str, list[str]] = {}
    for lr in loaded:
        src = ws.root / lr.path
        for png in sorted(src.parent.glob(f"{src.stem}.*.png")):
            name = SAFE.sub("-", png.name)
            shutil.copyfile(png, tmp / "plots" / name)
            plots.setdefault(lr.record.id, []).append(name)
    devices = sorted({sc.cell.device for sc in data.cells if sc.cell.device})
    states = [s for s in WORST if any(sc.cell.state == s for sc in data.cells)]
    common = {"catalog": catalog, "pin": table.pin, "symbol": SYMBOL, "views": VIEWS,
              "generated": f"{len(loaded)} records ({len(broken)} unreadable)"}
    pages = {
        "index.html": ("index.html.j2", {"sections": _matrix(data, catalog.sections), "devices": devices,
                                         "states": states, "glance": _glance(data), "broken": broken}),
        "changes.html": ("changes.html.j2", {"changes": _changes(data)}),
        "kv.html": ("kv.html.j2", {"kv": data.kv}),
        "bisects.html": ("bisects.html.j2", {"bisects": data.bisects,
                                             "explained": [sc for sc in data.cells if sc.first_bad]}),
    }
    for sec, name in VIEWS.items():
        if sec in catalog.sections:
            recs = [lr for lr in loaded if lr.record.kind == ("sampling" if sec == "Sampling" else "api")]
            pages[name] = ("section.html.j2", {"title": sec, "sections": _matrix(data, [sec]),
                                               "records": [_record_view(data, lr, plots) for lr in recs]})
    for name, (tpl, ctx) in pages.items():
        (tmp / name).write_text(env.get_template(tpl).render(**common, **ctx, root="", page=name))
    record_tpl = env.get_template("record.html.j2")
    for lr in loaded:
        view = _record_view(data, lr, plots)
        (tmp / "records" / page_of(lr.record.id)).write_text(
            record_tpl.render(**common, **view, root="../", page="record"))
        shutil.copyfile(ws.root / lr.path, tmp / "records" / view["json"])
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    n_plots = sum(len(v) for v in plots.values())
    return Built(out, len(pages) + len(loaded), len(loaded), len(data.cells), n_plots, time.monotonic() - t0)
