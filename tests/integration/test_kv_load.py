"""The KV round trip under load on the REAL pinned vLLM (suite kv_load, tiny-llama): 128 requests in
flight over shared prefixes, a 48-block KV pool. Opt-in (``pytest -m kv_load``, ``make kv-load``):
two engine starts and two passes of 128 requests, 10-20 minutes on 2 busy cores."""

from __future__ import annotations

import pytest

from harness.pipeline import run_gate_by_name
from harness.workspace import Workspace

pytestmark = [pytest.mark.integration, pytest.mark.kv_load]


def test_under_load_every_restored_page_is_byte_equal_and_every_output_matches_alone(
        workspace: Workspace) -> None:
    rec = run_gate_by_name(workspace, "tiny-llama", "kv_load", "vllm", auto_record=False).record
    assert rec.outcome == "pass", rec.summary
    load = rec.extra["load"]
    assert load["requests_in_flight_peak"] >= 64 and load["restores"] > 0, load
    assert load["preemptions"] > 0 and load["evictions"] > 0, f"not under load: {load}"
    by = {(v.comparator, v.status) for v in rec.verdicts}
    assert ("kv_load.pages", "fail") not in by and ("kv_load.near_tie", "fail") not in by
    planted = [c for c in rec.controls if c.mutation.startswith("in-engine")]
    assert planted and all(c.ok and c.got == "fail" for c in planted), planted
    assert all(c.ok for c in rec.controls), [c for c in rec.controls if not c.ok]
