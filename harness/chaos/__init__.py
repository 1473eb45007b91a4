"""Faults injected into the harness, and what it does about them: the fault table.

``make chaos`` (``python -m harness.chaos``) runs every row and prints the table: what was injected,
what the harness did, what was lost and how many processes were left (the goal: nothing, none).
Each row is a scenario in :data:`~harness.chaos.table.SCENARIOS`, run by the user-facing commands
(``harness gate``, ``harness record``, ``make test``) in a private workspace on the real pinned vLLM:

* :mod:`harness.chaos.signals`  SIGKILL / SIGTERM / SIGINT to the harness during a gate, goldens
  recording and a KV round trip; the candidate engine killed; an engine that stops answering;
* :mod:`harness.chaos.files`    the disk full under records and goldens, four gates at once, a
  corrupt record, SIGTERM to ``make test``;
* :mod:`harness.chaos.watch`    what was left: processes (the tree watched while the run lasted)
  and files (records, goldens, store chunks: complete or absent).

The rows are opt-in tests too (``pytest -m chaos``, tests/integration/test_chaos.py).
"""

from harness.chaos import files, signals  # noqa: F401 - they register their rows
from harness.chaos.table import SCENARIOS, Row, run_row

__all__ = ["SCENARIOS", "Row", "run_row"]
