"""The end of every pytest run: the ten slowest tests and the engine-start ledger by test file and by
engine (harness/pytest_plugin.py, harness/engines/launch/ledger.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.engines.launch import ledger
from harness.pytest_plugin import slowest
from tests.unit.child_pytest import NO_HYPOTHESIS


@dataclass
class Report:
    nodeid: str
    when: str
    duration: float


def test_slowest_adds_the_phases_of_a_test_and_keeps_the_longest_first() -> None:
    reports = [Report("t.py::a", "setup", 30.0), Report("t.py::a", "call", 1.0), Report("t.py::a", "teardown", 0.5),
               Report("t.py::b", "call", 20.0), Report("t.py::c", "call", 40.0),
               Report("t.py::d", "call", 0.1), object()]  # a collect report has no phase: left out
    assert slowest(reports, 3) == [(40.0, "t.py::c"), (31.5, "t.py::a"), (20.0, "t.py::b")]
    assert slowest(reports) == [(40.0, "t.py::c"), (31.5, "t.py::a"), (20.0, "t.py::b"), (0.1, "t.py::d")]
    assert slowest([]) == []


def test_the_ledger_summary_names_each_engine_by_kind_and_model() -> None:
    lines = [{"kind": "vllm", "model": "tiny-llama", "start_s": 50.0, "test": "tests/integration/test_a.py::t1"},
             {"kind": "vllm", "model": "tiny-llama", "start_s": 30.0, "test": "tests/integration/test_b.py::t1"},
             {"kind": "vllm", "model": "tiny-llama", "start_s": 0.0, "reused": True, "test": "x.py::t"},
             {"kind": "vllm", "model": "tiny-gemma3", "start_s": 70.0, "test": "tests/integration/test_b.py::t2"},
             {"kind": "kv-phase", "model": "tiny-llama", "start_s": 40.0, "test": "tests/integration/test_c.py::t"}]
    out = ledger.summary(lines)
    assert out[0].startswith("engine starts: 4 (kv-phase 1, vllm 3), 190 s starting; 1 served by a live engine")
    by = out[out.index("by engine:") + 1:]
    assert by == ["    1 starts      40 s  kv-phase tiny-llama",
                  "    1 starts      70 s  vllm tiny-gemma3",
                  "    2 starts      80 s  vllm tiny-llama"]
    assert "by engine:" not in ledger.summary([])


TESTS = """
import subprocess, sys, time

def test_quick():
    assert True

def test_slow():
    time.sleep(0.3)

def test_an_engine_start():
    code = "from harness.engines.launch import ledger; ledger.record('vllm', 'tiny-llama', 42.0)"
    subprocess.run([sys.executable, "-c", code], check=True)
"""


def test_a_run_ends_with_its_slowest_tests_and_its_engine_starts(tmp_path: Path) -> None:
    (tmp_path / "test_some.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if k != ledger.ENV and not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).parents[2]), env.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *NO_HYPOTHESIS,
                        "test_some.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.splitlines()
    head = next(i for i, line in enumerate(out) if "slowest 3 tests" in line)
    named = [line.split()[-1] for line in out[head + 1:head + 4]]
    assert named[0] in ("test_some.py::test_slow", "test_some.py::test_an_engine_start"), out[head:]
    assert sorted(named) == sorted(f"test_some.py::{t}" for t in ("test_quick", "test_slow", "test_an_engine_start"))
    ends = out[next(i for i, line in enumerate(out) if " engine starts " in line) + 1:]
    assert ends[0].startswith("engine starts: 1 (vllm 1), 42 s starting"), ends
    assert "    1 starts      42 s  test_some.py" in ends
    assert ends[ends.index("by engine:") + 1] == "    1 starts      42 s  vllm tiny-llama"
