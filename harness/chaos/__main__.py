"""``python -m harness.chaos [ROW ...] [--list]``: run the fault table (every row, or those named),
print it, write it under reports/chaos/ and into docs/chaos.md."""

from __future__ import annotations

import argparse
import os
import sys

from harness.chaos import SCENARIOS, run_row
from harness.chaos.table import markdown, write_outputs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.chaos", description=__doc__)
    ap.add_argument("rows", nargs="*", help="rows to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the rows and the engine starts each needs")
    ap.add_argument("--no-write", action="store_true", help="print only; write neither JSON nor docs")
    a = ap.parse_args(argv)
    if a.list:
        for e in SCENARIOS.entries():
            print(f"{e.name:28} {e.meta} engine start(s)")
        return 0
    names = a.rows or SCENARIOS.names()
    for n in names:
        SCENARIOS.get(n)  # an unknown row is named before anything runs
    from harness.provenance import git_dirty, git_sha, now_utc, platform_facts
    from harness.workspace import REPO_ROOT

    created = now_utc()
    rows = []
    for n in names:
        print(f"chaos: {n} ...", file=sys.stderr, flush=True)
        row = run_row(n)
        rows.append((n, row))
        state = "ok" if row.ok else "NOT OK"
        print(f"chaos: {n}: {state} ({row.seconds:.1f} s): {row.did} | lost: {row.lost} | left: {row.left}",
              file=sys.stderr, flush=True)
    print(markdown(rows, f"fault table: {sum(r.ok for _, r in rows)}/{len(rows)} rows nothing lost, "
                         f"no process left"))
    if not a.no_write:
        plat = platform_facts()
        facts = {"created": created, "sha": git_sha(REPO_ROOT), "dirty": git_dirty(REPO_ROOT),
                 "machine": f"{os.cpu_count()} CPU cores ({plat['machine']}), shared with other work",
                 "platform": plat}
        json_path, doc = write_outputs(REPO_ROOT, rows, facts)
        print(f"wrote {json_path}" + (f" and {doc}" if doc else ""), file=sys.stderr)
    return 0 if all(r.ok for _, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
