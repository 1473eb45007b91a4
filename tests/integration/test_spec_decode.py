"""The speculative-decoding gate on the real pinned vLLM, at test scale (suite spec_small on
tiny-llama): the stock n-gram run, and a planted lossy acceptance that must fail with the test and
position named. The full suites, every control and smollm2-135m are committed records (make spec
MODEL=… CONTROL=all). Opt-in (-m spec_decode): four engine starts take minutes on a 2-core host."""

from __future__ import annotations

import shutil

import pytest

from harness.pipeline import run_gate_by_name
from harness.workspace import REPO_ROOT, Workspace

pytestmark = [pytest.mark.integration, pytest.mark.spec_decode]


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("spec")
    for sub in ("suites", "models"):
        shutil.copytree(REPO_ROOT / sub, root / sub)
    return Workspace(root)


def test_stock_ngram_keeps_greedy_and_counts_acceptance(ws: Workspace) -> None:
    rec = run_gate_by_name(ws, "tiny-llama", "spec_small", "vllm").record
    greedy = [v for v in rec.verdicts if v.comparator == "spec.greedy"]
    assert len(greedy) == 8 and all(v.status == "pass" for v in greedy), rec.summary
    spec = rec.extra["spec"]
    assert spec["acceptance"]["greedy"]["draft_tokens"] > 0
    # the host's replay of vLLM's schedule predicts vLLM's own counters over the greedy pass
    assert spec["predicted_greedy"]["drafts"] > 0
    assert rec.outcome in ("pass", "vacuous"), rec.summary


def test_a_lossy_acceptance_is_caught_and_named(ws: Workspace) -> None:
    rec = run_gate_by_name(ws, "tiny-llama", "spec_small", "vllm", options={"control": "accept_all"}).record
    assert rec.outcome == "fail" and rec.candidate.name == "vllm+accept_all"
    caught = [v for v in rec.verdicts if v.comparator == "spec.control"]
    assert caught and caught[0].status == "pass", caught
    assert "at position" in caught[0].summary
