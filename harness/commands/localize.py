"""``harness localize RECORD`` and the diagnosis after a failing ``harness gate``.

Registered on :data:`harness.cli.COMMANDS` by :mod:`harness.cli` (this module does not import it).
The console names the culprit of each diverged case in one line::

    c03: parts at layer 1 mlp (NMSE 3.1e-2; everything before ≤ 2e-9)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from harness.abilities import TensorSource
from harness.api import EngineRefused
from harness.console import error, note, stdout
from harness.engines import make_runner
from harness.kinds.localize.kind import KEY, divergences
from harness.kinds.localize.oracle import cache_path, golden_sequence
from harness.models import resolve_model
from harness.oracle import oracle_available
from harness.pipeline import GateResult, run_gate_by_name
from harness.records import Record, load_record
from harness.workspace import Workspace


def localize_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("record", type=Path, help="a parity record under reports/records/ (a failing gate's)")
    p.add_argument("--cases", default=None, metavar="IDS",
                   help="'all' (every case; those that did not diverge are profiled over their whole "
                        "sequence) or c01,c03; default: the cases whose generation diverged")
    p.add_argument("--detail", action="store_true", help="also print each case's table")


def localize(ws: Workspace, source: Record, path: str, cases: str | list[str] | None = None) -> GateResult:
    """Diagnose ``source`` (a parity record) and write the ``localize`` record."""
    return run_gate_by_name(ws, str(source.model["name"]), str(source.suite["name"]), source.candidate.name,
                    kind=KEY, options={"source": source, "source_path": path, "cases": cases},
                    auto_record=False)


def report(res: GateResult, ws: Workspace, con: Console, detail: bool = False) -> None:
    rec = res.record
    for v in rec.verdicts:
        con.print(v.summary, highlight=False, style=None if v.status == "pass" else "yellow")
        if detail and v.detail:
            con.print(v.detail, highlight=False, style="dim")
    if not rec.verdicts:
        con.print(rec.summary, highlight=False)
    shown = res.path.relative_to(ws.root) if res.path.is_relative_to(ws.root) else res.path
    bad = [c for c in rec.controls if not c.ok] if rec.outcome == "pass" else []
    note(f"{rec.outcome}: {shown}" + (f" (+ {shown.with_suffix('').name}.profile.png)"
                                      if rec.extra.get("figures") else "")
         + (f"; {len(bad)} control(s) not answered as planted" if bad else ""), con)


def localize_command(a: argparse.Namespace, ws: Workspace) -> int:
    con = stdout
    source = load_record(a.record)
    cases = a.cases if a.cases in (None, "all") else [c.strip() for c in a.cases.split(",") if c.strip()]
    res = localize(ws, source, str(a.record), cases)
    report(res, ws, con, a.detail)
    return 0 if res.record.outcome in ("pass", "skip") else 1


def why_not(ws: Workspace, rec: Record) -> str | None:
    """Why a failing gate is not followed by a diagnosis (None: both engines can take part)."""
    if rec.kind != "parity" or rec.outcome != "fail":
        return "the gate did not fail"
    diverged = divergences(rec)
    if not diverged:
        return "no case diverged strictly (nothing to localize)"
    model = resolve_model(str(rec.model["name"]), ws)
    try:
        runner = make_runner(rec.candidate.name, model)
    except EngineRefused as e:
        return str(e)
    ability = runner.tensor_ability() if isinstance(runner, TensorSource) else None
    if ability is None or not ability.layers:
        return f"{rec.candidate.name}: " + (ability.reason("layers") if ability else "no TensorSource")
    if oracle_available() is None:
        return None
    from harness.goldens import golden_dir, read_golden

    golden = read_golden(golden_dir(ws.goldens, model, str(rec.suite["name"])), model_name=model.name,
                         suite_name=str(rec.suite["name"]))
    cached = all(cache_path(ws, model, golden_sequence(golden, cid)).exists() for cid in diverged)
    return None if cached else f"the pinned vLLM is not installed here ({oracle_available()}) " \
                               "and the oracle's tensors are not cached"


def after_gate(ws: Workspace, res: GateResult, con: Console) -> GateResult | None:
    """The diagnosis that follows a failing parity gate, when both engines can take part and the
    suite's ``[localize]`` table does not say ``auto = false``."""
    rec = res.record
    if rec.kind != "parity" or rec.outcome != "fail":
        return None
    why = why_not(ws, rec)
    if why is None:
        from harness.suites import find_suite

        if (find_suite(ws.suites, str(rec.suite["name"])).extra.get("localize") or {}).get("auto") is False:
            why = "the suite's [localize] table says auto = false"
    if why is not None:
        note(f"not localized: {why}", con)
        return None
    note("localizing where the engines part (harness localize; --no-localize skips it)...", con)
    out = localize(ws, rec, str(res.path.relative_to(ws.root) if res.path.is_relative_to(ws.root)
                                else res.path))
    report(out, ws, con)
    return out


def plant_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--out", type=Path, required=True, help="the copy's folder (must not exist)")
    p.add_argument("--layer", type=int, default=None, metavar="K",
                   help="the layer whose sub-block to perturb")
    p.add_argument("--sub", default="mlp", choices=["mlp", "attn", "moe"],
                   help="which sub-block's output projection (default mlp)")
    p.add_argument("--weight", default=None, metavar="NAME", help="or name the tensor exactly")
    p.add_argument("--relative", type=float, default=1e-2, help="||noise|| / ||weight|| (default 1e-2)")
    p.add_argument("--seed", type=int, default=0)


def plant_command(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.kinds.localize.plant import PlantError, plant

    try:
        got = plant(resolve_model(a.model, ws), a.out, weight=a.weight, layer=a.layer, sub=a.sub,
                    relative=a.relative, seed=a.seed)
    except PlantError as e:
        error(e)
        return 2
    stdout.print(f"{got.path}: {a.model} with {got.weight} perturbed by {got.relative:g} (relative, seed "
                    f"{got.seed}); digest {got.digest[:16]}\n  make gate MODEL={a.model} "
                    f"CANDIDATE=hf:weights={got.path}", highlight=False)
    return 0


SUBCOMMANDS = (
    ("localize", "where a parity gate's candidate parts from the oracle: layer and sub-block",
     localize_args, localize_command),
    ("plant", "copy a model with one weight perturbed (the planted proof of a localization)",
     plant_args, plant_command),
)
"""(name, help, arguments, function) of each subcommand, registered by :mod:`harness.cli`."""
