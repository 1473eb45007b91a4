"""The invariance gate with real engines: the pinned vLLM on CPU and transformers as the trainer.

Default: suites/invariance_small.toml on tiny-llama in two vLLM engine starts (≈1 min each on 2
cores) plus one transformers load: batch composition, a warm prefix cache (same prompts; prompts
sharing a prefix), decode vs prefill and raw-mode rollouts all in the reference engine, the
inverse control (bfloat16) in the second. The engines run once; the same results are then judged
again with a fault planted in one candidate logprob, which must fail the gated bit-exact tier.

``HARNESS_INVARIANCE_TEST=1`` also runs the full suite (suites/invariance.toml: eight engine
starts, every variant) and checks each one either judged with its evidence or was refused with
vLLM's reason.

Bits are compared only between runs inside one test, on one machine: never against anything
recorded elsewhere.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Sequence

import numpy as np
import pytest

from harness.api import Output
from harness.kinds.base import GateRequest
from harness.kinds.invariance.kind import Ran
from harness.kinds.registered import KINDS
from harness.models import resolve_model
from harness.pipeline import run_gate_by_name
from harness.records import load_record
from harness.suites import find_suite
from harness.workspace import REPO_ROOT, Workspace

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("invariance")
    for sub in ("suites", "models"):
        shutil.copytree(REPO_ROOT / sub, root / sub)
    return Workspace(root)


@pytest.fixture(scope="module")
def small(ws: Workspace) -> Ran:
    """The engines of invariance_small, run once."""
    kind = KINDS.get("invariance")
    req = GateRequest(resolve_model("tiny-llama", ws), find_suite(ws.suites, "invariance_small"), "vllm")
    return kind.run(ws, req, kind.prepare(ws, req))


def test_the_small_suite_runs_in_two_engine_starts_and_every_variant_has_evidence(ws: Workspace,
                                                                                  small: Ran) -> None:
    res = run_gate_by_name(ws, "tiny-llama", "invariance_small", "vllm", options={"ran": small})
    rec = load_record(res.path)
    inv = rec.extra["invariance"]
    assert rec.kind == "invariance" and inv["vllm_engine_starts"] == 2 and inv["engine_starts"] == 3
    assert rec.outcome in ("pass", "fail"), rec.summary  # vLLM may or may not hold: the gate must judge
    variants = inv["variants"]
    for name in ("batch", "prefix_cache", "decode_prefill"):
        assert variants[name]["result"] in ("bit_exact", "near_tie", "neither"), (name, variants[name])
        # the bfloat16 rerun changed bits: a bit-exact pass here is evidence, not luck
        assert variants[name]["inverse"]["differences_appeared"], variants[name]["inverse"]
    pc = [v for v in rec.verdicts if v.comparator == "inv_prefix_cache.bit_exact"]
    assert any(v.case_id.endswith("+shared") for v in pc), "no prompt was served another's prefix"
    assert all(int(v.evidence["num_cached_tokens"]) > 0 for v in pc)  # only evidence is judged
    assert "c01" in variants["prefix_cache"]["not_evidence"]  # "Hello" is shorter than one block
    assert all(c.ok for c in rec.controls), [c for c in rec.controls if not c.ok]
    assert inv["repeatability"]["bit_exact"] == "4/4", "the same engine configuration twice differed"
    rl = rec.extra["rl"]
    assert rl["returned_logprobs_mode"] == "raw_logprobs" and rl["pooled"]["tokens"] > 0
    # fp32 transformers vs fp32 vLLM: far under the suite's bars on any CPU
    assert rl["pooled"]["max_abs_delta"] < 1e-3 and math.isfinite(rl["pooled"]["seq_kl_k1"])
    assert rl["result"] == "pass"


def test_a_fault_planted_in_one_logprob_fails_bit_exact_and_passes_near_tie(ws: Workspace, small: Ran) -> None:
    def one_ulp(outs: Sequence[Output]) -> list[Output]:
        out = []
        for o in outs:
            if o.case_id == "c02" and o.chosen_logprobs is not None and o.top_logprobs is not None:
                c = np.array(o.chosen_logprobs, np.float32, copy=True)
                top = np.array(o.top_logprobs, np.float32, copy=True)
                top[3][top[3] == c[3]] = np.nextafter(c[3], np.float32(-np.inf))
                c[3] = np.nextafter(c[3], np.float32(-np.inf))
                o = Output(o.case_id, o.token_ids, o.text, o.top_ids, top, c, o.finish_reason)
            out.append(o)
        return out

    rec = run_gate_by_name(ws, "tiny-llama", "invariance_small", "vllm", options={"ran": small}, transform=one_ulp,
                   write=False).record
    assert rec.outcome == "fail"
    bad = {(v.comparator, v.case_id): v for v in rec.verdicts if v.status == "fail"}
    v = bad[("inv_batch.bit_exact", "c02")]
    assert v.evidence["first_logprob_difference"] == 3 and v.evidence["first_divergence"] is None
    assert ("inv_batch.near_tie", "c02") not in bad


@pytest.mark.skipif(os.environ.get("HARNESS_INVARIANCE_TEST") != "1",
                    reason="eight engine starts (~10 min on 2 cores); set HARNESS_INVARIANCE_TEST=1")
def test_the_full_suite_judges_or_refuses_every_variant(ws: Workspace) -> None:
    res = run_gate_by_name(ws, "tiny-llama", "invariance", "vllm")
    rec = load_record(res.path)
    inv = rec.extra["invariance"]
    assert inv["vllm_engine_starts"] == 8
    for name, v in inv["variants"].items():
        assert v["result"] in ("bit_exact", "near_tie", "neither", "refused", "not evidence"), (name, v)
        if v["result"] == "refused":
            assert v["reason"], name
    pre = inv["variants"]["preemption"]
    if pre["result"] not in ("refused", "error"):
        assert pre["evidence"]["num_preemptions"], pre
    assert rec.extra["rl"]["returned_logprobs_mode"] == "processed_logprobs"
