"""Four gates at once on one workspace, all finding their goldens missing: exactly one records them
(the oracle's run stubbed by a copy of the committed goldens, taking a second), the other three
wait for the lock and read what it wrote. Before the lock, each gate ran its own oracle and they
swapped folders under each other. About 5 s."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from harness import oracle
from harness.goldens import Golden, read_golden
from harness.models import resolve_model
from harness.suites import find_suite
from harness.workspace import Workspace


def test_four_gates_record_missing_goldens_once(workspace: Workspace, monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    committed = tmp_path / "committed"
    shutil.copytree(workspace.goldens / "tiny-llama" / "smoke", committed)
    shutil.rmtree(workspace.goldens / "tiny-llama" / "smoke")
    recorded: list[int] = []

    def slow_oracle(ws: Workspace, model: object, suite: object, pin: object) -> Golden:
        recorded.append(threading.get_ident())
        time.sleep(1.0)  # the others arrive while it runs
        dest = ws.goldens / "tiny-llama" / "smoke"
        tmp = dest.with_name(".smoke.partial")
        shutil.copytree(committed, tmp)
        tmp.rename(dest)
        return read_golden(dest, model_name="tiny-llama", suite_name="smoke")

    monkeypatch.setattr(oracle, "_record", slow_oracle)
    model, suite = resolve_model("tiny-llama", workspace), find_suite(workspace.suites, "smoke")
    got: list[tuple[bool, int]] = []
    errors: list[BaseException] = []

    def gate() -> None:
        try:
            g, now = oracle.load_or_record(workspace, model, suite, auto_record=True)
            got.append((now, len(g.cases)))
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=gate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len(recorded) == 1, f"the oracle ran {len(recorded)} times for one set of goldens"
    assert sorted(got) == [(False, 8), (False, 8), (False, 8), (True, 8)]
