"""The hybrid family (sliding-window + full-attention layers) on the REAL pinned vLLM and transformers.

One engine start: the oracle records tiny-gemma3's smoke goldens from scratch; transformers must
then match them token for token. The smoke prompts reach 84 + 32 tokens, beyond the 64-token
window, so both engines' sliding-window paths are exercised; and vLLM must keep the sliding-window
layers in KV-cache groups of their own (several groups, each with its block size), which is what
makes this model the KV round trip's multi-group case.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from harness.models import resolve_model
from harness.oracle import record_goldens
from harness.pipeline import run_gate_by_name
from harness.suites import find_suite
from harness.workspace import REPO_ROOT, Workspace

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

    rec = run_gate_by_name(workspace, "tiny-gemma3", "smoke", "hf", auto_record=False).record
    assert rec.outcome == "pass", rec.summary
    assert rec.summary.startswith("smoke: 8/8 strict"), rec.summary
    assert rec.model["attention"].startswith("full + sliding-window attention (window 64")


@pytest.mark.kv_families
def test_kv_round_trip_with_three_kv_cache_groups(tmp_path: Path) -> None:
    """The harness store keeps vLLM's hybrid KV-cache manager on (it declares SupportsHMA): three
    groups, pages of every group byte-equal, a sliding-window group restored from its window only
    (vLLM's null block before it), and the chunk-size refusal naming a group.

    Opt-in (``pytest -m kv_families``): three engine starts (producer, consumer, refusal). Its
    committed record: reports/records/tiny-gemma3/kv_roundtrip/
    20261201T175918Z_907f80dba8_kv-harness-store_1cfb52.json (28/28 pages byte-equal, 3 groups)."""
    for sub in ("suites", "models", "goldens"):
        shutil.copytree(REPO_ROOT / sub, tmp_path / sub)
    ws = Workspace(tmp_path)
    rec = run_gate_by_name(ws, "tiny-gemma3", "kv_roundtrip", "vllm", auto_record=False).record
    assert rec.outcome == "pass", rec.summary
    groups = rec.extra["kv_cache_groups"]
    assert sorted((g["kind"], g["window"]) for g in groups) == [
        ("FullAttentionSpec", None), ("SlidingWindowSpec", 64), ("SlidingWindowSpec", 64)], groups
    assert rec.extra["failed_loads"].startswith("unreported")
    # 137 prompt tokens, 128 served: the full-attention layer gets blocks 0-3 back, each sliding
    # layer only blocks 2-3 (tokens 65..128 are inside the window of token 128)
    case = rec.extra["cases"]["n_2c_plus_k"]
    assert (case["expected_hit"], case["expected_pages"], case["restored_pages"]) == (128, 8, 8), case
    byte_equal = {v.case_id: v for v in rec.verdicts if v.comparator == "byte_equal"}
    assert byte_equal["n_2c_plus_k"].status == "pass"
    assert "across 3 layers" in byte_equal["n_2c_plus_k"].summary
    refusal = next(v for v in rec.verdicts if v.comparator == "kv_config")
    assert refusal.status == "refused" and "KV-cache group 0's block size 32 (SlidingWindowSpec" in refusal.summary
    # the planted faults bite in the multi-group layout; the recompute control is left out, said why
    lanes = rec.extra["control_lanes"]
    assert lanes["flip"]["byte_equal"]["status"] == "fail"
    assert lanes["drop"]["byte_equal"]["status"] == "fail"
    assert "several KV-cache groups" in lanes["drop"]["recompute"]
    assert all(c.ok for c in rec.controls), [c for c in rec.controls if not c.ok]
