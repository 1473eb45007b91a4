"""The planted proof as a sweep: for each sub-block, layer and size, a copy of the model with that
sub-block's output projection perturbed (:mod:`harness.kinds.localize.plant`) is gated with each engine
(``<engine>:weights=<copy>``) and, where its generation diverged, localized. A point is right when
every diverged case parts at the planted layer and sub-block.

    python benchmarks/localize_sweep.py --model tiny-llama --engines hf,vllm

writes ordinary records (parity and localize) under reports/records/ and prints one line per point.
The copies go to ``.cache/planted/<model>/`` (relative paths: the records name them as typed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.commands.localize import localize
from harness.kinds.localize.kind import KEY, divergences
from harness.kinds.localize.plant import plant
from harness.models import resolve_model
from harness.pipeline import run_gate
from harness.suites import find_suite
from harness.workspace import Workspace


@dataclass(frozen=True, slots=True)
class Point:
    sub: str
    layer: int
    relative: float
    engine: str
    gate: str
    """The gate's outcome."""
    gate_summary: str
    gate_record: str
    parts_at: dict[str, str | None] = field(default_factory=dict)
    """Diverged case -> where the localization says the engines part."""
    localize_record: str = ""
    localize_summary: str = ""
    localize_outcome: str = ""

    @property
    def want(self) -> str:
        return f"layer.{self.layer}.{self.sub}"

    @property
    def ok(self) -> bool | None:
        """None: nothing diverged, nothing to localize."""
        if not self.parts_at:
            return None
        return self.localize_outcome == "pass" and all(v == self.want for v in self.parts_at.values())

    def line(self) -> str:
        verdict = {None: "no divergence", True: "localized", False: "MISLOCALIZED"}[self.ok]
        if self.parts_at and self.localize_outcome != "pass":
            verdict = f"localize {self.localize_outcome}: {self.localize_summary}"
        where = sorted({str(v) for v in self.parts_at.values()})
        return (f"{self.engine:5s} {self.sub:4s} layer {self.layer} x{self.relative:g}: gate {self.gate} "
                f"({self.gate_summary.split(' — ')[0]}); {len(self.parts_at)} diverged, parts at "
                f"{', '.join(where) or '—'}: {verdict}")

    def to_json(self) -> dict[str, Any]:
        return {"sub": self.sub, "layer": self.layer, "relative": self.relative, "engine": self.engine,
                "gate": self.gate, "gate_summary": self.gate_summary, "gate_record": self.gate_record,
                "parts_at": self.parts_at, "localize_record": self.localize_record,
                "localize_summary": self.localize_summary, "localize_outcome": self.localize_outcome,
                "ok": self.ok}


def copy_path(model: str, sub: str, layer: int, relative: float) -> Path:
    return Path(".cache") / "planted" / model / f"{sub}-L{layer}-{relative:.0e}"


def sweep(ws: Workspace, model_name: str, engines: Sequence[str], layers: Sequence[int],
          subs: Sequence[str], relatives: Sequence[float], suite: str = "smoke",
          progress: Callable[[str], None] = print) -> list[Point]:
    """Every (sub, layer, relative, engine) point; the planted copies are made once and kept."""
    model, suite_ref = resolve_model(model_name, ws), find_suite(ws.suites, suite)
    points = []
    for sub in subs:
        for layer in layers:
            for rel in relatives:
                path = copy_path(model_name, sub, layer, rel)
                if not (ws.root / path / "config.json").exists():
                    plant(model, ws.root / path, layer=layer, sub=sub, relative=rel)
                if Path.cwd().resolve() != ws.root.resolve():  # records name the copy as typed
                    path = ws.root / path
                for engine in engines:
                    g = run_gate(ws, model, suite_ref, f"{engine}:weights={path}", auto_record=False)
                    rec = g.record
                    p = Point(sub, layer, rel, engine, rec.outcome, rec.summary, _rel(ws, g.path))
                    if divergences(rec):
                        loc = localize(ws, rec, _rel(ws, g.path))
                        p = Point(sub, layer, rel, engine, rec.outcome, rec.summary, _rel(ws, g.path),
                                  {v.case_id: v.evidence.get("parts_at") for v in loc.record.verdicts
                                   if v.comparator == KEY}, _rel(ws, loc.path), loc.record.summary,
                                  loc.record.outcome)
                    progress(p.line())
                    points.append(p)
    return points


def _rel(ws: Workspace, path: Path) -> str:
    return str(path.relative_to(ws.root)) if path.is_relative_to(ws.root) else str(path)
