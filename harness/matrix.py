"""The vLLM version matrix: one suite, several vLLM releases, one record per release.

A KV suite (``SUITE=kv_roundtrip [CONNECTOR=...]``) runs the whole round trip -- producer, fresh
consumer, refusal probe -- inside each release's venv (:mod:`harness.kinds.kv.kind`); no speed
is timed there.

``make matrix MODEL=tiny-llama VLLM="0.31.0 0.32.0"`` gates ``vllm@<version>`` for each release,
each in its own venv (created on first use, see :mod:`harness.engines.launch.venvs`), against the same
goldens of the pinned oracle. Speed is stated as a ratio to the oracle measured in the same matrix
run: when the pin is in the list its own run *is* the oracle's measurement (it goes first);
otherwise the oracle is timed once up front (one engine start), never once per release.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.engines.launch.venvs import VenvError, check_version
from harness.engines.vllm.release import VLLMReleaseRunner
from harness.excerpt import clip
from harness.models import resolve_model
from harness.oracle import load_or_record, measure_speed
from harness.pin import oracle_pin
from harness.pipeline import kind_of, run_gate
from harness.speed import Speed
from harness.steps import step
from harness.suites import find_suite
from harness.workspace import Workspace

DEFAULT_CONCURRENCY = 4


@dataclass(frozen=True, slots=True)
class MatrixRow:
    """One release's outcome in a matrix run."""

    version: str
    outcome: str
    summary: str
    record: Path
    speed: str
    """The record's speed statement, e.g. ``candidate/oracle = 0.97x output tok/s at c4``."""
    venv: dict[str, Any]
    """Install facts: size, install time (0 when it already existed), packages."""
    wall_s: float

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "outcome": self.outcome, "summary": self.summary,
                "record": str(self.record), "speed": self.speed, "venv": self.venv,
                "wall_s": round(self.wall_s, 1)}


def parse_versions(text: str | Sequence[str]) -> list[str]:
    """``"0.31.0 0.32.0"`` or ``"0.31.0,0.32.0"`` -> checked, de-duplicated, in order."""
    items = text.replace(",", " ").split() if isinstance(text, str) else list(text)
    if not items:
        raise VenvError("give at least one vLLM release, e.g. VLLM=\"0.31.0 0.32.0\"")
    return list(dict.fromkeys(check_version(v) for v in items))


def _row(v: str, res: Any, t0: float) -> MatrixRow:
    rec = res.record
    speed = str(rec.extra.get("speed", {}).get("statement", ""))
    return MatrixRow(v, rec.outcome, rec.summary, res.path, speed,
                     dict(rec.candidate.environment.get("venv", {})), time.perf_counter() - t0)


def run_matrix(ws: Workspace, model_name: str, suite_name: str, versions: Sequence[str], *,
               concurrency: int = DEFAULT_CONCURRENCY, auto_record: bool = True, connector: str | None = None,
               progress: Callable[[str], None] = lambda s: None) -> list[MatrixRow]:
    pin = oracle_pin().version
    order = sorted(parse_versions(versions), key=lambda v: v != pin)  # the pin first: it is the oracle
    model = resolve_model(model_name, ws)
    suite = find_suite(ws.suites, suite_name)
    golden, _ = load_or_record(ws, model, suite, auto_record=auto_record)
    if "kv" in kind_of(suite).tables:
        rows = []
        for v in order:
            progress(f"vllm@{v}: KV round trip{f' through {connector}' if connector else ''}")
            t0 = time.perf_counter()
            with step(f"matrix vllm@{v}: {suite_name} on {model_name}") as s:
                rows.append(_row(v, run_gate(ws, model, suite, f"vllm@{v}", connector=connector,
                                             auto_record=False), t0))
                s.note = rows[-1].outcome
            progress(f"vllm@{v}: {rows[-1].outcome} — {rows[-1].summary}")
        return rows
    if connector:
        raise VenvError(f"a KV connector ({connector}) needs a KV suite; {suite_name} is {suite.kind!r}")
    oracle: Speed | str | None = None
    if pin not in order:
        progress(f"timing the oracle (vLLM {pin}) at c{concurrency} once for the whole matrix")
        ws.runs.mkdir(parents=True, exist_ok=True)
        try:
            with step(f"matrix: timing the oracle (vLLM {pin}) at c{concurrency}"):
                oracle = measure_speed(model, golden.cases, golden.sampling, concurrency, ws.runs)
        except Exception as e:  # noqa: BLE001 - speed never blocks the correctness matrix
            oracle = clip(f"oracle speed run failed: {type(e).__name__}: {e}")
    rows = []
    for v in order:
        progress(f"vllm@{v}: {'using the oracle venv' if v == pin else 'venv + gate'}")
        t0 = time.perf_counter()
        runner = VLLMReleaseRunner(model, v, {}, name=f"vllm@{v}", run_dir=ws.runs, concurrency=concurrency)
        if v == pin:
            speed_arg: Speed | bool | str = (f"vllm@{v} is the oracle's own release: its speed is the "
                                             f"oracle's for the other releases of this matrix")
        else:
            speed_arg = oracle if oracle is not None else False
        with step(f"matrix vllm@{v}: {suite_name} on {model_name}") as s:
            res = run_gate(ws, model, suite, f"vllm@{v}", runner=runner, concurrency=concurrency,
                           speed=speed_arg, auto_record=False)
            s.note = res.record.outcome
        if v == pin and runner.facts().speed is not None:
            oracle = runner.facts().speed
        rows.append(_row(v, res, t0))
        progress(f"vllm@{v}: {res.record.outcome} — {res.record.summary}")
    return rows


def print_matrix(rows: Sequence[MatrixRow], root: Path, console: Any) -> None:
    """One block per release (readable at any terminal width)."""
    from rich.text import Text

    from harness.report import status_text

    for r in rows:
        v = r.venv
        venv = ("the oracle's own venv" if v.get("shared_with_oracle") else
                f"{v.get('size_mib', '?')} MiB, installed in {v.get('install_s', '?')} s "
                f"(torch {v.get('packages', {}).get('torch', '?')}, transformers "
                f"{v.get('packages', {}).get('transformers', '?')})") if v else "not installed"
        rec = r.record.relative_to(root) if r.record.is_relative_to(root) else r.record
        console.print(Text.assemble(f"vllm@{r.version}  ", status_text(r.outcome), f"  {r.summary}"))
        for key, val in (("speed", r.speed), ("venv", venv), ("record", str(rec)),
                         ("wall", f"{r.wall_s:.0f} s")):
            console.print(Text(f"    {key:7s}: {val}"), highlight=False)
