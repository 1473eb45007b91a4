"""``harness spec`` / ``make spec MODEL=… [SUITE=spec] [CONTROL=…]``: the speculative-decoding gate
(docs/spec.md). With ``CONTROL=all``: the stock run, then each planted fault as its own run; the
stock run must pass and every planted one fail."""

from __future__ import annotations

import argparse

from harness.console import note
from harness.console import stdout as console
from harness.workspace import Workspace


def spec_args(p: argparse.ArgumentParser) -> None:
    from harness.kinds.spec.kind import CONTROLS

    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--suite", default="spec")
    p.add_argument("--candidate", default="vllm", metavar="SPEC", help="the pinned vLLM, offline")
    p.add_argument(
        "--control",
        default=None,
        metavar="NAME",
        help=f"a planted fault in the rejection sampler, its own run: {', '.join(CONTROLS)}; "
        "'all': the stock run and each",
    )
    p.add_argument(
        "--max-draws",
        type=int,
        default=None,
        metavar="N",
        help="cap the draws per (case, temperature, concurrency) below the suite's max_draws, so a "
        "slow model's run fits its time; the record states the TV each test then detects",
    )


def cmd_spec(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.kinds.spec.kind import CONTROLS
    from harness.pipeline import run_gate_by_name
    from harness.report import print_record

    runs = [None, *CONTROLS] if a.control == "all" else [a.control]
    ok = True
    for control in runs:
        res = run_gate_by_name(
            ws,
            a.model,
            a.suite,
            a.candidate,
            options={"progress": note, "control": control, "max_draws": a.max_draws},
        )
        path = res.path.relative_to(ws.root) if res.path.is_relative_to(ws.root) else res.path
        print_record(res.record, str(path), console)
        ok &= res.record.outcome == ("pass" if control is None else "fail")
    return 0 if ok else 1


HELP = "speculative decoding: greedy exactness, the sampled distribution with stated power, acceptance"
SUBCOMMANDS = (("spec", HELP, spec_args, cmd_spec),)
"""(name, help, arguments, function) of the subcommand, registered by :mod:`harness.cli`."""
