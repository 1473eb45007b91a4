"""Records as a dataset: one row per verdict, exported, and a feature's metric across commits."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd
import pytest

from harness.cli import main
from harness.features.trend import trend
from harness.records import frame
from harness.workspace import REPO_ROOT, Workspace
from tests.unit.features_kit import commit, make_git_workspace, make_record


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return make_git_workspace(tmp_path / "ws")


def test_one_row_per_verdict_with_provenance_and_commit_order(ws: Workspace) -> None:
    make_record(ws, created="2026-11-30T01:00:00Z")
    commit(ws.root, "a later commit", touch="notes.txt")
    make_record(ws, created="2026-11-30T02:00:00Z",
                statuses={"strict": ["pass"] * 8, "near_tie": ["pass"] * 6 + ["fail"] * 2})
    make_record(ws, created="2026-11-30T03:00:00Z", harness_sha="f" * 40)  # not in the history
    df = frame(ws.records, ws.root)
    assert len(df) == 3 * 16 and df["record"].nunique() == 3
    assert {"model", "suite", "candidate", "device_class", "sha", "commit_order", "outcome", "case",
            "comparator", "status", "gated"} <= set(df.columns)
    orders = df.groupby("created")["commit_order"].first().tolist()
    assert orders[0] == 0 and orders[1] == 1 and pd.isna(orders[2])
    assert df[df["comparator"] == "near_tie"]["gated"].all() and not df[df["comparator"] == "strict"]["gated"].any()


def test_export_csv_and_parquet_hold_the_same_rows(ws: Workspace, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_ROOT", str(ws.root))
    make_record(ws)
    assert main(["export", "--csv", str(tmp_path / "r.csv")]) == 0
    assert main(["export", "--parquet", str(tmp_path / "r.parquet")]) == 0
    a, b = pd.read_csv(tmp_path / "r.csv"), pd.read_parquet(tmp_path / "r.parquet")
    assert len(a) == len(b) == 16 and list(a["comparator"]) == list(b["comparator"])


def test_trend_plots_a_regression_where_it_entered(ws: Workspace, tmp_path: Path) -> None:
    make_record(ws, created="2026-11-30T01:00:00Z")
    commit(ws.root, "the regression", touch="notes.txt")
    make_record(ws, created="2026-11-30T02:00:00Z", outcome="fail",
                statuses={"strict": ["pass"] * 8, "near_tie": ["pass"] * 4 + ["fail"] * 4})
    make_record(ws, created="2026-11-30T03:00:00Z", dirty=True)
    t = trend(ws, "near-tie", out=tmp_path / "t.png")
    assert t.metric == "near_tie.pass_rate"
    assert [(p.commit_order, p.value) for p in t.points] == [(0, 1.0), (1, 0.5)]
    assert [why for _, why in t.outside] == ["it ran on uncommitted changes"]
    assert t.png is not None and t.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="metric of near-tie 'kl.mean'"):
        trend(ws, "near-tie", metric="kl.mean", out=tmp_path / "x.png")


def test_trend_of_the_committed_records_writes_a_png(tmp_path: Path) -> None:
    shallow = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--is-shallow-repository"],
                             capture_output=True, text=True).stdout.strip()
    if shallow != "false":
        pytest.skip("a shallow clone holds no history to place the records in (git fetch --unshallow)")
    t = trend(Workspace(REPO_ROOT), "greedy-near-tie", out=tmp_path / "g.png")
    assert t.points and t.png is not None and t.png.stat().st_size > 1000


def test_bench_figures_plot_across_commits(ws: Workspace, tmp_path: Path) -> None:
    from harness import perf
    from harness.features.trend import trend_bench
    from tests.unit.features_kit import git

    bench = ws.root / "reports" / "bench"
    for i, ratio in enumerate((80.0, 20.0)):
        fig = perf.Figure("compare.fused", 1e6 * ratio, "positions/s",
                          perf.Limit("per-token loop", 1e6, "positions/s"))
        rec = perf.bench_record([fig], {}, {}, ws.root, device={"class": "cpu-test"})
        perf.write_bench(bench, {**rec, "id": f"{rec['id']}-{i}", "created": f"2026-11-30T0{i}:00:00Z"})
        git(ws.root, "add", "-A")
        commit(ws.root, f"commit {i}", touch="notes.txt")
    t = trend_bench(ws, "compare.fused", out=tmp_path / "b.png")
    assert [(p.commit_order, p.value) for p in t.points] == [(0, 80.0), (1, 20.0)]
    assert t.png is not None and t.png.exists()
    with pytest.raises(ValueError, match="unknown bench figure 'compare.fuse'"):
        trend_bench(ws, "compare.fuse")
