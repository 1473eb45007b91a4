"""Performance records: figures beside their limits, written atomically, read back as rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.perf import SCHEMA, Figure, Limit, bench_record, frame, read_bench, rows, write_bench

ROOT = Path(__file__).resolve().parents[2]


def test_a_figure_states_its_ratio_to_its_limit_and_its_goal() -> None:
    f = Figure("compare.fused", 25e6, "positions/s", Limit("loop", 0.25e6, "positions/s"), goal=20e6)
    assert f.ratio == pytest.approx(100.0) and f.goal_met is True
    slow = Figure("gate.wall", 30.0, "s", Limit("engine wall", 10.0, "s"), better="lower", goal=20.0)
    assert slow.ratio == pytest.approx(3.0) and slow.goal_met is False
    assert "MISSED" in slow.line() and "3x" in slow.line()
    assert Figure("x", 1.0, "B/s").to_json()["limit"] is None


def test_records_are_written_once_and_read_back_as_rows(tmp_path: Path) -> None:
    figs = [Figure("kv.digest_host_64k", 1e9, "B/s", Limit("memcpy of the same bytes", 1e10, "B/s"))]
    rec = bench_record(figs, {"kv": {"pages": 3}}, {}, ROOT)
    a = write_bench(tmp_path, rec)
    b = write_bench(tmp_path, rec)  # same id: a second file, the first never replaced
    assert a != b and a.exists() and b.exists() and not list(tmp_path.glob(".bench-*"))
    d = read_bench(a)
    assert d["schema"] == SCHEMA and d["harness"]["sha"] and isinstance(d["harness"]["dirty"], bool)
    (row,) = rows(d)
    assert row["figure"] == "kv.digest_host_64k" and row["ratio"] == pytest.approx(0.1)
    assert row["limit_name"] == "memcpy of the same bytes" and row["device_class"]
    df = frame(tmp_path)
    assert len(df) == 2 and set(df["figure"]) == {"kv.digest_host_64k"} and df["ratio"].tolist() == [0.1, 0.1]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": SCHEMA, "figures": [{"name": "x"}]}))
    with pytest.raises(ValueError, match=r"bad.json: figures\[0\] lacks name/value/unit"):
        read_bench(bad)


def test_make_bench_writes_a_record_of_every_part(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--quick", "--no-gate",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    (path,) = tmp_path.glob("*.json")
    d = read_bench(path)
    names = {f["name"] for f in d["figures"]}
    assert {"compare.fused", "compare.numpy", "full.kl_nmse", "kv.compare_64k", "kv.digest_host_64k"} <= names
    assert all(f["limit"] and f["ratio"] > 0 for f in d["figures"]) and not d["errors"]
    fused = next(f for f in d["figures"] if f["name"] == "compare.fused")
    assert fused["params"]["agree"] == "every position" and fused["goal"]["value"] == 20e6
