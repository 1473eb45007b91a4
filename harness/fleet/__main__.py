"""``python -m harness.fleet plan|pin …``: the fleet's commands that need the standard library only.

``harness plan`` and ``harness pin`` are the same commands once the package is installed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.fleet.pins import BUILDS, PinError, device_pin
from harness.fleet.plan import describe, include, make_plan
from harness.fleet.shard import ShardError
from harness.fleet.spec import DEVICES, MATRIX_FILE, MatrixError
from harness.workspace import Workspace


def plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--matrix", type=Path, default=None, help=f"the matrix file (default: {MATRIX_FILE})")
    p.add_argument("--device", choices=[*DEVICES, "all"], default="all")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--shard", default=None, metavar="I/N", help="only the entries of shard I of N")
    g.add_argument("--shards", nargs="?", type=int, const=0, default=None, metavar="N",
                   help="print the shards (default N: the matrix file's [devices.<kind>] shards)")


def run_plan(a: argparse.Namespace, root: Path) -> int:
    try:
        matrix = a.matrix or root / MATRIX_FILE
        if a.shards is not None:
            if a.device == "all":
                raise ShardError("--shards needs --device cpu|cuda (a runner serves one device kind)")
            plan = make_plan(matrix, root, {a.device: a.shards} if a.shards else None)
            print(include(plan.shard_rows(a.device)))
            print(describe(plan, a.device, plan.entries(a.device)), file=sys.stderr)
            return 0
        plan = make_plan(matrix, root)
        chosen = plan.entries(a.device, a.shard)
    except (MatrixError, ShardError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(include([p.to_json() for p in chosen]))
    print(describe(plan, a.device, chosen), file=sys.stderr)
    return 0


def pin_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=list(BUILDS), default="cpu")


def run_pin(a: argparse.Namespace, root: Path) -> int:
    try:
        print(device_pin(a.device, root / "requirements" / "oracle.txt").requirements(), end="")
    except PinError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.fleet")
    sub = ap.add_subparsers(dest="cmd", required=True)
    plan_args(sub.add_parser("plan", help="the matrix entries (or shards) as CI matrix JSON"))
    pin_args(sub.add_parser("pin", help="the oracle's requirements for one device kind"))
    a = ap.parse_args(argv)
    root = Workspace.default().root
    return run_plan(a, root) if a.cmd == "plan" else run_pin(a, root)


if __name__ == "__main__":
    sys.exit(main())
