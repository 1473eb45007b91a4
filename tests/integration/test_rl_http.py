"""The RL weight-sync gate over HTTP on the real pinned vLLM server, at test scale (suite rl_small on
tiny-llama, one server start): every update through the server's RL routes, rollouts through
``/inference/v1/generate``, and an update with requests in flight under each ``/pause`` mode. The full
suite, the controls and the other models are committed records (make rl CANDIDATE=vllm-server).
Opt-in (-m rl_http): a server start takes minutes on a 2-core host."""

from __future__ import annotations

import shutil

import pytest

from harness.pipeline import run_gate_by_name
from harness.workspace import REPO_ROOT, Workspace

pytestmark = [pytest.mark.integration, pytest.mark.rl_http]


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("rl-http")
    for sub in ("suites", "models"):
        shutil.copytree(REPO_ROOT / sub, root / sub)
    return Workspace(root)


def test_clean_run_over_http_with_every_pause_mode(ws: Workspace) -> None:
    rec = run_gate_by_name(ws, "tiny-llama", "rl_small", "vllm-server").record
    assert rec.outcome == "pass", rec.summary
    rl = rec.extra["rl"]
    assert rl["transport"] == "http" and rec.candidate.settings["transport"] == "http"
    steps = rl["steps"]
    assert [s["weight_version"] for s in steps] == [str(i) for i in range(len(steps))]
    assert all(s["received"] and s["received"][0]["names"] > 0 for s in steps[1:])
    assert all(s["reset_prefix_cache"] for s in steps)
    assert "vacuous" in set(steps[0]["checksums"].values())
    # the server said which version sampled every rollout token (rl_version judged them)
    versions = [v for v in rec.verdicts if v.comparator == "rl_version"]
    assert versions and all(v.evidence.get("token_versions") for v in versions)
    pause = {p["mode"]: p for p in rl["pause"]}
    assert set(pause) == {"abort", "wait", "keep"} and all(p["verdict"] == "pass" for p in pause.values())
    # the server's counts say which requests each pause met; a request the engine had finished
    # before the pause is not one of them
    ab = pause["abort"]
    aborted = ab["server"]["finished"].get("abort", 0)
    assert aborted > 0 and aborted == sum(r["finish_reason"] == "abort" for r in ab["requests"])
    kept = pause["keep"]["requests"]
    assert pause["keep"]["server"]["held_while_paused"] > 0
    assert sum(len(r["weight_versions"]) == 2 for r in kept) >= pause["keep"]["server"]["held_while_paused"]
    assert all(c.ok for c in rec.controls)
    assert any(c.comparator == "rl_pause" and c.expect == "fail" for c in rec.controls)
