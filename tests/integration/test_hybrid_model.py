"""The hybrid family (sliding-window + full-attention layers) on the REAL pinned vLLM and transformers.

One engine start: the oracle records tiny-gemma3's smoke goldens from scratch; transformers must
then match them token for token. The smoke prompts reach 84 + 32 tokens, beyond the 64-token
window, so both engines' sliding-window paths are exercised; and vLLM must keep the sliding-window
layers in KV-cache groups of their own (several groups, each with its block size), which is what
makes this model the KV round trip's multi-group case.
"""

from __future__ import annotations

import re

import pytest

from harness.models import resolve_model
from harness.oracle import record_goldens
from harness.pipeline import run_gate
from harness.suites import find_suite
from harness.workspace import Workspace

pytestmark = pytest.mark.integration


def test_hybrid_model_runs_in_several_kv_cache_groups_and_hf_matches_it(workspace: Workspace) -> None:
    model = resolve_model("tiny-gemma3", workspace)
    suite = find_suite(workspace.suites, "smoke")
    cases = suite.build_cases(model.encode, model.limits)
    assert max(len(c.prompt_ids) for c in cases) > 64, "no smoke prompt reaches past the window"

    golden = record_goldens(workspace, model, suite)
    logs = [p.read_text() for p in workspace.runs.glob("vllm-*/engine.log")]
    assert len(logs) == 1
    sizes = re.search(r"kv cache group sizes \(([\d, ]+)\)", logs[0])
    assert sizes is not None, "vLLM did not report several KV-cache groups:\n" + logs[0][-3000:]
    blocks = [int(x) for x in sizes.group(1).split(",") if x.strip()]
    assert len(blocks) == 3 and set(blocks) == {32}, blocks  # 2 sliding-window groups + 1 full
    assert golden.manifest["oracle"]["settings"]["max_model_len"] == 4096

    rec = run_gate(workspace, "tiny-gemma3", "smoke", "hf", auto_record=False).record
    assert rec.outcome == "pass", rec.summary
    assert rec.summary.startswith("smoke: 8/8 strict"), rec.summary
    assert rec.model["attention"].startswith("full + sliding-window attention (window 64")
