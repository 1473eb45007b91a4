"""The A/B configuration gate with real engines: vLLM fp32 vs bf16, vLLM's fp8 KV cache (refused
where the CPU lacks AVX-512), a configuration vLLM refuses everywhere, and transformers' quantized KV
cache vs the plain one.

vLLM engine starts (≈1 min each on 2 cores): bf16 and one refusal (which vLLM reaches after about a
minute of start-up); arm A is test_full_vocab_vllm's engine (the same configuration, served by the
session's engine pool), and test_gate_smoke gets the refusal without a start. The fp8 arm is opt-in
(``-m ab_fp8``: one more start), and so is transformers' quantized KV cache (``-m ab_quantized_kv``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from harness.api import Output
from harness.kinds.ab.kind import Arm, run_arm, run_arms
from harness.models import resolve_model
from harness.pipeline import run_ab
from harness.records import load_record
from harness.report import ab_lines
from harness.suites import find_suite
from harness.workspace import REPO_ROOT, Workspace

pytestmark = pytest.mark.integration

SUITE = "ab_smoke"


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("ab")
    for sub in ("suites", "models"):
        shutil.copytree(REPO_ROOT / sub, root / sub)
    return Workspace(root)


def arms(ws: Workspace, a_spec: str, b_spec: str, a: Arm | None = None) -> tuple[Arm, Arm]:
    model = resolve_model("tiny-llama", ws)
    a, b, _ = run_arms(ws, model, find_suite(ws.suites, SUITE), a_spec, b_spec, a=a)
    return a, b


@pytest.fixture(scope="module")
def vllm_a(ws: Workspace) -> Arm:
    """Arm A (vLLM fp32) runs once; every vLLM B below is judged against it."""
    model = resolve_model("tiny-llama", ws)
    suite = find_suite(ws.suites, SUITE)
    a = run_arm("vllm", model, suite.build_cases(model.encode), suite.sampling, suite.sampling.logprobs,
                None, ws.runs)
    assert a.ran, a.error
    return a


def ramp(scores: list[Output]) -> list[Output]:
    out = []
    for s in scores:
        lp = np.array(s.top_logprobs, np.float32, copy=True)
        n = len(lp)
        lp[np.arange(n), lp.argmax(axis=1)] -= 4.0 * np.arange(n, dtype=np.float32) / (n - 1)
        out.append(Output(s.case_id, s.token_ids, s.text, s.top_ids, lp, s.chosen_logprobs, s.finish_reason))
    return out


def test_vllm_bf16_against_fp32(ws: Workspace, vllm_a: Arm) -> None:
    a, b = arms(ws, "vllm", "vllm:dtype=bfloat16", a=vllm_a)
    res = run_ab(ws, "tiny-llama", SUITE, "vllm", "vllm:dtype=bfloat16", arms=(a, b))
    rec = res.record
    assert rec.kind == "ab" and rec.candidate.settings["dtype"] == "bfloat16"
    f = rec.extra["ab"]
    # bf16 keys and values take half the bytes of fp32 ones: about twice the blocks in the same memory
    assert 1.5 < f["kv_capacity_ratio_b_over_a"] < 2.5, f
    assert f["a"]["capacity"]["source"].startswith("vLLM") and f["throughput_ratio_b_over_a"] > 0
    assert f["agreement"]["cases"] == 4
    arms_ = rec.extra["distribution"]["arms"]
    b_kl = arms_["B on A's tokens"]["kl"]
    control = arms_["A rescored (control)"]["kl"]
    assert b_kl["mode"] == "full-vocab" and b_kl["alignment"] == "teacher-forced"
    assert b_kl["positions"] == 4 * 256
    assert control["mean"] < 1e-6 < b_kl["mean"]  # bf16 moves the distributions; rescoring does not
    nmse = next(v for v in rec.verdicts if v.case_id == "(run)" and v.comparator == "nmse")
    assert nmse.evidence["mode"] == "full-vocab" and nmse.evidence["nmse"] > 0
    for name in rec.extra["distribution"]["figures"].values():
        assert (res.path.parent / name).read_bytes()[:4] == b"\x89PNG"
    assert load_record(res.path) == rec
    assert any("KV capacity B/A" in line for line in ab_lines(rec))

    # the same arms with a planted drift in B's scores: the gate must fail on the slope
    bad = run_ab(ws, "tiny-llama", SUITE, "vllm", "vllm:dtype=bfloat16", arms=(a, b), transform_b=ramp,
                 write=False).record
    assert bad.outcome == "fail"
    drift = next(v for v in bad.verdicts if v.case_id == "(run)" and v.comparator == "drift")
    assert drift.status == "fail", drift.summary


def _has_avx512() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.ab_fp8
def test_vllm_fp8_kv_cache_is_measured_or_refused_with_the_engines_reason(ws: Workspace,
                                                                           vllm_a: Arm) -> None:
    """Opt-in (``pytest -m ab_fp8``): one more engine start for what the default run already holds
    (an A/B arm's KV capacity measured: the bf16 test; a B arm vLLM refuses: the block-size test).
    Its committed record: reports/records/tiny-llama/ab_smoke/
    20261130T022649Z_0c480c235e_ab-vllm-kv-cache-dtype-fp8_c7afdd.json (4/4 near-tie, KV capacity B/A
    4.00 on an AVX-512 CPU)."""
    a, b = arms(ws, "vllm", "vllm:kv_cache_dtype=fp8", a=vllm_a)
    rec = run_ab(ws, "tiny-llama", SUITE, "vllm", "vllm:kv_cache_dtype=fp8", arms=(a, b)).record
    if not _has_avx512():  # measured on an AVX2-only CPU: "FP8 KV cache on CPU requires ... AVX-512"
        assert rec.outcome == "refused", rec.summary
        assert "AVX-512" in rec.extra["ab"]["refused"]["reason"]
        assert {v.status for v in rec.verdicts} == {"refused"}
        return
    assert b.ran, b.refused or b.error
    f = rec.extra["ab"]
    assert f["b"]["capacity"]["cache_dtype"].startswith("fp8")
    assert 3.0 < f["kv_capacity_ratio_b_over_a"] < 5.0, f  # 1-byte keys and values vs 4-byte ones
    assert rec.extra["distribution"]["arms"]["B on A's tokens"]["kl"]["mean"] > 1e-6


def test_a_configuration_vllm_refuses_becomes_a_refused_record(ws: Workspace, vllm_a: Arm) -> None:
    a, b = arms(ws, "vllm", "vllm:block_size=16", a=vllm_a)
    assert b.refused and not b.error
    res = run_ab(ws, "tiny-llama", SUITE, "vllm", "vllm:block_size=16", arms=(a, b))
    assert res.record.outcome == "refused"
    assert "block size" in res.record.extra["ab"]["refused"]["reason"]
    assert all(v.status == "refused" for v in res.record.verdicts)
    assert "distribution" not in res.record.extra


@pytest.mark.ab_quantized_kv
def test_transformers_quantized_kv_cache_against_the_plain_cache(ws: Workspace) -> None:
    """Opt-in (``pytest -m ab_quantized_kv``): four transformers runs step by step, each through quanto's
    quantized cache or the plain one, the longest test of the default run (on a loaded 2-core host
    about 2.5 times the bf16 test's two engine starts). The default run keeps the A/B judgement
    (full-vocab KL, drift, capacity, a planted failure) in the bf16 test. Its committed records, on
    the longer suite: reports/records/tiny-llama/ab_long/
    20261130T024843Z_3a188c3b51_ab-hf-kv-quanto-int4_1e0772.json (pass, KL mean 0.00199) and
    20261130T025656Z_0500dd3432_ab-hf-kv-quanto-int2_7cc442.json (fail: the KL bar catches 2-bit)."""
    a, b4 = arms(ws, "hf", "hf:kv=quanto-int4")
    _, b2 = arms(ws, "hf", "hf:kv=quanto-int2", a=a)
    r4 = run_ab(ws, "tiny-llama", SUITE, "hf", "hf:kv=quanto-int4", arms=(a, b4)).record
    r2 = run_ab(ws, "tiny-llama", SUITE, "hf", "hf:kv=quanto-int2", arms=(a, b2)).record
    kl4 = r4.extra["distribution"]["arms"]["B on A's tokens"]["kl"]
    kl2 = r2.extra["distribution"]["arms"]["B on A's tokens"]["kl"]
    assert kl4["alignment"] == "teacher-forced" and kl4["mode"] == "full-vocab"
    assert kl2["mean"] > 5 * kl4["mean"] > 0  # 2-bit keys/values lose more than 4-bit ones
    assert r2.outcome == "fail"  # and the suite's KL bar catches it
    assert any(v.comparator == "kl" and v.status == "fail" for v in r2.verdicts)
    # transformers exposes every layer: the embeddings cannot see the KV cache, later layers do
    rows = {t["name"]: t for t in next(v for v in r4.verdicts if v.comparator == "nmse_tensors"
                                       ).evidence["tensors"]}
    assert rows["hidden.0"]["nmse"] == 0 and rows["logits"]["nmse"] > 0 and rows["hidden.2"]["nmse"] > 0
    for r in (r4, r2):
        cap = r.extra["ab"]
        assert cap["a"]["capacity"]["bytes_per_token"] == pytest.approx(1024.0)  # 2 layers x K,V x 64 x fp32
        assert cap["kv_capacity_ratio_b_over_a"] > 1.2, cap
