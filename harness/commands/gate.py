"""``harness gate``, ``harness ab``, ``harness invariance``, ``harness record``, ``harness matrix``:
run a gate (or record its goldens) and print the record.

Kept light at import (:mod:`harness.cli` registers :data:`SUBCOMMANDS`); the pipeline is imported
when a command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from harness.commands.localize import after_gate
from harness.console import note
from harness.console import stdout as console
from harness.workspace import Workspace


def model_suite_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--suite", default="smoke")


def _printed(res: Any, ws: Workspace) -> int:
    """Print a gate's record (its path relative to the tree where it lies inside) and the exit code."""
    from harness.report import print_record

    print_record(res.record, str(res.path.relative_to(ws.root)) if res.path.is_relative_to(ws.root)
                 else str(res.path), console)
    return 0 if res.record.outcome == "pass" else 1


def _gate_args(p: argparse.ArgumentParser) -> None:
    model_suite_args(p)
    p.add_argument("--candidate", default=None,
                   help="engine spec: hf, vllm, hf:dtype=bfloat16, vllm@0.28.0, ... (default: hf; the "
                        "pinned vllm for KV and invariance suites)")
    p.add_argument("--no-record-goldens", action="store_true",
                   help="fail instead of recording goldens with the oracle when none exist")
    p.add_argument("--concurrency", type=int, default=None, metavar="C",
                   help="requests in flight (1, 4, 8, ...); default: the engine's own")
    p.add_argument("--speed", action="store_true",
                   help="also time the pinned oracle on the same workload after the candidate, so the "
                        "record states a candidate/oracle speed ratio (one more vLLM start)")
    p.add_argument("--connector", default=None, metavar="MODULE:CLASS",
                   help="KV suites only: wrap this vLLM KV connector (e.g. ExampleConnector) instead "
                        "of the harness store")
    p.add_argument("--no-localize", action="store_true",
                   help="after a failing parity gate, do not localize where the engines part")


def cmd_gate(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.pipeline import run_gate_by_name

    res = run_gate_by_name(ws, a.model, a.suite, a.candidate, auto_record=not a.no_record_goldens,
                           concurrency=a.concurrency, speed=a.speed, connector=a.connector)
    code = _printed(res, ws)
    if not a.no_localize:
        after_gate(ws, res, console)
    return code


def _ab_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--suite", default="ab_smoke")
    p.add_argument("--a", required=True, metavar="SPEC", help="reference configuration, e.g. vllm")
    p.add_argument("--b", required=True, metavar="SPEC",
                   help="configuration under test, e.g. vllm:dtype=bfloat16 or hf:kv=quanto-int4")


def cmd_ab(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.pipeline import run_ab

    return _printed(run_ab(ws, a.model, a.suite, a.a, a.b), ws)


def _invariance_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--suite", default="invariance")
    p.add_argument("--engine", default="vllm", metavar="SPEC",
                   help="the engine family under test: vllm, or vllm:<options> (the reference configuration)")
    p.add_argument("--variants", default=None, metavar="NAMES",
                   help="comma-separated variants (and rl) to run; default: every one the suite names")


def cmd_invariance(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.pipeline import run_gate_by_name

    opts: dict = {"progress": note}
    if a.variants:
        opts["variants"] = [v.strip() for v in a.variants.split(",") if v.strip()]
    return _printed(run_gate_by_name(ws, a.model, a.suite, a.engine, options=opts), ws)


def cmd_record(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.models import resolve_model
    from harness.oracle import record_goldens
    from harness.suites import find_suite

    model, suite = resolve_model(a.model, ws), find_suite(ws.suites, a.suite)
    g = record_goldens(ws, model, suite)
    t = g.manifest["timings"]
    console.print(f"recorded {len(g.cases)} cases of {suite.name} v{suite.version} for {model.name} "
                  f"with {g.manifest['oracle']['pin']} in {t['record_wall_s']:.1f} s "
                  f"(engine start {t['engine_start_s']:.1f} s) -> {g.folder}")
    return 0


def _matrix_args(p: argparse.ArgumentParser) -> None:
    model_suite_args(p)
    p.add_argument("--vllm", required=True, metavar="VERSIONS",
                   help='vLLM releases, e.g. "0.31.0 0.32.0" (each in its own venv under .venvs/)')
    p.add_argument("--concurrency", type=int, default=4, metavar="C", help="requests in flight (4)")
    p.add_argument("--connector", default=None, metavar="MODULE:CLASS",
                   help="KV suites: the connector the harness tap wraps (default: the harness store)")


def cmd_matrix(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.matrix import print_matrix, run_matrix

    rows = run_matrix(ws, a.model, a.suite, a.vllm.split(), concurrency=a.concurrency,
                      connector=a.connector, progress=note)
    print_matrix(rows, ws.root, console)
    return 0 if all(r.outcome == "pass" for r in rows) else 1


SUBCOMMANDS = (
    ("gate", "run a gate: goldens -> candidate -> verdicts -> record", _gate_args, cmd_gate),
    ("ab", "A/B gate: one engine, two configurations: KL, drift, agreement, throughput, KV capacity",
     _ab_args, cmd_ab),
    ("invariance", "configurations that must not change one token (bit-exact / near-tie) and "
                   "trainer-vs-rollout logprobs", _invariance_args, cmd_invariance),
    ("record", "(re-)record goldens with the pinned vLLM oracle", model_suite_args, cmd_record),
    ("matrix", "gate several vLLM releases (vllm@<version>), one record each", _matrix_args, cmd_matrix),
)
"""(name, help, arguments, function) of each subcommand, registered by :mod:`harness.cli`."""
