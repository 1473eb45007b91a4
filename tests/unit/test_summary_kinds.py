"""Summary record kinds (bisect, repin) carry their staleness rule like gate kinds do."""

from __future__ import annotations

import pytest

from harness.kinds.registered import KINDS, SUMMARIES
from harness.kinds.summary import register_summary
from harness.staleness import oracle_reasons


def test_every_summary_kind_has_a_rule_and_is_no_gate_kind():
    assert set(SUMMARIES.names()) >= {"bisect", "repin"}
    for name in SUMMARIES.names():
        assert SUMMARIES.find(name).stale is oracle_reasons
        assert KINDS.find(name) is None


def test_a_summary_kind_without_a_rule_is_refused():
    with pytest.raises(TypeError, match="needs a staleness rule"):
        register_summary("planted", None, help="no rule")  # type: ignore[arg-type]
    assert "planted" not in SUMMARIES

