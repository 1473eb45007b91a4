"""``harness rl`` / ``make rl MODEL=… [CANDIDATE=vllm] [SUITE=rl] [CONTROL=…] [TRAINER=…] [DTYPE=…]``:
the RL weight-sync gate (docs/rl.md). With ``CONTROL=all``: the clean run, then each planted fault as
its own run, and the separation of each from the clean run on the main figure."""

from __future__ import annotations

import argparse

from harness.console import error, note
from harness.console import stdout as console
from harness.workspace import Workspace


def rl_args(p: argparse.ArgumentParser) -> None:
    from harness.kinds.rl.settings import CONTROLS

    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--suite", default="rl")
    p.add_argument("--candidate", default="vllm", metavar="SPEC",
                   help="the rollout engine (vllm: the pinned vLLM, offline)")
    p.add_argument("--control", default=None, metavar="NAME",
                   help=f"a planted fault, its own run: {', '.join(CONTROLS)}; 'all': the clean run and each")
    p.add_argument("--trainer", default=None, metavar="MODULE:CALLABLE",
                   help="score the rollouts with your trainer (default: transformers)")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                   help="the lane: the engine's dtype and the trainer's declared one (default: the suite's)")
    p.add_argument("--bars-from", default=None, metavar="RECORD",
                   help="print the bars the rule sets from a calibration run's step-0 draws "
                        "(suite rl_bf16_calibrate) as the model's table for suite rl_bf16; runs nothing")


def separation(clean: float, planted: float) -> float:
    """How far a planted run's main figure stands above the clean run's (planted / clean)."""
    return planted / clean if clean > 0 else float("inf")


def cmd_rl(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.kinds.rl.settings import CONTROLS
    from harness.pipeline import run_gate_by_name
    from harness.report import print_record

    if a.bars_from:
        return _print_bars(a.bars_from)
    runs = [None, *CONTROLS] if a.control == "all" else [a.control]
    opts = {"progress": note, "trainer": a.trainer, "dtype": a.dtype}
    ok = True
    main: dict[str | None, float] = {}
    for control in runs:
        res = run_gate_by_name(ws, a.model, a.suite, a.candidate, options={**opts, "control": control})
        path = res.path.relative_to(ws.root) if res.path.is_relative_to(ws.root) else res.path
        print_record(res.record, str(path), console)
        main[control] = float(res.record.extra.get("rl", {}).get("main_value") or 0.0)
        # the clean run must pass; a planted fault must fail, for the reason it leaves
        caught = any(v.comparator == "rl_control" and v.status == "pass" for v in res.record.verdicts)
        ok &= (res.record.outcome == "pass") if control is None else (res.record.outcome == "fail" and caught)
    if None in main and len(main) > 1:
        for control, v in main.items():
            if control is not None:
                console.print(f"separation {control}: {separation(main[None], v):.3g}x "
                              f"(mean |Δ logprob| {v:.3g} vs clean {main[None]:.3g})")
    return 0 if ok else 1


def _print_bars(path: str) -> int:
    import json
    from pathlib import Path

    from harness.kinds.rl.calibrate import bars_from_record, toml_table

    p = Path(path)
    try:
        model, bars, draws = bars_from_record(json.loads(p.read_text()))
    except (OSError, ValueError, KeyError) as e:
        error(f"{path}: {e}")
        return 2
    table = toml_table(model, bars, draws, f"record {p.name}")
    console.print(table, markup=False, highlight=False, soft_wrap=True)
    return 0


HELP = "RL weight sync: trainer vs rollout across in-place weight updates of a running vLLM, MoE routing"
SUBCOMMANDS = (("rl", HELP, rl_args, cmd_rl),)
"""(name, help, arguments, function) of the subcommand, registered by :mod:`harness.cli`."""
