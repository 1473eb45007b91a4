"""``harness sampling`` / ``make sampling MODEL=… [CANDIDATE=…]``: the sampling gate on several
engines, one oracle run for all of them, one record each."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from harness.console import note
from harness.console import stdout as console
from harness.workspace import Workspace

if TYPE_CHECKING:
    from harness.pipeline import GateResult

DEFAULT_CANDIDATES = ("vllm", "hf", "llamacpp")


def run_sampling(
    ws: Workspace,
    model_name: str,
    suite_name: str,
    candidates: Sequence[str],
    progress: Callable[[str], None] | None = None,
    write: bool = True,
) -> list[GateResult]:
    """One record per candidate; the pinned oracle runs once, before the first."""
    from harness.kinds.sampling.oracle import oracle_rows
    from harness.kinds.sampling.settings import gate_settings
    from harness.models import resolve_model
    from harness.pipeline import kind_of, run_gate
    from harness.suites import find_suite

    model = resolve_model(model_name, ws)
    suite = find_suite(ws.suites, suite_name)
    kind_of(suite)  # the suite is checked whole before any engine starts
    gs = gate_settings(suite)
    if progress:
        progress(f"oracle: the pinned vLLM, greedy + raw logits for {len(suite.cases)} cases")
    oracle = oracle_rows(ws, model, suite, gs)
    out = []
    for spec in candidates:
        if progress:
            progress(f"candidate {spec}")
        out.append(
            run_gate(
                ws,
                model,
                suite,
                spec,
                write=write,
                options={"oracle": oracle, "progress": progress},
            )
        )
    return out


def sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--suite", default="sampling")
    p.add_argument(
        "--candidate",
        action="append",
        default=None,
        metavar="SPEC",
        help="an engine spec (repeatable; default: " + ", ".join(DEFAULT_CANDIDATES) + ")",
    )


def cmd_sampling(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.report import print_record

    specs = [c for arg in (a.candidate or DEFAULT_CANDIDATES) for c in arg.split() if c]
    results = run_sampling(ws, a.model, a.suite, specs, note)
    for res in results:
        print_record(
            res.record,
            str(res.path.relative_to(ws.root)) if res.path.is_relative_to(ws.root) else str(res.path),
            console,
        )
    return 0 if all(r.record.outcome == "pass" for r in results) else 1


HELP = (
    "sampler parity on vLLM, transformers and llama.cpp: support, goodness of fit with stated power, "
    "seeds, logprobs"
)


SUBCOMMANDS = (("sampling", HELP, sampling_args, cmd_sampling),)
"""(name, help, arguments, function) of the subcommand, registered by :mod:`harness.cli`."""
