"""Every test here is an ``integration`` test (real engines: minutes, not seconds), whether or not its
module says so: ``-m "not integration"`` and ``make test-unit`` (tests/unit) leave the same tests out."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)
