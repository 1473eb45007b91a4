"""The unit tier starts no engine: a test here that starts one (or is served by a live one) fails.

The engine-start ledger (:mod:`harness.engines.launch.ledger`) names the test that paid for each start, child
processes included; a test here whose name is on a line of the session's ledger fails, saying what it
ran. A test that needs a real engine belongs in ``tests/integration/`` (``make test`` runs both tiers,
``make test-unit`` this one)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harness.engines.launch import ledger
from harness.pytest_plugin import session_ledger


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome: Any = yield
    report = outcome.get_result()
    path = session_ledger(item.config)
    if report.when != "call" or report.failed or not path:
        return
    mine = [x for x in ledger.read(path) if x.get("test") == item.nodeid]
    if mine:
        what = ", ".join(
            f"{x.get('kind')} {x.get('model')}{' (a live engine)' if x.get('reused') else ''}" for x in mine
        )
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} ran an engine ({what}): tests/unit starts none; "
            "move the test to tests/integration/"
        )
