"""The sampling gate with real engines, at test scale: the pinned vLLM as the oracle (one start)
and transformers' own sampler on tiny-llama (suite sampling_small). The other engines' runs are
committed records (make sampling MODEL=smollm2-135m SUITE=sampling_small). Opt-in (-m sampling_engines):
one vLLM start and a few thousand transformers draws take minutes on a 2-core host."""

from __future__ import annotations

import shutil

import pytest

from harness.commands.sampling import run_sampling
from harness.records import load_record
from harness.workspace import REPO_ROOT, Workspace

pytestmark = [pytest.mark.integration, pytest.mark.sampling_engines]


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("sampling")
    for sub in ("suites", "models"):
        shutil.copytree(REPO_ROOT / sub, root / sub)
    return Workspace(root)


def test_transformers_sampler_against_the_pinned_oracle(ws: Workspace) -> None:
    (res,) = run_sampling(ws, "tiny-llama", "sampling_small", ["hf"])
    rec = load_record(res.path)
    s = rec.extra["sampling"]
    assert rec.kind == "sampling" and rec.oracle["engine"] == "vllm" and rec.oracle["rows_sha256"]
    assert s["chain"]["name"] == "transformers" and s["traits"]["logprobs_mode"] == "processed_logprobs"
    # transformers has no presence penalty: refused, not gated
    pres = [v for v in rec.verdicts if v.comparator == "sampling.presence_penalty"]
    assert pres and {v.status for v in pres} == {"refused"} and "sampling.presence_penalty" not in rec.gates
    # every gated parameter has a planted fault; each fault the record states power >= 0.9 against
    # failed, and one it could not see makes the record vacuous (on tiny-llama's near-flat
    # distributions "temperature not applied" may be such a fault at target TV 0.2)
    for gate in rec.gates:
        assert [c for c in rec.controls if c.comparator == gate and c.expect == "fail"], gate
    for fault, facts in s["planted"].items():
        for param, power in facts["stated_power"].items():
            if power >= 0.9:
                assert facts["got"][param] == "fail", (fault, param, power)
    missed = [c for c in rec.controls if c.expect == "fail" and not c.ok]
    assert rec.outcome in (("vacuous", "fail") if missed else ("pass", "fail")), rec.summary
    if rec.outcome == "fail":  # a real disagreement names its test, its p-value and its effect size
        assert s["disagreements"] and all("p" in d and "observed_tv" in d for d in s["disagreements"])
    seed = {v.case_id: v for v in rec.verdicts if v.comparator == "sampling.seed"}
    assert seed["repeat"].status == "pass" and seed["alone"].status == "skip"
