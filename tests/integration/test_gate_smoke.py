"""The gate end to end with the REAL pinned vLLM oracle and real transformers.

Engine starts here (≈1 min each on 2 cores): one to record goldens from scratch, one for the
``vllm`` candidate, one refused configuration. Everything else reuses goldens.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from harness.api import Output
from harness.goldens import golden_dir, read_golden
from harness.models import resolve_model
from harness.pipeline import run_gate
from harness.records import load_record
from harness.workspace import REPO_ROOT, Workspace

pytestmark = pytest.mark.integration


def test_fresh_oracle_recording_reproduces_the_committed_goldens_and_hf_passes(
        workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    folder = golden_dir(workspace.goldens, model, "smoke")
    shutil.rmtree(folder)

    res = run_gate(workspace, "tiny-llama", "smoke", "hf")  # records goldens with vLLM first

    assert "oracle_record_s" in res.record.timings
    fresh = read_golden(folder, model_name="tiny-llama", suite_name="smoke")
    committed = read_golden(golden_dir(Workspace(REPO_ROOT).goldens, model, "smoke"),
                            model_name="tiny-llama", suite_name="smoke")
    assert fresh.manifest["oracle"]["version"] == "0.32.0"
    for cid, out in committed.outputs.items():
        again = fresh.outputs[cid]
        assert again.token_ids == out.token_ids, cid
        np.testing.assert_array_equal(again.top_ids, out.top_ids)
        # the oracle is deterministic on this machine: logprobs bit-identical run to run
        np.testing.assert_array_equal(again.top_logprobs, out.top_logprobs)

    rec = res.record
    assert rec.outcome == "pass", rec.summary
    assert rec.candidate.engine == "transformers"
    assert rec.summary.startswith("smoke: ") and " 0 fail" in rec.summary
    assert load_record(res.path) == rec


def test_vllm_candidate_passes_its_own_goldens_strictly(workspace: Workspace) -> None:
    rec = run_gate(workspace, "tiny-llama", "smoke", "vllm", auto_record=False).record
    assert rec.outcome == "pass"
    assert all(v.status == "pass" for v in rec.verdicts if v.comparator == "strict"), rec.summary
    assert rec.candidate.version == "0.32.0"
    assert rec.timings["candidate_engine_start_s"] > rec.timings["candidate_generate_s"]


def _flip_decisive(outputs: list[Output]) -> list[Output]:
    """Planted mutation: in c03, replace the token at the most decisive position by one outside
    the oracle's top-k (the candidate's own top-k says nothing about the oracle's)."""
    out = []
    for o in outputs:
        if o.case_id == "c03":
            assert o.chosen_logprobs is not None
            pos = int(np.argmax(o.chosen_logprobs))
            toks = list(o.token_ids)
            toks[pos] = (toks[pos] + 1) % 256 + 3
            o = o.with_tokens(toks)
        out.append(o)
    return out


def test_a_planted_token_flip_fails_the_gate_and_names_the_case(workspace: Workspace) -> None:
    rec = run_gate(workspace, "tiny-llama", "smoke", "hf", auto_record=False,
                   transform=_flip_decisive).record
    assert rec.outcome == "fail"
    bad = [v for v in rec.verdicts if v.status == "fail"]
    assert {v.case_id for v in bad} == {"c03"}
    assert {v.comparator for v in bad} == {"strict", "near_tie"}
    tie = next(v for v in bad if v.comparator == "near_tie")
    assert "c03: near_tie FAIL at token" in tie.detail and "oracle" in tie.detail
    assert "1 fail" in rec.summary


def test_a_refused_configuration_is_a_refused_verdict_with_the_engines_reason(
        workspace: Workspace) -> None:
    rec = run_gate(workspace, "tiny-llama", "smoke", "vllm:block_size=16", auto_record=False).record
    assert rec.outcome == "refused", rec.summary
    reason = rec.verdicts[0].evidence["reason"]
    assert "block size" in reason.lower(), reason


def test_make_gate_front_door_prints_the_table_and_writes_a_record(
        workspace: Workspace, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli import main
    from harness.records import iter_record_paths

    monkeypatch.setenv("HARNESS_ROOT", str(workspace.root))
    # the oracle's timing is opt-in (--speed; one more vLLM start): test_openai_vllm_server covers it
    assert main(["gate", "--model", "tiny-llama", "--suite", "smoke", "--candidate", "hf"]) == 0
    out = capsys.readouterr().out
    assert "outcome: pass" in out and "near_tie" in out and "c08" in out
    assert len(list(iter_record_paths(workspace.records))) == 1
