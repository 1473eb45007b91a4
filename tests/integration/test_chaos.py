"""The fault table (docs/chaos.md), one test per row: each injects its fault into the harness as a
user runs it (``harness gate``, ``harness record``, ``make test``) in a private workspace, and must
end with nothing lost and no process left. Opt-in (``pytest -m chaos``, or ``make chaos`` for the
printed table): most rows start the real pinned vLLM once (1-4 minutes each on 2 cores). The row
without an engine (a corrupt record under the pages, 5-10 s) runs by default."""

from __future__ import annotations

import pytest

from harness.chaos import SCENARIOS, run_row

pytestmark = pytest.mark.integration


CHEAP = {"corrupt-record"}


@pytest.mark.parametrize("name", [pytest.param(e.name, marks=() if e.name in CHEAP else pytest.mark.chaos,
                                               id=f"{e.name}-{e.meta}engine") for e in SCENARIOS.entries()])
def test_a_fault_loses_nothing_and_leaves_no_process(name: str) -> None:
    row = run_row(name)
    assert row.ok, (f"{row.fault}: injected {row.injected}; the harness: {row.did}; lost: {row.lost}; "
                    f"{row.left} of {row.seen} processes left\n{row.detail}")
