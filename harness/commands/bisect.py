"""``harness bisect`` (``make bisect``): the subcommand, its arguments, and what it prints.

Kept light at import (:mod:`harness.cli` imports it to register the command); the work is imported
when the command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.excerpt import INLINE, LINE, clip

HELP = ("since when: the first vLLM release (or commit of a cmd: engine, --repo) whose verdicts differ "
        "from GOOD's; every step a record, one bisect record")


def bisect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--suite", default="smoke")
    p.add_argument("--good", required=True, metavar="RELEASE|SHA",
                   help="the reference end: its verdicts are 'old' (a release, or a commit with --repo)")
    p.add_argument("--bad", required=True, metavar="RELEASE|SHA",
                   help="the other end (a release may be older than --good: the search walks back in time)")
    p.add_argument("--connector", default=None, metavar="MODULE:CLASS",
                   help="KV suites: the connector the harness tap wraps (ExampleConnector, ...)")
    p.add_argument("--only", default=None, metavar="CASE[/COMPARATOR],...",
                   help="compare only these verdicts (globs: '*/kv_hits'); default: every verdict")
    p.add_argument("--repo", type=Path, default=None,
                   help="bisect this git repository's history instead of vLLM releases")
    p.add_argument("--candidate", default=None, metavar="'cmd:...'",
                   help="with --repo: the engine command, run in each commit's checkout ({repo}, {model})")
    p.add_argument("--build", default=None, metavar="CMD",
                   help="with --repo: run in each checkout first; a failure skips that commit")
    p.add_argument("--concurrency", type=int, default=None, metavar="C",
                   help="parity suites: requests in flight")
    p.add_argument("--with-rebuilds", action="store_true",
                   help="step on every build the index lists (0.9.2.post2 beside 0.9.2), not once a release")
    p.add_argument("--refresh-index", action="store_true",
                   help="ask the package index now, not the cached list")
    p.add_argument("--remove-venvs", action="store_true",
                   help="delete each release venv this bisect had to install once its step is over")
    p.add_argument("--reuse-records", action="store_true",
                   help="read a step from a current record of that release already in the tree, not run it")
    p.add_argument("--installed-only", action="store_true",
                   help="skip (never install) a release whose venv is not installed yet; the skip is named")


def cmd_bisect(a: argparse.Namespace, ws: Any) -> int:
    from harness.bisect import BisectError
    from harness.bisect.run import bisect_history, bisect_releases
    from harness.console import error, note
    from harness.console import stdout as console


    def progress(s: str) -> None:
        note(s)

    try:
        if a.repo is not None:
            if not a.candidate:
                raise BisectError("--repo needs --candidate 'cmd:...' (the engine built from each commit)")
            done = bisect_history(ws, a.model, a.suite, a.repo, a.good, a.bad, a.candidate, build=a.build,
                                  only=a.only, progress=progress)
        else:
            if a.candidate or a.build:
                raise BisectError("--candidate and --build go with --repo (a bisect over a repository's "
                                  "history); over releases the candidate is vllm@<release>")
            done = bisect_releases(ws, a.model, a.suite, a.good, a.bad, connector=a.connector, only=a.only,
                                   concurrency=a.concurrency, with_rebuilds=a.with_rebuilds,
                                   refresh_index=a.refresh_index, remove_venvs=a.remove_venvs,
                                   reuse=a.reuse_records, installed_only=a.installed_only, progress=progress)
    except BisectError as e:
        error(e)
        return 2
    print_bisect(done.record, done.path, ws.root, console)
    return 0 if done.record.outcome == "pass" else 1


def print_bisect(rec: Any, path: Path, root: Path, console: Any) -> None:
    """The steps, the finding, the diff of the first differing pair, the cost."""
    from rich.table import Table

    from harness.console import print_table

    b = rec.extra["bisect"]
    t = Table(title=f"bisect {rec.candidate.name}: {rec.model['name']} / {rec.suite['name']}")
    for col in ("step", "point", "state", "outcome", "record / reason", "s"):
        t.add_column(col)
    for s in b["steps"]:
        point = s["point"][:10] if len(s["point"]) == 40 else s["point"]
        t.add_row(str(s["n"]), point, s["state"], s["outcome"] or "—",
                  s["record"] if s["runnable"] else clip(s["reason"], LINE), f"{s['wall_s']:.0f}")
    print_table(t, console)
    if b["diff"]:
        d = Table(title=f"verdicts that differ: {b['result']['last_old']} -> {b['result']['first_new']}")
        for col in ("case", "comparator", "before", "after", "after, in words"):
            d.add_column(col)
        for x in b["diff"]:
            d.add_row(x["case"], x["comparator"], x["before"], x["after"], clip(x["after_summary"], INLINE))
        print_table(d, console)
    c = b["cost"]
    console.print(f"{rec.summary}", highlight=False)
    builds = f"; builds {c['build_s']:.0f} s" if c.get("build_s") else ""
    if c.get("records_reused") or c.get("not_installed"):
        builds += (f"; {c['records_reused']} steps read from records, {c['not_installed']} releases "
                   "not installed (not tried)")
    console.print(f"cost: {c['steps']} steps ({c['skipped']} skipped), {c['total_s']:.0f} s in all; "
                  f"{c['venvs_installed']} venvs installed ({c['install_s']:.0f} s), "
                  f"{c['venvs_reused']} reused{builds}", highlight=False)
    shown = path.relative_to(root) if path.is_relative_to(root) else path
    console.print(f"record: {shown}", highlight=False)


SUBCOMMANDS = (("bisect", HELP, bisect_args, cmd_bisect),)
"""(name, help, arguments, function) of the subcommand, registered by :mod:`harness.cli`."""
