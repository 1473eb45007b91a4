"""What a full re-record would take, from the goldens' own recorded timings.

Every committed golden set's manifest says how long the pinned oracle took to record it
(``timings.record_wall_s``: its engine start and generation). Their sum is the estimate at the speed
they were recorded at. When this re-pin recorded some sets itself, each of those gives a ratio of its
time now to its recorded time, and the median ratio scales the sum: the same work, measured on this
machine now (on a shared machine both move with its load). A release venv that is not installed yet
adds its install, estimated from the installs the venvs' stamps recorded.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import Any

from harness.engines.launch.venvs import PACKAGE, read_venv, venv_listing, venvs_root
from harness.repin.whatif import Compared
from harness.workspace import REPO_ROOT, Workspace


def recorded_s(manifest: dict[str, Any]) -> float | None:
    t = manifest.get("timings") or {}
    if isinstance(t.get("record_wall_s"), int | float):
        return float(t["record_wall_s"])
    parts = [t.get("engine_start_s"), t.get("generate_s")]
    return float(sum(parts)) if all(isinstance(p, int | float) for p in parts) else None


def full_rerecord(ws: Workspace, release: str, compared: Sequence[Compared]) -> dict[str, Any]:
    sets, unknown = [], []
    for p in sorted(ws.goldens.glob("*/*/manifest.json")):
        s = recorded_s(json.loads(p.read_text()))
        name = f"{p.parent.parent.name}/{p.parent.name}"
        (sets.append((name, s)) if s is not None else unknown.append(name))
    total = sum(s for _, s in sets)
    ratios = [c.record_s / s for c in compared if c.recorded_now
              and (s := recorded_s(dict(c.old.manifest))) is not None and s > 0]
    root = venvs_root(REPO_ROOT)
    installed = read_venv(root / f"{PACKAGE}-{release}") is not None
    installs = [v.install_s for v in venv_listing(root)
                if v.path.name.startswith(f"{PACKAGE}-") and v.install_s]
    install = 0.0 if installed else (statistics.median(installs) if installs else None)
    out: dict[str, Any] = {"golden_sets": len(sets) + len(unknown), "recorded_s": round(total, 1),
                           "per_set": {n: round(s, 1) for n, s in sets}, "without_timings": unknown,
                           "venv_installed": installed,
                           "venv_install_s": None if install is None else round(install, 1)}
    if ratios:
        ratio = statistics.median(ratios)
        out.update(measured_ratio=round(ratio, 3), measured_sets=len(ratios),
                   scaled_s=round(total * ratio, 1))
    out["estimate_s"] = round(out.get("scaled_s", total) + (install or 0.0), 1)
    return out


def say(c: dict[str, Any]) -> str:
    """The estimate in one line."""
    text = (f"a full re-record: {c['golden_sets']} golden sets, {c['recorded_s'] / 60:.1f} min at the speed "
            f"they were recorded")
    if "scaled_s" in c:
        text += (f"; {c['scaled_s'] / 60:.1f} min at this machine's speed now (x{c['measured_ratio']}, the "
                 f"median of {c['measured_sets']} sets recorded now against their recorded times)")
    if not c["venv_installed"]:
        inst = c["venv_install_s"]
        text += "; plus the release venv's install" + (f" (~{inst:.0f} s, the median of the venvs here)"
                                                        if inst is not None else "")
    return text + f" — about {c['estimate_s'] / 60:.0f} min"
