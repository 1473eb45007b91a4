"""pytest plugin: gate an engine from your own test suite.

Installed with the package (entry point ``pytest11``). In a test::

    def test_my_engine_matches_vllm(parity_gate):
        parity_gate(model="tiny-llama", suite="smoke", candidate="openai:http://127.0.0.1:8000")

``parity_gate`` runs the gate, writes its record, and fails the test with every failing verdict's
explanation when the outcome is not ``pass``. ``--parity-root`` points at a harness workspace
(suites/, goldens/, models/, reports/); the default is the installed harness's repository.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from harness.controls import vacuates
from harness.records import Record
from harness.workspace import Workspace


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("parity-harness")
    g.addoption("--parity-root", default=None, help="harness workspace (suites/, goldens/, reports/)")
    g.addoption("--parity-no-record", action="store_true",
                help="fail instead of recording missing goldens with the oracle")


def failure_report(rec: Record) -> str:
    lines = [f"gate {rec.outcome}: {rec.summary}"]
    lines += [v.detail or v.summary for v in rec.verdicts
              if v.comparator in rec.gates and v.status != "pass"]
    lines += [f"{'VACUOUS' if vacuates(c) else 'positive control failed'}: {c.comparator} control "
              f"{c.mutation!r} expected {c.expect}, got {c.got}" for c in rec.controls if not c.ok]
    return "\n".join(lines)


@pytest.fixture
def parity_workspace(request: pytest.FixtureRequest) -> Workspace:
    root = request.config.getoption("--parity-root")
    return Workspace(Path(root).resolve()) if root else Workspace.default()


@pytest.fixture
def parity_gate(request: pytest.FixtureRequest, parity_workspace: Workspace) -> Callable[..., Record]:
    from harness.pipeline import run_gate

    auto = not request.config.getoption("--parity-no-record")

    def gate(model: str = "tiny-llama", suite: str = "smoke", candidate: str = "hf") -> Record:
        rec = run_gate(parity_workspace, model, suite, candidate, auto_record=auto).record
        if rec.outcome != "pass":
            pytest.fail(failure_report(rec), pytrace=False)
        return rec

    return gate
