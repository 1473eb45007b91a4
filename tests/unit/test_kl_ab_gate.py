"""The A/B gate's judging, on synthetic arms (the engines themselves: tests/integration/test_ab.py)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.api import EngineInfo, Output
from harness.kinds.ab.kind import Arm, capacity_ratio, same_decode_path
from harness.models import resolve_model
from harness.pipeline import run_ab
from harness.report import ab_lines
from harness.suites import find_suite
from harness.workspace import REPO_ROOT, Workspace
from tests.pins import PIN
from tests.unit.synthetic import drifting_pair, output_from_logits

VOCAB = 64
SUITE = """name = "ab_unit"
version = 1
kind = "ab"
[sampling]
max_tokens = 128
logprobs = 64
[compare.strict]
gate = false
[compare.near_tie]
gate = false
[compare.kl]
max_mean = 1e-2
[compare.drift]
max_slope_per_1k = 0.02
buckets = [0, 64, 128]
[compare.nmse]
max_nmse = 5e-4
[accuracy]
sigma = 0.5
n = 1000
[[cases]]
id = "a01"
text = "Once upon a time"
[[cases]]
id = "a02"
text = "The key and value cache"
"""


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("ab_unit")
    (root / "suites").mkdir()
    (root / "suites" / "ab_unit.toml").write_text(SUITE)
    (root / "models").symlink_to(REPO_ROOT / "models")
    return Workspace(root)


def synthetic_arms(ws: Workspace, noise: float, growth: float = 0.0) -> tuple[Arm, Arm]:
    """Arm A and an arm B whose scores of A's tokens carry logit noise ``noise + growth * t``
    (full-vocab rows over a synthetic vocabulary of 64)."""
    suite = find_suite(ws.suites, "ab_unit")
    cases = suite.build_cases(resolve_model("tiny-llama", ws).encode)
    rng = np.random.default_rng(0)
    a_out, b_scores, b_out = {}, {}, {}
    for case in cases:
        o, c = drifting_pair(rng, suite.sampling.max_tokens, VOCAB, noise, growth, case_id=case.id)
        a_out[case.id] = o
        b_scores[case.id] = c
        b_out[case.id] = o  # B generated the same tokens
    info = EngineInfo("synthetic", "synthetic", "0")
    a = Arm("synthetic", info, a_out, dict(a_out), {"output_tokens": 1024, "generate_s": 2.0},
            {"tokens": 1000, "blocks": 10, "block_size": 100})
    b = Arm("synthetic:b", info, b_out, b_scores, {"output_tokens": 1024, "generate_s": 1.0},
            {"tokens": 2500, "blocks": 25, "block_size": 100})
    return a, b


def test_a_quiet_arm_passes_with_ratios_and_three_kl_arms(ws: Workspace) -> None:
    a, b = synthetic_arms(ws, noise=1e-3)
    rec = run_ab(ws, "tiny-llama", "ab_unit", a.spec, b.spec, arms=(a, b), write=False).record
    assert rec.outcome == "pass", rec.summary
    f = rec.extra["ab"]
    assert f["throughput_ratio_b_over_a"] == pytest.approx(2.0)  # 1024 tokens in 1 s vs 2 s
    assert f["kv_capacity_ratio_b_over_a"] == pytest.approx(2.5)
    assert f["agreement"]["strict"] == 2
    assert set(rec.extra["distribution"]["arms"]) == {
        "B on A's tokens", "B free-running, until first divergence", "A rescored (control)"}
    assert rec.extra["distribution"]["arms"]["A rescored (control)"]["kl"]["mean"] == 0
    assert any("KV capacity B/A: 2.500" in line for line in ab_lines(rec))
    assert "accuracy" in f and f["accuracy"]["mde"] > f["accuracy"]["threshold"] > 0


def test_a_loud_arm_fails_kl_and_nmse(ws: Workspace) -> None:
    a, b = synthetic_arms(ws, noise=1.0)
    rec = run_ab(ws, "tiny-llama", "ab_unit", a.spec, b.spec, arms=(a, b), write=False).record
    assert rec.outcome == "fail"
    failed = {v.comparator for v in rec.verdicts if v.status == "fail" and v.case_id == "(run)"}
    assert {"kl", "nmse"} <= failed


def test_a_growing_error_fails_the_drift_gate(ws: Workspace) -> None:
    a, b = synthetic_arms(ws, noise=0.0, growth=2e-3)
    rec = run_ab(ws, "tiny-llama", "ab_unit", a.spec, b.spec, arms=(a, b), write=False).record
    drift = next(v for v in rec.verdicts if v.case_id == "(run)" and v.comparator == "drift")
    assert drift.status == "fail" and drift.evidence["slope_per_1k"] > 0.02, drift.summary


def test_a_refused_arm_gives_a_refused_record_with_the_reason(ws: Workspace) -> None:
    a, _ = synthetic_arms(ws, noise=0.0)
    b = Arm("vllm:kv_cache_dtype=fp8", EngineInfo("vllm", "vllm", PIN.version),
            refused="ValueError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX")
    rec = run_ab(ws, "tiny-llama", "ab_unit", a.spec, b.spec, arms=(a, b), write=False).record
    assert rec.outcome == "refused"
    assert {v.status for v in rec.verdicts} == {"refused"}
    assert "AVX-512" in rec.extra["ab"]["refused"]["reason"] and "AVX-512" in rec.summary
    assert "distribution" not in rec.extra


def test_capacity_ratio_and_decode_paths() -> None:
    assert capacity_ratio({"tokens": 100}, {"tokens": 400}) == 4.0
    assert capacity_ratio({"bytes_per_token": 1024.0}, {"bytes_per_token": 256.0}) == 4.0
    assert capacity_ratio({"tokens": 100}, {"bytes_per_token": 1.0}) is None
    assert same_decode_path("hf", "hf:kv=quanto-int4") == "hf:decode=step"
    assert same_decode_path("hf:dtype=float32", "hf:kv=quanto-int2") == "hf:dtype=float32,decode=step"
    assert same_decode_path("hf", "hf:dtype=bfloat16") == "hf"
    assert same_decode_path("vllm", "vllm:kv_cache_dtype=fp8") == "vllm"


def test_mismatched_tokens_are_judged_until_the_first_divergence(ws: Workspace) -> None:
    a, b = synthetic_arms(ws, noise=1e-3)
    logits = np.zeros((128, VOCAB))
    logits[:, 7] = 5.0
    flipped = output_from_logits("a01", logits)  # B's own tokens: all 7, unlike A's
    b = Arm(b.spec, b.info, {**b.outputs, "a01": flipped}, b.scores, b.timings, b.capacity)
    rec = run_ab(ws, "tiny-llama", "ab_unit", a.spec, b.spec, arms=(a, b), write=False).record
    assert rec.extra["ab"]["agreement"]["strict"] == 1
    free = rec.extra["distribution"]["arms"]["B free-running, until first divergence"]["kl"]
    assert free["alignment"] == "mixed" and free["positions"] < 2 * 128
    assert isinstance(flipped, Output)
