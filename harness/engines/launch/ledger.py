"""Every engine start, counted: one JSON line per start in the file ``$HARNESS_ENGINE_LEDGER`` names.

Engine starts are what a test run spends its time on (a vLLM start is 40-200 s on 2 cores), so each
place that starts an engine says so here: the vLLM worker (:mod:`harness.engines.vllm.runner`, pooled or
not), the KV round trip's phases, the invariance groups, servers (:mod:`harness.engines.launch.loopback`).
A start that an engine pool answered with a live engine is written too, as ``reused``. The file is
appended to by any process that inherits the variable (a ``harness gate`` child of a test included),
one ``write`` per line, so lines from several processes never interleave.

The pytest plugin (:mod:`harness.pytest_plugin`) points the variable at a file for the session and
prints :func:`summary` at the end: how many starts, how long they took, which tests paid for them.
Without the variable, :func:`record` does nothing.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ENV = "HARNESS_ENGINE_LEDGER"


def record(kind: str, model: str, start_s: float | None, *, reused: bool = False, ok: bool = True,
           key: str = "", **facts: Any) -> None:
    """One engine start (or reuse) of ``kind`` (``vllm``, ``vllm-server``, ``kv-phase``, ...) for
    ``model``; ``start_s``: seconds until it could serve (None when it never could: a refusal)."""
    path = os.environ.get(ENV)
    if not path:
        return
    line = {"t": time.time(), "kind": kind, "model": model, "start_s": start_s, "reused": reused, "ok": ok,
            "key": key, "pid": os.getpid(), "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
            **facts}
    data = (json.dumps(line, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read(path: str | Path) -> list[dict[str, Any]]:
    """The ledger's lines (a torn last line, from a killed process, is left out)."""
    out = []
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def totals(lines: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Starts (not reuses), their total seconds, reuses, and starts by test file and by engine (its
    kind and model), each as (count, seconds)."""
    lines = list(lines)
    starts = [x for x in lines if not x.get("reused")]
    by_file: dict[str, list[float]] = {}
    by_engine: dict[str, list[float]] = {}
    for x in starts:
        f = str(x.get("test") or "(outside a test)").split("::")[0]
        by_file.setdefault(f, []).append(float(x.get("start_s") or 0.0))
        by_engine.setdefault(f"{x.get('kind')} {x.get('model')}", []).append(float(x.get("start_s") or 0.0))
    return {"starts": len(starts), "start_s": sum(float(x.get("start_s") or 0.0) for x in starts),
            "reused": len(lines) - len(starts), "failed": sum(1 for x in starts if not x.get("ok", True)),
            "by_kind": {k: sum(1 for x in starts if x.get("kind") == k)
                        for k in sorted({x["kind"] for x in starts})},
            "by_file": {f: (len(v), sum(v)) for f, v in sorted(by_file.items())},
            "by_engine": {e: (len(v), sum(v)) for e, v in sorted(by_engine.items())}}


def summary(lines: Iterable[Mapping[str, Any]]) -> list[str]:
    """Lines for the end of a test run: the count first, ``engine starts: 0`` too (the unit tier
    says so), then the files that paid, then the engines (kind and model) they started."""
    t = totals(lines)
    kinds = ", ".join(f"{k} {n}" for k, n in t["by_kind"].items())
    out = [f"engine starts: {t['starts']}{f' ({kinds})' if kinds else ''}, {t['start_s']:.0f} s starting; "
           f"{t['reused']} served by a live engine; {t['failed']} refused or failed at start"]
    out += [f"  {n:3d} starts {s:7.0f} s  {f}" for f, (n, s) in t["by_file"].items()]
    if t["by_engine"]:
        out.append("by engine:")
        out += [f"  {n:3d} starts {s:7.0f} s  {e}" for e, (n, s) in t["by_engine"].items()]
    return out
