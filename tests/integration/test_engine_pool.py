"""The session's engine pool on the REAL pinned vLLM: a reused engine gives a fresh engine's bits.

The smoke workload on the pool's tiny-llama engine, then the same workload again on the live engine
(its prefix cache reset: no start, no cached token): tokens, top-k ids and every logprob equal bit
for bit to a fresh engine's, and the engine-start ledger says what started. The fresh engine is the
pool's own when this test starts it (the first user of the default settings in the session's order,
conftest.SHARED_ENGINE_ORDER: its first workload is a fresh engine's); when the pool's engine was
already up (the test run alone after its users), a fresh one of its own (``unpooled``). Either way
one start; the pooled engine is the one test_gate_smoke, test_matrix, test_openai_vllm_server and
test_speed run on.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from harness.api import Output
from harness.engines.launch import ledger
from harness.engines.vllm.pool import EnginePool, unpooled
from harness.engines.vllm.runner import VLLMRunner
from harness.models import resolve_model
from harness.suites import find_suite
from harness.workspace import Workspace

pytestmark = pytest.mark.integration


def differences(a: Sequence[Output], b: Sequence[Output]) -> list[str]:
    """Where two runs differ, bit for bit (floats compared as their bits: one device, one run)."""
    out = []
    for x, y in zip(a, b, strict=True):
        if x.token_ids != y.token_ids:
            out.append(f"{x.case_id}: tokens")
        for name in ("top_ids", "top_logprobs", "chosen_logprobs"):
            u, v = np.asarray(getattr(x, name)), np.asarray(getattr(y, name))
            if u.shape != v.shape or u.tobytes() != v.tobytes():
                out.append(f"{x.case_id}: {name}")
    return out


def test_a_reused_engine_gives_a_fresh_engines_bits(engine_pool: EnginePool, tmp_path: Path) -> None:
    model = resolve_model("tiny-llama", Workspace.default())
    suite = find_suite(Workspace.default().suites, "smoke")
    cases = suite.build_cases(model.encode, model.limits)
    path = os.environ[ledger.ENV]
    me = os.environ["PYTEST_CURRENT_TEST"].split(" ")[0]  # the ledger is the session's: other workers write too

    first = VLLMRunner(model, {}, run_dir=tmp_path)
    firsts = first.run(cases, suite.sampling)
    again = VLLMRunner(model, {}, run_dir=tmp_path)
    second = again.run(cases, suite.sampling)
    assert again.timings["engine_reused"] == 1.0 and again.meta["engine"]["uses"] >= 2
    # the prefix cache was reset between the workloads: nothing of the first served the second
    assert all(again.case_meta[c.id]["num_cached_tokens"] == 0 for c in cases), again.case_meta
    if "engine_reused" in first.timings:
        # the pool's engine was up before this test (run alone after its users): start a fresh one
        with unpooled():
            alone = VLLMRunner(model, {}, run_dir=tmp_path)
            fresh = alone.run(cases, suite.sampling)
        assert "engine_reused" not in alone.timings and alone.timings["engine_start_s"] > 0
    else:
        # this test started the pool's engine: its first workload is a fresh engine's
        assert first.timings["engine_start_s"] > 0
        fresh = firsts
    assert differences(firsts, second) == [] and differences(second, fresh) == []
    # the comparison sees one ulp in one logprob
    lp = np.array(fresh[2].top_logprobs, np.float32, copy=True)
    lp[3, 0] = np.nextafter(lp[3, 0], np.float32(-np.inf))
    nudged = [*fresh[:2], Output(fresh[2].case_id, fresh[2].token_ids, fresh[2].text, fresh[2].top_ids, lp,
                                 fresh[2].chosen_logprobs, fresh[2].finish_reason), *fresh[3:]]
    assert differences(second, nudged) == [f"{fresh[2].case_id}: top_logprobs"]

    lines = [x for x in ledger.read(path) if x["test"] == me]
    # one start in all: the pool's (when this test began it) or the fresh one (when the pool had it)
    fresh_start = [(False, False)] if lines[0]["reused"] else []
    assert [(x["pooled"], x["reused"]) for x in lines[1:]] == [(True, True), *fresh_start], lines
    assert lines[0]["pooled"] and ledger.totals(lines)["starts"] == 1
