"""The gate end to end with the REAL pinned vLLM oracle and real transformers.

Engine starts here (≈1 min each on 2 cores): one to record them under emulated AVX2
(``HARNESS_CPU_ISA=avx2``, a child harness process), and, unless the session's engine pool has
it up already, tiny-llama's default engine (it records goldens from scratch, then serves the
``vllm`` candidate). A refused configuration (``block_size=16``) is opt-in (``-m gate_refusal``).
Everything else reuses goldens. Floats are compared bit for bit only within one
device class (``harness.device_policy``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from harness.api import Output
from harness.device import device_class, fingerprint
from harness.device_policy import DevicePolicy, check_reproduction, logprob_drift, policy
from harness.goldens import Golden, golden_dir, read_golden
from harness.models import resolve_model
from harness.pipeline import run_gate, run_gate_by_name
from harness.records import load_record
from harness.suites import find_suite
from harness.workspace import REPO_ROOT, Workspace
from tests.pins import PIN

pytestmark = pytest.mark.integration


def _reproduces(committed: Golden, fresh: Golden) -> DevicePolicy:
    """Assert ``fresh`` reproduces ``committed`` as the cross-device policy demands for their
    classes: bit-identical within one device class, else identical tokens and logprobs within the
    stated bound. Goldens recorded before fingerprints are "unknown", never the same class."""
    pol = policy(committed.device_class, fresh.device_class,
                 dtype=str(committed.oracle.settings.get("dtype", "float32")))
    problems = check_reproduction(pol, committed.outputs, fresh.outputs)
    assert not problems, "\n".join([pol.statement, f"moved: {logprob_drift(committed.outputs, fresh.outputs)}",
                                    *problems[:8]])
    return pol


def test_fresh_oracle_recording_reproduces_the_committed_goldens_and_hf_passes(
        workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    folder = golden_dir(workspace.goldens, model, "smoke")
    shutil.rmtree(folder)

    res = run_gate(workspace, model, find_suite(workspace.suites, "smoke"), "hf")  # records goldens first

    assert "oracle_record_s" in res.record.timings
    fresh = read_golden(folder, model_name="tiny-llama", suite_name="smoke")
    committed = read_golden(golden_dir(Workspace(REPO_ROOT).goldens, model, "smoke"),
                            model_name="tiny-llama", suite_name="smoke")
    assert fresh.manifest["oracle"]["version"] == PIN.version
    assert fresh.device_class == device_class(fingerprint(), "cpu"), fresh.manifest["device"]
    assert fresh.manifest["device"]["fingerprint"]["vllm"]["kernel_library_from"].startswith("observed")
    _reproduces(committed, fresh)

    rec = res.record
    assert rec.outcome == "pass", rec.summary
    assert rec.candidate.engine == "transformers"
    assert rec.summary.startswith("smoke: ") and " 0 fail" in rec.summary
    assert load_record(res.path) == rec


def test_under_emulated_avx2_the_oracle_reproduces_the_goldens_and_hf_passes(
        workspace: Workspace) -> None:
    """``HARNESS_CPU_ISA=avx2``: the whole gate (vLLM recording + transformers) on AVX2 kernels,
    as on a CPU without AVX-512, so that this test file holds whatever CPU recorded the goldens.
    One vLLM start. The recording must reproduce the committed goldens as the policy demands for
    their classes (measured here: tokens identical, ~95% of logprobs moved, max |Δ| 1.7e-5)."""
    host = fingerprint()
    if "avx2" not in host["cpu"]["flags"]:
        pytest.skip(f"{device_class(host, 'cpu')}: no AVX2 to emulate")
    model = resolve_model("tiny-llama", workspace)
    shutil.rmtree(golden_dir(workspace.goldens, model, "smoke"))
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_ROOT"}
    env.update({"HARNESS_CPU_ISA": "avx2", "HARNESS_ROOT": str(workspace.root),
                "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)})
    run = subprocess.run([sys.executable, "-m", "harness.cli", "gate", "--model", "tiny-llama",
                          "--suite", "smoke", "--candidate", "hf"],
                         env=env, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0 and "outcome: pass" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]

    emulated = read_golden(golden_dir(workspace.goldens, model, "smoke"), model_name="tiny-llama",
                           suite_name="smoke")
    fp = emulated.manifest["device"]["fingerprint"]
    assert emulated.device_class == "cpu-x86_64-avx2", emulated.manifest["device"]
    assert fp["steering"]["setting"] == "HARNESS_CPU_ISA=avx2"
    assert fp["vllm"]["kernel_library"] == "_C_AVX2", fp["vllm"]  # seen in the engine's own memory map
    committed = read_golden(golden_dir(Workspace(REPO_ROOT).goldens, model, "smoke"),
                            model_name="tiny-llama", suite_name="smoke")
    _reproduces(committed, emulated)

    # Positive controls, that the steering reached the kernels: what the engine process reported
    # of itself, and, against goldens of a known other class, logprobs that moved.
    assert fp["torch"]["cpu_capability"] == "AVX2" and fp["vllm"]["cpu_probes"]["avx512"] is False, fp
    pol = policy(committed.device_class, emulated.device_class)
    if committed.device_class != "unknown" and not pol.same_class:
        moved = logprob_drift(committed.outputs, emulated.outputs)
        assert moved["differ"] > 0, f"{pol.statement}; yet no logprob moved: the steering did nothing"


def test_vllm_candidate_passes_its_own_goldens_strictly(workspace: Workspace) -> None:
    rec = run_gate_by_name(workspace, "tiny-llama", "smoke", "vllm", auto_record=False).record
    assert rec.outcome == "pass"
    assert all(v.status == "pass" for v in rec.verdicts if v.comparator == "strict"), rec.summary
    assert rec.candidate.version == PIN.version
    # the session's engine pool may have started this engine for an earlier test (the record says so)
    assert rec.timings.get("candidate_engine_reused") == 1.0 or (
        rec.timings["candidate_engine_start_s"] > rec.timings["candidate_generate_s"])


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
    rec = run_gate_by_name(workspace, "tiny-llama", "smoke", "hf", auto_record=False,
                   transform=_flip_decisive).record
    assert rec.outcome == "fail"
    bad = [v for v in rec.verdicts if v.status == "fail"]
    assert {v.case_id for v in bad} == {"c03"}
    assert {v.comparator for v in bad} == {"strict", "near_tie"}
    tie = next(v for v in bad if v.comparator == "near_tie")
    assert "c03: near_tie FAIL at token" in tie.detail and "oracle" in tie.detail
    assert "1 fail" in rec.summary


@pytest.mark.gate_refusal
def test_a_refused_configuration_is_a_refused_verdict_with_the_engines_reason(
        workspace: Workspace) -> None:
    """Opt-in (``pytest -m gate_refusal``): one engine start, about a minute on 2 cores, to vLLM's
    refusal. The default run keeps both halves: the real vLLM's refusal and its reason through the
    pooled runner (test_ab.py's refused B arm) and a refused parity record from a runner's refusal
    (tests/unit/test_openai_runner.py). Its committed record: reports/records/tiny-llama/smoke/
    20261206T220404Z_23eadefa42_vllm-block-size-16_b79290.json (refused: "No common block size for 16")."""
    rec = run_gate_by_name(workspace, "tiny-llama", "smoke", "vllm:block_size=16", auto_record=False).record
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
